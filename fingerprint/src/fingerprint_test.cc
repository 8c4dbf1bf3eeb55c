#include "opguard/fingerprint/fingerprint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fingerprint_internal.h"
#include "fingerprint_partition.h"
#include "fingerprint_spec.h"
#include "fingerprint_testgen.h"
#include "fingerprint_vectors.h"

namespace opguard::fingerprint {
namespace {

using internal::HostOptions;
using internal::Isa;
using testgen::Bytes;
using testgen::SplitMix64;

constexpr DType kAllDTypes[] = {
    DType::kFloat64,    DType::kFloat32,   DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
    DType::kFloat8E5M2, DType::kInt64,     DType::kInt32,   DType::kInt16,    DType::kInt8,
    DType::kUInt8,      DType::kBool,      DType::kUInt16,  DType::kUInt32,   DType::kUInt64,
    DType::kComplex64,  DType::kComplex128};

Digest Fp(const void* data, uint64_t bytes, DType dtype = DType::kUInt8) {
  const int64_t n = static_cast<int64_t>(bytes / DTypeSize(dtype));
  const int64_t shape[] = {n};
  return FingerprintHost({data, dtype, shape, {}}).digest;
}

Digest Fp(const std::vector<uint8_t>& b, DType dtype = DType::kUInt8) {
  return Fp(b.data(), b.size(), dtype);
}

// The spec's reference form, one word at a time; every fast path must equal it.
Digest Reference(const uint8_t* data, uint64_t bytes, DType dtype, std::span<const int64_t> shape) {
  spec::Lanes lanes;
  for (uint64_t p = 0; p * 8 < bytes; ++p) {
    spec::AddWord(lanes, spec::LoadWord(data, bytes, p, false), p);
  }
  return Refinalize(ByteSums{lanes.a0, lanes.a1}, dtype, shape);
}

Fingerprint With(const std::vector<uint8_t>& b, DType dtype, const HostOptions& o,
                 size_t offset = 0) {
  const int64_t shape[] = {static_cast<int64_t>((b.size() - offset) / DTypeSize(dtype))};
  return internal::FingerprintHostWith({b.data() + offset, dtype, shape, {}}, o);
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void ExpectSameStats(const Stats& a, const Stats& b) {
  EXPECT_EQ(a.nan_count, b.nan_count);
  EXPECT_EQ(a.inf_count, b.inf_count);
  EXPECT_TRUE(SameBits(a.min, b.min)) << a.min << " vs " << b.min;
  EXPECT_TRUE(SameBits(a.max, b.max)) << a.max << " vs " << b.max;
  EXPECT_TRUE(SameBits(a.sum, b.sum)) << a.sum << " vs " << b.sum;
  EXPECT_TRUE(SameBits(a.l2, b.l2)) << a.l2 << " vs " << b.l2;
}

// ---- dtypes, formatting, validation ------------------------------------------

TEST(FingerprintDType, SizesNamesAndParsing) {
  EXPECT_EQ(DTypeSize(DType::kUnknown), 0u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat8E5M2), 1u);
  EXPECT_EQ(DTypeSize(DType::kComplex128), 16u);
  EXPECT_TRUE(IsFloating(DType::kFloat8E4M3));
  EXPECT_FALSE(IsFloating(DType::kInt8));
  EXPECT_FALSE(IsFloating(DType::kBool));
  for (DType d : kAllDTypes) {
    DType parsed = DType::kUnknown;
    ASSERT_TRUE(ParseDType(DTypeName(d), &parsed)) << DTypeName(d);
    EXPECT_EQ(parsed, d);
  }
  DType d{};
  EXPECT_TRUE(ParseDType("bf16", &d));
  EXPECT_EQ(d, DType::kBFloat16);
  EXPECT_TRUE(ParseDType("torch.float16", &d));
  EXPECT_EQ(d, DType::kFloat16);
  EXPECT_TRUE(ParseDType("fp8_e5m2", &d));
  EXPECT_EQ(d, DType::kFloat8E5M2);
  EXPECT_FALSE(ParseDType("float128", &d));
  EXPECT_FALSE(ParseDType("unknown", &d));
  EXPECT_FALSE(ParseDType("", &d));
}

TEST(FingerprintDigest, HexIsBytesInOrder) {
  Digest d{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  EXPECT_EQ(d.Hex(), "000102030405060708090a0b0c0d0e0f");
}

TEST(FingerprintValidate, RejectsBadViews) {
  const int64_t shape[] = {2, 3};
  const int64_t neg[] = {2, -1};
  const int64_t strides1[] = {1};
  uint8_t buf[64] = {};
  EXPECT_EQ(ValidateView({buf, DType::kFloat32, shape, {}}), "");
  EXPECT_NE(ValidateView({buf, DType::kUnknown, shape, {}}), "");
  EXPECT_NE(ValidateView({buf, DType::kFloat32, neg, {}}), "");
  EXPECT_NE(ValidateView({buf, DType::kFloat32, shape, strides1}), "");
  EXPECT_NE(ValidateView({nullptr, DType::kFloat32, shape, {}}), "");
  const int64_t empty[] = {0, 5};
  EXPECT_EQ(ValidateView({nullptr, DType::kFloat32, empty, {}}), "");
  const int64_t huge[] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_NE(ValidateView({buf, DType::kFloat32, huge, {}}), "");
  // Invalid views give the all-zero digest, never a crash.
  EXPECT_EQ(FingerprintHost({buf, DType::kUnknown, shape, {}}).digest, Digest{});
}

// ---- the implementation equals the spec's reference form -----------------------

TEST(FingerprintSpec, MatchesReferenceForManySizes) {
  for (uint64_t size : {0,  1,    2,    7,    8,    9,    31,    32,    33,    63,    64,
                        65, 2047, 2048, 2049, 4096, 6151, 65535, 65536, 65537, 200003}) {
    const auto b = Bytes(size + 11, size);
    const int64_t shape[] = {static_cast<int64_t>(size)};
    EXPECT_EQ(Fp(b), Reference(b.data(), size, DType::kUInt8, shape)) << size;
  }
}

TEST(FingerprintSpec, AllPathsAgree) {
  const bool avx2 = internal::CpuHasAvx2();
  for (DType dtype : kAllDTypes) {
    const uint64_t es = DTypeSize(dtype);
    for (uint64_t n : {0, 1, 3, 5, 64, 257, 1000, 40001}) {
      for (size_t offset : {0, 1, 3, 8, 13}) {
        auto b = Bytes(n * 131 + offset, n * es + offset);
        HostOptions scalar;
        scalar.isa = Isa::kScalar;
        const Fingerprint ref = With(b, dtype, scalar, offset);
        const int64_t shape[] = {static_cast<int64_t>(n)};
        EXPECT_EQ(ref.digest, Reference(b.data() + offset, n * es, dtype, shape));
        for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
          if (!(isa == Isa::kAvx2 ? avx2 : internal::CpuHasAvx512())) continue;
          HostOptions v;
          v.isa = isa;
          const Fingerprint got = With(b, dtype, v, offset);
          EXPECT_EQ(got.digest, ref.digest)
              << DTypeName(dtype) << " n=" << n << " isa=" << static_cast<int>(isa);
          ExpectSameStats(got.stats, ref.stats);
        }
      }
    }
  }
  if (!avx2) GTEST_SKIP() << "no AVX2 on this CPU: scalar path checked against the reference only";
}

TEST(FingerprintSpec, IndependentOfThreadsAndTiles) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64, DType::kFloat8E4M3}) {
    const uint64_t es = DTypeSize(dtype);
    const uint64_t n = (3u << 20) / es + 3;
    const auto b = Bytes(77, n * es);
    HostOptions one;
    const Fingerprint base = With(b, dtype, one);
    for (int threads : {2, 3, 7, 16}) {
      for (uint64_t tile : {uint64_t{16}, uint64_t{4096}, uint64_t{65536}, uint64_t{1} << 20}) {
        HostOptions o;
        o.threads = threads;
        o.tile_bytes = tile;
        o.min_bytes_per_thread = 1;
        const Fingerprint got = With(b, dtype, o);
        EXPECT_EQ(got.digest, base.digest) << threads << " threads, tile " << tile;
        EXPECT_EQ(got.stats.nan_count, base.stats.nan_count);
        EXPECT_EQ(got.stats.inf_count, base.stats.inf_count);
        EXPECT_EQ(got.stats.min, base.stats.min);
        EXPECT_EQ(got.stats.max, base.stats.max);
        if (tile == internal::kDefaultTileBytes) ExpectSameStats(got.stats, base.stats);
      }
    }
  }
  // The public entry point: any thread count, identical digest and statistics.
  const auto b = Bytes(5, 9u << 20);
  const int64_t shape[] = {static_cast<int64_t>(b.size() / 4)};
  const Fingerprint one = FingerprintHost({b.data(), DType::kFloat32, shape, {}}, 1);
  const Fingerprint all = FingerprintHost({b.data(), DType::kFloat32, shape, {}}, 0);
  EXPECT_EQ(one.digest, all.digest);
  ExpectSameStats(one.stats, all.stats);
  EXPECT_EQ(DigestHost({b.data(), DType::kFloat32, shape, {}}, 3), one.digest);
}

