// The fingerprint specification as code: every function here is the single
// definition used by both the CPU path (fingerprint.cc) and the CUDA kernels
// (fingerprint_kernels.cu), so the two cannot drift apart. docs/fingerprint.md
// is the prose version; a change here is a format change (update the spec and
// regenerate fingerprint/testdata/vectors.txt).
//
// Shape of the hash: the tensor's logical bytes are read as little-endian
// 64-bit words w[p] (last word zero-padded). Word p, in block b = p / 256 at
// offset i = p % 256, contributes one term to each of two 64-bit lane sums:
//   x = w ^ (TableKeyA(i) + BlockKeys(b).a)   a0 += lo32(x) * hi32(x) + swap32(w)
//   y = w ^ (TableKeyB(i) + BlockKeys(b).b)   a1 += lo32(y) * hi32(y) + w
// all mod 2^64. Sums commute, so any partition of the words (CPU threads, GPU
// grid/block/warp shapes, atomics) yields identical lane sums. Finalize() is a
// bijection of (a0 + meta.lo, a1 + meta.hi), where meta hashes dtype, shape
// and byte length.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OPGUARD_FP_HD __host__ __device__ __forceinline__
#else
#define OPGUARD_FP_HD inline
#endif

namespace opguard::fingerprint::spec {

// Words per key block. 2 KiB: on the GPU one warp reads one block with four
// coalesced 16-byte loads per thread, so a thread's table keys are loop
// invariants; on the CPU one block key per 2 KiB is negligible work.
constexpr uint64_t kBlockWords = 256;
constexpr uint64_t kBlockBytes = kBlockWords * 8;

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kSeedTableA = 0x243F6A8885A308D3ull;  // digits of pi
constexpr uint64_t kSeedTableB = 0x13198A2E03707344ull;
constexpr uint64_t kSeedBlockA = 0xA4093822299F31D0ull;
constexpr uint64_t kSeedBlockB = 0x082EFA98EC4E6C89ull;
constexpr uint64_t kSeedMetaLo = 0x452821E638D01377ull;
constexpr uint64_t kSeedMetaHi = 0xBE5466CF34E90C6Cull;

// A bijective 64-bit mixer (Pelle Evensen's moremur constants).
OPGUARD_FP_HD constexpr uint64_t Mix64(uint64_t z) {
  z ^= z >> 27;
  z *= 0x3C79AC492BA7B653ull;
  z ^= z >> 33;
  z *= 0x1C69B3F74AC4AE35ull;
  z ^= z >> 27;
  return z;
}

OPGUARD_FP_HD constexpr uint64_t TableKeyA(uint32_t i) { return Mix64(kSeedTableA + i * kGolden); }
OPGUARD_FP_HD constexpr uint64_t TableKeyB(uint32_t i) { return Mix64(kSeedTableB + i * kGolden); }

struct BlockKeys {
  uint64_t a;
  uint64_t b;
};

OPGUARD_FP_HD constexpr BlockKeys BlockKey(uint64_t block) {
  return {Mix64(kSeedBlockA + block * kGolden), Mix64(kSeedBlockB ^ (block * kGolden))};
}

OPGUARD_FP_HD constexpr uint64_t Swap32(uint64_t w) { return (w << 32) | (w >> 32); }

// Lane A term. With key k fixed, flipping any bit of lo32(w) always changes
// it (the product moves by 2^j * hi32(x) < 2^(j+32), the swap term by
// 2^(j+32); their sum cannot vanish mod 2^64). Lane B's "+ w" gives the same
// guarantee for bits of hi32(w), so any single bit flip changes (a0, a1).
OPGUARD_FP_HD constexpr uint64_t TermA(uint64_t w, uint64_t key) {
  const uint64_t x = w ^ key;
  return (x & 0xFFFFFFFFull) * (x >> 32) + Swap32(w);
}
OPGUARD_FP_HD constexpr uint64_t TermB(uint64_t w, uint64_t key) {
  const uint64_t y = w ^ key;
  return (y & 0xFFFFFFFFull) * (y >> 32) + w;
}

struct Lanes {
  uint64_t a0 = 0;
  uint64_t a1 = 0;
};

// The contribution of word `w` at global word position `p`. Reference form;
// the fast paths hoist the keys out of their loops.
OPGUARD_FP_HD constexpr void AddWord(Lanes& lanes, uint64_t w, uint64_t p) {
  const BlockKeys bk = BlockKey(p / kBlockWords);
  const uint32_t i = static_cast<uint32_t>(p % kBlockWords);
  lanes.a0 += TermA(w, TableKeyA(i) + bk.a);
  lanes.a1 += TermB(w, TableKeyB(i) + bk.b);
}

// 128-bit metadata hash: dtype, byte length, rank, then each dimension.
struct Meta {
  uint64_t lo = kSeedMetaLo;
  uint64_t hi = kSeedMetaHi;
};

OPGUARD_FP_HD constexpr void Absorb(Meta& m, uint64_t v) {
  m.lo = Mix64(m.lo ^ v);
  m.hi = Mix64(m.hi + v + m.lo);
}

// Bijective in (lanes.a0, lanes.a1) for fixed meta: two inputs whose lane
// sums differ never share a digest.
OPGUARD_FP_HD constexpr void Finalize(const Lanes& lanes, const Meta& meta, uint64_t* lo,
                                      uint64_t* hi) {
  uint64_t x = lanes.a0 + meta.lo;
  uint64_t y = lanes.a1 + meta.hi;
  x = Mix64(x);
  y = Mix64(y ^ x);
  x = Mix64(x ^ y);
  y = Mix64(y + x);
  *lo = x;
  *hi = y;
}

// ---- element decoding for the statistics -------------------------------------

OPGUARD_FP_HD double HalfToDouble(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  double v;
  if (exp == 0) {
    v = mant * (1.0 / 16777216.0);  // subnormal: mant * 2^-24
  } else if (exp == 31) {
    v = mant ? __builtin_nan("") : __builtin_inf();
  } else {
    // Exact: (1024 + mant) * 2^(exp - 25), built from the exponent bits.
    const uint64_t bits = static_cast<uint64_t>(exp - 15 + 1023) << 52 | static_cast<uint64_t>(mant)
                                                                             << 42;
    v = __builtin_bit_cast(double, bits);
  }
  return sign ? -v : v;
}

OPGUARD_FP_HD double BFloat16ToDouble(uint16_t b) {
  return static_cast<double>(__builtin_bit_cast(float, static_cast<uint32_t>(b) << 16));
}

// float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN, max 448.
OPGUARD_FP_HD double Fp8E4M3ToDouble(uint8_t v) {
  const int sign = v >> 7;
  const int exp = (v >> 3) & 0xF;
  const int mant = v & 0x7;
  double r;
  if (exp == 15 && mant == 7) {
    r = __builtin_nan("");
  } else if (exp == 0) {
    r = mant * (1.0 / 512.0);  // mant * 2^-9
  } else {
    const uint64_t bits = static_cast<uint64_t>(exp - 7 + 1023) << 52 | static_cast<uint64_t>(mant)
                                                                            << 49;
    r = __builtin_bit_cast(double, bits);
  }
  return sign ? -r : r;
}

// float8_e5m2: IEEE-like, bias 15, exponent 31 is Inf (mantissa 0) or NaN.
OPGUARD_FP_HD double Fp8E5M2ToDouble(uint8_t v) {
  return HalfToDouble(static_cast<uint16_t>(v) << 8);
}

// Statistics accumulator for one slice of elements. Counts, min and max are
// order-independent; sum and l2 are fp64 and depend on the order in which
// partial accumulators are combined (see docs/fingerprint.md).
struct FloatStats {
  uint64_t nan_count = 0;
  uint64_t inf_count = 0;
  uint64_t finite_count = 0;
  double min = 0;
  double max = 0;
  double sum = 0;
  double l2 = 0;