TEST(FingerprintSpec, ACallersPoolGivesTheSameResult) {
  // A pool that runs the shares in reverse order, on threads of its own and
  // on the caller's, and counts them.
  int ran = 0;
  const ParallelFor pool = [&ran](int tasks, const std::function<void(int)>& task) {
    ran = tasks;
    std::vector<std::thread> threads;
    for (int t = tasks - 1; t >= 0; --t) {
      if (t % 2 == 1) {
        threads.emplace_back(task, t);
      } else {
        task(t);
      }
    }
    for (auto& th : threads) th.join();
  };
  const auto b = Bytes(21, (5u << 20) + 12);
  const int64_t shape[] = {static_cast<int64_t>(b.size() / 4)};
  const TensorView flat{b.data(), DType::kFloat32, shape, {}};
  ByteSums one_sums, pool_sums;
  const Fingerprint one = FingerprintHost(flat, 1, &one_sums);
  for (int tasks : {2, 3, 8}) {
    const Fingerprint got = FingerprintHostOn(flat, tasks, pool, &pool_sums);
    EXPECT_EQ(ran, tasks);
    EXPECT_EQ(got.digest, one.digest) << tasks << " tasks";
    ExpectSameStats(got.stats, one.stats);
    EXPECT_EQ(pool_sums.a0, one_sums.a0);
    EXPECT_EQ(pool_sums.a1, one_sums.a1);
  }
  // A strided view: each share gathers its tiles in logical order.
  const int64_t rows = 1024, cols = static_cast<int64_t>(b.size() / 4 / 1024);
  const int64_t tshape[] = {cols, rows};
  const int64_t tstrides[] = {1, cols};
  const TensorView transposed{b.data(), DType::kFloat32, tshape, tstrides};
  const Fingerprint serial = FingerprintHost(transposed, 1);
  const Fingerprint pooled = FingerprintHostOn(transposed, 4, pool);
  EXPECT_EQ(pooled.digest, serial.digest);
  ExpectSameStats(pooled.stats, serial.stats);
  // One task, or fewer bytes than a tile per task: the caller's thread alone.
  ran = 0;
  EXPECT_EQ(FingerprintHostOn(flat, 1, pool).digest, one.digest);
  const int64_t small_shape[] = {100};
  EXPECT_EQ(FingerprintHostOn({b.data(), DType::kFloat32, small_shape, {}}, 8, pool).digest,
            FingerprintHost({b.data(), DType::kFloat32, small_shape, {}}).digest);
  EXPECT_EQ(ran, 0);
}

TEST(FingerprintSpec, AlignmentDoesNotMatter) {
  const auto src = Bytes(9, 10000);
  const Digest want = Fp(src);
  std::vector<uint8_t> buf(src.size() + 64);
  for (size_t offset = 0; offset < 40; ++offset) {
    std::memcpy(buf.data() + offset, src.data(), src.size());
    EXPECT_EQ(Fp(buf.data() + offset, src.size()), want) << offset;
  }
}

// ---- GPU decomposition, emulated on the CPU --------------------------------------

struct CountWords {
  uint64_t words = 0, bytes = 0;
  void operator()(uint64_t, uint32_t valid) {
    ++words;
    bytes += valid;
  }
};

// Runs the kernels' ThreadWork for every thread of a team of `num_warps`
// warps, in a scrambled thread order, and finalizes like the last CTA does.
Digest EmulateTeam(const uint8_t* data, uint64_t nbytes, DType dtype,
                   std::span<const int64_t> shape, uint64_t num_warps, uint64_t* words_seen) {
  spec::Lanes total;
  CountWords count;
  const uint64_t threads = num_warps * spec::kWarpSize;
  for (uint64_t k = 0; k < threads; ++k) {
    const uint64_t t = (k * 7919) % threads;  // any order: the sums commute
    if (std::gcd(uint64_t{7919}, threads) != 1) break;
    spec::Lanes lanes;
    spec::ThreadWork(data, nbytes, t / spec::kWarpSize, num_warps,
                     static_cast<uint32_t>(t % spec::kWarpSize), lanes, count);
    total.a0 += lanes.a0;
    total.a1 += lanes.a1;
  }
  *words_seen = count.bytes;
  return Refinalize(ByteSums{total.a0, total.a1}, dtype, shape);
}