  OPGUARD_FP_HD void Add(double v) {
    if (v != v) {
      ++nan_count;
    } else if (v - v != 0) {  // +-Inf: Inf - Inf is NaN
      ++inf_count;
    } else {
      if (finite_count == 0 || v < min) min = v;
      if (finite_count == 0 || v > max) max = v;
      ++finite_count;
      sum += v;
      l2 += v * v;
    }
  }
  // Counts, min and max merge exactly; sums in the caller's fixed order.
  OPGUARD_FP_HD void Merge(const FloatStats& o) {
    nan_count += o.nan_count;
    inf_count += o.inf_count;
    if (o.finite_count) {
      if (finite_count == 0 || o.min < min) min = o.min;
      if (finite_count == 0 || o.max > max) max = o.max;
      finite_count += o.finite_count;
    }
    sum += o.sum;
    l2 += o.l2;
  }
};

// Integer statistics are exact: an int128 sum cannot overflow for any tensor
// that fits in memory, so every partition gives the same bits.
struct IntStats {
  uint64_t count = 0;
  __int128 min = 0;
  __int128 max = 0;
  __int128 sum = 0;

  OPGUARD_FP_HD void Add(__int128 v) {
    if (count == 0 || v < min) min = v;
    if (count == 0 || v > max) max = v;
    ++count;
    sum += v;
  }
  OPGUARD_FP_HD void Merge(const IntStats& o) {
    if (o.count) {
      if (count == 0 || o.min < min) min = o.min;
      if (count == 0 || o.max > max) max = o.max;
      count += o.count;
    }
    sum += o.sum;
  }
};

// The integer statistics leave the exact int128 domain here, identically on
// CPU and GPU: exact rounding within int64 range, else hi * 2^64 + lo.
OPGUARD_FP_HD double Int128ToDouble(__int128 v) {
  const auto lo64 = static_cast<int64_t>(v);
  if (static_cast<__int128>(lo64) == v) return static_cast<double>(lo64);
  const auto hi = static_cast<int64_t>(v >> 64);
  const auto lo = static_cast<uint64_t>(v);
  return static_cast<double>(hi) * 18446744073709551616.0 + static_cast<double>(lo);
}

}  // namespace opguard::fingerprint::spec