TEST(FingerprintPartition, AnyGridGivesTheCpuDigest) {
  std::vector<uint8_t> buf((1u << 20) + 64);
  for (uint64_t size :
       {0u, 1u, 9u, 16u, 2047u, 2048u, 2049u, 6144u, 6150u, 65560u, (1u << 20) + 3}) {
    for (size_t offset : {0, 8, 4, 1}) {  // 16-aligned, 8-aligned, 4-aligned, odd
      testgen::FillBytes(size * 3 + offset, buf.data() + offset, size);
      const uint8_t* data = buf.data() + offset;
      const int64_t shape[] = {static_cast<int64_t>(size)};
      const Digest want = Fp(data, size);
      // 1 warp (a tiny batched CTA), a 256-thread CTA, odd and large grids.
      for (uint64_t warps : {1, 3, 8, 37, 264, 1057}) {
        uint64_t seen = 0;
        EXPECT_EQ(EmulateTeam(data, size, DType::kUInt8, shape, warps, &seen), want)
            << "size " << size << " offset " << offset << " warps " << warps;
        EXPECT_EQ(seen, size) << "every byte visited exactly once";
      }
    }
  }
}

// A thread's words, fed to spec::FloatStats as the kernels do.
struct FloatVisitor {
  spec::FloatStats stats;
  void operator()(uint64_t w, uint32_t valid) {
    for (uint32_t k = 0; k + 4 <= valid; k += 4) {
      stats.Add(
          static_cast<double>(__builtin_bit_cast(float, static_cast<uint32_t>(w >> (8 * k)))));
    }
  }
};

TEST(FingerprintPartition, KernelStatsMatchCpuCountsAndExtremes) {
  std::vector<float> v(100003);
  SplitMix64 rng(4);
  for (auto& x : v) x = static_cast<float>(static_cast<int64_t>(rng.Next() % 2001) - 1000) / 8;
  v[5] = std::numeric_limits<float>::quiet_NaN();
  v[77777] = std::numeric_limits<float>::infinity();
  v[100002] = -std::numeric_limits<float>::infinity();
  const int64_t shape[] = {static_cast<int64_t>(v.size())};
  const Fingerprint cpu = FingerprintHost({v.data(), DType::kFloat32, shape, {}});
  for (uint64_t warps : {1, 8, 129}) {
    spec::FloatStats all;
    for (uint64_t t = 0; t < warps * spec::kWarpSize; ++t) {
      spec::Lanes lanes;
      FloatVisitor visit;
      spec::ThreadWork(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4,
                       t / spec::kWarpSize, warps, static_cast<uint32_t>(t % spec::kWarpSize),
                       lanes, visit);
      all.Merge(visit.stats);
    }
    EXPECT_EQ(all.nan_count, cpu.stats.nan_count);
    EXPECT_EQ(all.inf_count, cpu.stats.inf_count);
    EXPECT_EQ(all.min, cpu.stats.min);
    EXPECT_EQ(all.max, cpu.stats.max);
    // Multiples of 1/8 below 2^20 in magnitude: every order sums exactly.
    EXPECT_EQ(all.sum, cpu.stats.sum);
    EXPECT_EQ(std::sqrt(all.l2), cpu.stats.l2);
  }
}

// ---- what the digest must see -----------------------------------------------------

TEST(FingerprintStrength, EverySingleBitFlipChangesTheDigest) {
  // Exhaustive over every bit of small buffers, sampled over large ones.
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const uint64_t size = 1 + seed * 7;
    auto b = Bytes(seed, size);
    const Digest base = Fp(b);
    for (uint64_t bit = 0; bit < size * 8; ++bit) {
      b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      ASSERT_NE(Fp(b), base) << "size " << size << " bit " << bit;
      b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
  SplitMix64 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    auto b = Bytes(1000 + trial, 1 + rng.Next() % 300000);
    const Digest base = Fp(b);
    const uint64_t bit = rng.Next() % (b.size() * 8);
    b[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ASSERT_NE(Fp(b), base) << trial;
  }
}

TEST(FingerprintStrength, AnyTwoBitFlipsChangeTheDigest) {
  SplitMix64 rng(123);
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (int trial = 0; trial < 20000; ++trial) {
    auto b = Bytes(5000 + trial, 1 + rng.Next() % (trial % 10 ? 600 : 20000));
    const Digest base = Fp(b);
    const uint64_t bits = b.size() * 8;
    uint64_t i = rng.Next() % bits, j;
    switch (trial % 4) {
      case 0:
        j = rng.Next() % bits;
        break;  // anywhere
      case 1:
        j = (i % 64) + 64 * (rng.Next() % (bits / 64 + 1));
        break;  // same bit, other word:
                // XOR-reduce is blind to this
      case 2:
        j = (i / 64) * 64 + rng.Next() % 64;
        break;  // same word
      default:
        j = i + 8 * (1 + rng.Next() % 16);
        break;  // nearby bytes
    }
    if (j >= bits || j == i) continue;
    b[i / 8] ^= static_cast<uint8_t>(1u << (i % 8));
    b[j / 8] ^= static_cast<uint8_t>(1u << (j % 8));
    ASSERT_NE(Fp(b), base) << "trial " << trial << " bits " << i << "," << j;
    seen.insert({i, j});
  }
  EXPECT_GT(seen.size(), 15000u);
  // The case the XOR-reduce misses, exhaustively on a small buffer: the same
  // bit flipped in every pair of words.
  auto b = Bytes(42, 64 * 8);
  const Digest base = Fp(b);
  for (int bit = 0; bit < 64; bit += 9) {
    for (int w1 = 0; w1 < 64; ++w1) {
      for (int w2 = w1 + 1; w2 < 64; w2 += 5) {
        auto c = b;
        c[w1 * 8 + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        c[w2 * 8 + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        ASSERT_NE(Fp(c), base) << bit << " " << w1 << " " << w2;
      }
    }
  }
}

TEST(FingerprintStrength, SwappingTwoElementsChangesTheDigest) {
  SplitMix64 rng(7);
  for (DType dtype : kAllDTypes) {
    const uint64_t es = DTypeSize(dtype);
    for (int trial = 0; trial < 200; ++trial) {
      const uint64_t n = 2 + rng.Next() % 5000;
      auto b = Bytes(rng.Next(), n * es);
      const Digest base = Fp(b, dtype);
      const uint64_t i = rng.Next() % n;
      uint64_t j = (trial % 2) ? (i + 1) % n : rng.Next() % n;  // neighbours, or anywhere
      if (i == j || std::memcmp(&b[i * es], &b[j * es], es) == 0) continue;
      std::swap_ranges(b.begin() + i * es, b.begin() + (i + 1) * es, b.begin() + j * es);
      ASSERT_NE(Fp(b, dtype), base) << DTypeName(dtype) << " swap " << i << "," << j;
    }
  }
}

TEST(FingerprintStrength, ShiftingByOneElementChangesTheDigest) {
  SplitMix64 rng(8);
  for (DType dtype : kAllDTypes) {
    const uint64_t es = DTypeSize(dtype);
    for (int trial = 0; trial < 50; ++trial) {
      const uint64_t n = 2 + rng.Next() % 20000;
      auto b = Bytes(rng.Next(), n * es);
      const Digest base = Fp(b, dtype);
      auto rotated = b;  // rotate by one element
      std::rotate(rotated.begin(), rotated.begin() + es, rotated.end());
      EXPECT_NE(Fp(rotated, dtype), base);
      auto shifted = b;  // shift right by one element, zero fill
      std::memmove(shifted.data() + es, shifted.data(), (n - 1) * es);
      std::memset(shifted.data(), 0, es);
      EXPECT_NE(Fp(shifted, dtype), base);
    }
  }
  // A constant-free periodic pattern shifted by one element still differs.
  std::vector<uint8_t> ramp(4096);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<uint8_t>(i % 251);
  auto rramp = ramp;
  std::rotate(rramp.begin(), rramp.begin() + 4, rramp.end());
  EXPECT_NE(Fp(ramp, DType::kFloat32), Fp(rramp, DType::kFloat32));
}

TEST(FingerprintStrength, DTypeAndShapeAreMixedIn) {
  const auto b = Bytes(3, 64);
  std::set<std::string> digests;
  for (DType dtype : kAllDTypes) {
    const int64_t shape[] = {static_cast<int64_t>(64 / DTypeSize(dtype))};
    ASSERT_TRUE(digests.insert(FingerprintHost({b.data(), dtype, shape, {}}).digest.Hex()).second)
        << DTypeName(dtype);
  }
  const std::vector<std::vector<int64_t>> shapes = {{1, 64},    {64, 1},    {2, 32},  {32, 2},
                                                    {4, 16},    {16, 4},    {8, 8},   {2, 2, 16},
                                                    {2, 16, 2}, {1, 1, 64}, {4, 4, 4}};
  for (const auto& shape : shapes) {
    ASSERT_TRUE(
        digests.insert(FingerprintHost({b.data(), DType::kUInt8, shape, {}}).digest.Hex()).second);
  }
  // Length is mixed in: trailing zero bytes are not the zero padding.
  std::set<std::string> zeros;
  const std::vector<uint8_t> z(64, 0);
  for (uint64_t n = 0; n <= 64; ++n) ASSERT_TRUE(zeros.insert(Fp(z.data(), n).Hex()).second) << n;
  // Rank 0 (a scalar) differs from shape [1].
  const int64_t one[] = {1};
  EXPECT_NE(FingerprintHost({b.data(), DType::kUInt8, {}, {}}).digest,
            FingerprintHost({b.data(), DType::kUInt8, one, {}}).digest);
}

TEST(FingerprintStrength, AllTwoByteInputsAreDistinct) {
  std::set<std::pair<uint64_t, uint64_t>> digests;
  for (uint32_t v = 0; v < 65536; ++v) {
    const uint8_t b[2] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8)};
    const Digest d = Fp(b, 2);
    digests.insert({d.lo, d.hi});
  }
  EXPECT_EQ(digests.size(), 65536u);
}

// ---- non-contiguous tensors ---------------------------------------------------------

TEST(FingerprintStrided, HashesTheLogicalElementOrder) {
  const int64_t rows = 37, cols = 53;
  std::vector<float> m(rows * cols);
  SplitMix64 rng(11);
  for (auto& x : m) x = static_cast<float>(rng.Next() % 1000);
  std::vector<float> t(rows * cols);  // transposed copy, contiguous
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  const int64_t tshape[] = {cols, rows};
  const int64_t tstrides[] = {1, cols};  // transposed view of m
  HostOptions small;
  small.tile_bytes = 48;  // many gather tiles, boundaries inside rows
  small.threads = 3;
  small.min_bytes_per_thread = 1;
  const Fingerprint view =
      internal::FingerprintHostWith({m.data(), DType::kFloat32, tshape, tstrides}, small);
  const Fingerprint copy = FingerprintHost({t.data(), DType::kFloat32, tshape, {}});
  EXPECT_EQ(view.digest, copy.digest);
  EXPECT_EQ(view.stats.min, copy.stats.min);
  EXPECT_EQ(view.stats.max, copy.stats.max);
  EXPECT_EQ(FingerprintHost({m.data(), DType::kFloat32, tshape, tstrides}).digest, copy.digest);

  // Reversed rows (negative stride) and a broadcast (stride 0) dimension.
  std::vector<float> rev(m.size());
  for (int64_t r = 0; r < rows; ++r) std::copy_n(&m[(rows - 1 - r) * cols], cols, &rev[r * cols]);
  const int64_t shape[] = {rows, cols};
  const int64_t neg[] = {-cols, 1};
  EXPECT_EQ(FingerprintHost({&m[(rows - 1) * cols], DType::kFloat32, shape, neg}).digest,
            FingerprintHost({rev.data(), DType::kFloat32, shape, {}}).digest);
  std::vector<float> bcast(4 * cols);
  for (int r = 0; r < 4; ++r) std::copy_n(m.data(), cols, &bcast[r * cols]);
  const int64_t bshape[] = {4, cols};
  const int64_t bstrides[] = {0, 1};
  EXPECT_EQ(FingerprintHost({m.data(), DType::kFloat32, bshape, bstrides}).digest,
            FingerprintHost({bcast.data(), DType::kFloat32, bshape, {}}).digest);
  // Contiguous strides spelled out are the contiguous case.
  const int64_t cstrides[] = {cols, 1};
  EXPECT_EQ(FingerprintHost({m.data(), DType::kFloat32, shape, cstrides}).digest,
            FingerprintHost({m.data(), DType::kFloat32, shape, {}}).digest);
  EXPECT_NE(view.digest, FingerprintHost({m.data(), DType::kFloat32, tshape, {}}).digest);
}

// ---- statistics ----------------------------------------------------------------------

TEST(FingerprintStats, DecodesSmallFloats) {
  EXPECT_EQ(spec::HalfToDouble(0x3C00), 1.0);
  EXPECT_EQ(spec::HalfToDouble(0xC000), -2.0);
  EXPECT_EQ(spec::HalfToDouble(0x7BFF), 65504.0);
  EXPECT_EQ(spec::HalfToDouble(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(spec::HalfToDouble(0x7C00), std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(spec::HalfToDouble(0x7E00)));
  EXPECT_EQ(spec::BFloat16ToDouble(0x3F80), 1.0);
  EXPECT_EQ(spec::BFloat16ToDouble(0xC2F7), -123.5);
  EXPECT_EQ(spec::Fp8E4M3ToDouble(0x38), 1.0);
  EXPECT_EQ(spec::Fp8E4M3ToDouble(0x7E), 448.0);
  EXPECT_EQ(spec::Fp8E4M3ToDouble(0x01), std::ldexp(1.0, -9));
  EXPECT_TRUE(std::isnan(spec::Fp8E4M3ToDouble(0x7F)));
  EXPECT_TRUE(std::isnan(spec::Fp8E4M3ToDouble(0xFF)));
  EXPECT_EQ(spec::Fp8E4M3ToDouble(0x78), 256.0);  // e4m3fn: exponent 15 is finite
  EXPECT_EQ(spec::Fp8E5M2ToDouble(0x3C), 1.0);
  EXPECT_EQ(spec::Fp8E5M2ToDouble(0x7B), 57344.0);
  EXPECT_EQ(spec::Fp8E5M2ToDouble(0xFC), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(spec::Fp8E5M2ToDouble(0x7D)));
}

TEST(FingerprintStats, FloatCountsExtremesSumsAndNorm) {
  std::vector<float> v = {1.5f,
                          -2.0f,
                          std::numeric_limits<float>::quiet_NaN(),
                          4.0f,
                          std::numeric_limits<float>::infinity(),
                          0.25f,
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i < 1000; ++i) v.push_back(static_cast<float>(i % 7) - 3);
  const int64_t shape[] = {static_cast<int64_t>(v.size())};
  const Stats s = FingerprintHost({v.data(), DType::kFloat32, shape, {}}).stats;
  double sum = 0, l2 = 0, mn = 1e300, mx = -1e300;
  for (float x : v) {
    if (!std::isfinite(x)) continue;
    sum += x;
    l2 += static_cast<double>(x) * x;
    mn = std::min<double>(mn, x);
    mx = std::max<double>(mx, x);
  }
  EXPECT_EQ(s.nan_count, 2u);
  EXPECT_EQ(s.inf_count, 2u);
  EXPECT_EQ(s.min, mn);
  EXPECT_EQ(s.max, mx);
  EXPECT_DOUBLE_EQ(s.sum, sum);
  EXPECT_DOUBLE_EQ(s.l2, std::sqrt(l2));

  const uint16_t bf[] = {0x3F80, 0x7FC0, 0xFF80, 0xC2F7};  // 1, NaN, -Inf, -123.5
  const int64_t four[] = {4};
  const Stats b = FingerprintHost({bf, DType::kBFloat16, four, {}}).stats;
  EXPECT_EQ(b.nan_count, 1u);
  EXPECT_EQ(b.inf_count, 1u);
  EXPECT_EQ(b.min, -123.5);
  EXPECT_EQ(b.max, 1.0);
  EXPECT_EQ(b.sum, -122.5);

  const uint8_t e4[] = {0x38, 0x7F, 0x7E, 0xB8};  // 1, NaN, 448, -1
  const Stats f8 = FingerprintHost({e4, DType::kFloat8E4M3, four, {}}).stats;
  EXPECT_EQ(f8.nan_count, 1u);
  EXPECT_EQ(f8.inf_count, 0u);
  EXPECT_EQ(f8.max, 448.0);
  EXPECT_EQ(f8.min, -1.0);
  EXPECT_EQ(f8.sum, 448.0);

  const uint16_t h[] = {0x3C00, 0x7C00, 0x7E00, 0x0001};  // 1, Inf, NaN, 2^-24
  const Stats hs = FingerprintHost({h, DType::kFloat16, four, {}}).stats;
  EXPECT_EQ(hs.nan_count, 1u);
  EXPECT_EQ(hs.inf_count, 1u);
  EXPECT_EQ(hs.min, std::ldexp(1.0, -24));
  EXPECT_EQ(hs.max, 1.0);
}

// Training data is almost all finite, so the AVX2 and AVX-512 statistics take a shortcut
// for groups of eight finite values; it must give the bits of the scalar
// path, also for signed zeros, ties and extremes, and with non-finite values
// at every position of a group.
TEST(FingerprintStats, FiniteShortcutMatchesScalarBits) {
  if (!internal::CpuHasAvx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  SplitMix64 rng(42);
  const double specials[] = {0.0, -0.0, 1.0, -1.0, 3.4e38, -3.4e38, 1e-45, -1e-45};
  for (int nonfinite_every : {0, 7, 8, 61, 1000}) {
    for (uint64_t n : {8, 15, 16, 4095, 4096, 20000, 70001}) {
      std::vector<float> f(n);
      std::vector<double> d(n);
      std::vector<uint16_t> bf(n), h(n);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t r = rng.Next();
        double v = (static_cast<double>(r >> 11) * 0x1.0p-53 - 0.5) * 8.0;
        if (r % 13 == 0) v = specials[(r >> 8) % std::size(specials)];
        if (nonfinite_every != 0 && i % nonfinite_every == 3) {
          v = (r & 1) ? std::numeric_limits<double>::quiet_NaN()
                      : ((r & 2) ? 1 : -1) * std::numeric_limits<double>::infinity();
        }
        f[i] = static_cast<float>(v);
        d[i] = v;
        uint32_t bits;
        std::memcpy(&bits, &f[i], 4);
        bf[i] = static_cast<uint16_t>(bits >> 16);
        h[i] = static_cast<uint16_t>((bits >> 16 & 0x8000) | ((r >> 20) % 0x7C00));  // finite fp16
        if (nonfinite_every != 0 && i % nonfinite_every == 3) h[i] = (r & 4) ? 0x7C00 : 0xFE00;
      }
      struct Case {
        const void* data;
        DType dtype;
      } cases[] = {{f.data(), DType::kFloat32},
                   {d.data(), DType::kFloat64},
                   {bf.data(), DType::kBFloat16},
                   {h.data(), DType::kFloat16}};
      for (const Case& c : cases) {
        const int64_t shape[] = {static_cast<int64_t>(n)};
        HostOptions scalar;
        scalar.isa = Isa::kScalar;
        const Fingerprint want =
            internal::FingerprintHostWith({c.data, c.dtype, shape, {}}, scalar);
        for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
          if (isa == Isa::kAvx512 && !internal::CpuHasAvx512()) continue;
          HostOptions vec;
          vec.isa = isa;
          const Fingerprint got = internal::FingerprintHostWith({c.data, c.dtype, shape, {}}, vec);
          SCOPED_TRACE(std::string(DTypeName(c.dtype)) + " n=" + std::to_string(n) +
                       " nonfinite_every=" + std::to_string(nonfinite_every) +
                       " isa=" + std::to_string(static_cast<int>(isa)));
          EXPECT_EQ(got.digest, want.digest);
          ExpectSameStats(got.stats, want.stats);
        }
      }
    }
  }
}

TEST(FingerprintStats, IntegersAreExact) {
  const int64_t v[] = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
                       std::numeric_limits<int64_t>::min(), -5};
  const int64_t four[] = {4};
  const Stats s = FingerprintHost({v, DType::kInt64, four, {}}).stats;
  EXPECT_EQ(s.min, static_cast<double>(std::numeric_limits<int64_t>::min()));
  EXPECT_EQ(s.max, static_cast<double>(std::numeric_limits<int64_t>::max()));
  // Exact sum is 2^63 - 7; an int64 accumulator would have overflowed.
  EXPECT_EQ(s.sum, static_cast<double>((__int128{1} << 63) - 7));
  EXPECT_EQ(s.nan_count, 0u);

  const int8_t i8[] = {-128, 127, 5, -3};
  const Stats si = FingerprintHost({i8, DType::kInt8, four, {}}).stats;
  EXPECT_EQ(si.min, -128);
  EXPECT_EQ(si.max, 127);
  EXPECT_EQ(si.sum, 1);
  const uint32_t u32[] = {4000000000u, 4000000000u, 1, 0};
  const Stats su = FingerprintHost({u32, DType::kUInt32, four, {}}).stats;
  EXPECT_EQ(su.sum, 8000000001.0);
  EXPECT_EQ(su.min, 0);
  const uint8_t flags[] = {1, 0, 1, 1};
  EXPECT_EQ(FingerprintHost({flags, DType::kBool, four, {}}).stats.sum, 3);
}

TEST(FingerprintStats, EmptyTensorIsAllZero) {
  const int64_t shape[] = {0, 7};
  const Fingerprint f = FingerprintHost({nullptr, DType::kFloat32, shape, {}});
  EXPECT_NE(f.digest, Digest{});
  EXPECT_EQ(f.stats.nan_count, 0u);
  EXPECT_EQ(f.stats.min, 0);
  EXPECT_EQ(f.stats.max, 0);
  EXPECT_EQ(f.stats.sum, 0);
  EXPECT_EQ(f.stats.l2, 0);
}

// ---- committed vectors -----------------------------------------------------------------

TEST(FingerprintVectors, CommittedVectorsMatch) {
  std::vector<testgen::Vector> vectors;
  ASSERT_TRUE(testgen::ReadVectors(std::string(OPGUARD_FP_TESTDATA) + "/vectors.txt", &vectors));
  const auto inputs = testgen::VectorInputs();
  ASSERT_EQ(vectors.size(), inputs.size()) << "regenerate with fingerprint_vectors";
  std::set<std::string> distinct;
  for (const auto& v : vectors) {
    const auto bytes = testgen::VectorBytes(v);
    DType dtype{};
    ASSERT_TRUE(ParseDType(v.dtype, &dtype));
    const std::string got = FingerprintHost({bytes.data(), dtype, v.shape, {}}, 2).digest.Hex();
    EXPECT_EQ(got, v.hex) << "seed " << v.seed << " " << v.dtype << " "
                          << testgen::ShapeText(v.shape);
    distinct.insert(v.hex);
  }
  EXPECT_EQ(distinct.size(), vectors.size());
}

}  // namespace
}  // namespace opguard::fingerprint
