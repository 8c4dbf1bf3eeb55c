// CPU path of the fingerprint (docs/fingerprint.md). The per-word math comes
// from fingerprint_spec.h, shared with the CUDA kernels; this file only
// decides how to walk the bytes (tiles, threads, AVX-512, AVX2 or scalar).
#include "opguard/fingerprint/fingerprint.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fingerprint_internal.h"
#include "fingerprint_spec.h"
#include "opguard/common/hex.h"

namespace opguard::fingerprint {

// ---- dtypes -------------------------------------------------------------------

namespace {

struct DTypeInfo {
  DType dtype;
  uint8_t size;
  bool floating;
  std::string_view name;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kUnknown, 0, false, "unknown"},
    {DType::kFloat64, 8, true, "float64"},
    {DType::kFloat32, 4, true, "float32"},
    {DType::kFloat16, 2, true, "float16"},
    {DType::kBFloat16, 2, true, "bfloat16"},
    {DType::kFloat8E4M3, 1, true, "float8_e4m3fn"},
    {DType::kFloat8E5M2, 1, true, "float8_e5m2"},
    {DType::kInt64, 8, false, "int64"},
    {DType::kInt32, 4, false, "int32"},
    {DType::kInt16, 2, false, "int16"},
    {DType::kInt8, 1, false, "int8"},
    {DType::kUInt8, 1, false, "uint8"},
    {DType::kBool, 1, false, "bool"},
    {DType::kUInt16, 2, false, "uint16"},
    {DType::kUInt32, 4, false, "uint32"},
    {DType::kUInt64, 8, false, "uint64"},
    {DType::kComplex64, 8, true, "complex64"},
    {DType::kComplex128, 16, true, "complex128"},
};

const DTypeInfo& Info(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  return index < std::size(kDTypes) ? kDTypes[index] : kDTypes[0];
}

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }
bool IsFloating(DType dtype) { return Info(dtype).floating; }
std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

bool ParseDType(std::string_view text, DType* out) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"fp64", DType::kFloat64},
      {"f64", DType::kFloat64},
      {"double", DType::kFloat64},
      {"fp32", DType::kFloat32},
      {"f32", DType::kFloat32},
      {"float", DType::kFloat32},
      {"fp16", DType::kFloat16},
      {"f16", DType::kFloat16},
      {"half", DType::kFloat16},
      {"bf16", DType::kBFloat16},
      {"fp8_e4m3", DType::kFloat8E4M3},
      {"fp8_e4m3fn", DType::kFloat8E4M3},
      {"float8_e4m3", DType::kFloat8E4M3},
      {"e4m3", DType::kFloat8E4M3},
      {"fp8_e5m2", DType::kFloat8E5M2},
      {"e5m2", DType::kFloat8E5M2},
      {"i64", DType::kInt64},
      {"long", DType::kInt64},
      {"i32", DType::kInt32},
      {"int", DType::kInt32},
      {"i16", DType::kInt16},
      {"short", DType::kInt16},
      {"i8", DType::kInt8},
      {"u8", DType::kUInt8},
      {"byte", DType::kUInt8},
      {"u16", DType::kUInt16},
      {"u32", DType::kUInt32},
      {"u64", DType::kUInt64},
      {"c64", DType::kComplex64},
      {"cfloat", DType::kComplex64},
      {"c128", DType::kComplex128},
      {"cdouble", DType::kComplex128},
  };
  if (text.starts_with("torch.")) text.remove_prefix(6);
  for (const auto& info : kDTypes) {
    if (info.dtype != DType::kUnknown && info.name == text) {
      *out = info.dtype;
      return true;
    }
  }
  for (const auto& alias : kAliases) {
    if (alias.name == text) {
      *out = alias.dtype;
      return true;
    }
  }
  return false;
}

std::string Digest::Hex() const {
  uint8_t bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<uint8_t>(lo >> (8 * i));
    bytes[8 + i] = static_cast<uint8_t>(hi >> (8 * i));
  }
  return ToHex(bytes, sizeof bytes);
}

int64_t NumElements(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0) n = 0;
  }
  if (n == 0) return 0;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

std::string ValidateView(const TensorView& tensor) {
  if (DTypeSize(tensor.dtype) == 0) return "unknown dtype";
  const int64_t numel = NumElements(tensor.shape);
  if (numel < 0) return "shape has a negative dimension or overflows int64";
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(DTypeSize(tensor.dtype)), &bytes)) {
    return "tensor size overflows int64";
  }
  if (!tensor.strides.empty() && tensor.strides.size() != tensor.shape.size()) {
    return "strides and shape have different ranks";
  }
  if (numel > 0 && tensor.data == nullptr) return "null data for a non-empty tensor";
  return {};
}

MetaKey ComputeMeta(DType dtype, std::span<const int64_t> shape) {
  spec::Meta meta;
  const int64_t numel = std::max<int64_t>(NumElements(shape), 0);
  spec::Absorb(meta, static_cast<uint64_t>(dtype));
  spec::Absorb(meta, static_cast<uint64_t>(numel) * DTypeSize(dtype));
  spec::Absorb(meta, shape.size());
  for (int64_t d : shape) spec::Absorb(meta, static_cast<uint64_t>(d));
  return {meta.lo, meta.hi};
}

namespace internal {

bool CpuHasAvx2() {
  // F16C from CPUID leaf 1 (ECX bit 29): clang before 15 has no "f16c" for
  // __builtin_cpu_supports.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 &&
           (ecx & bit_F16C) != 0;
  }();
  return has;
}

bool CpuHasAvx512() {
  // __builtin_cpu_supports also checks that the OS saves the ZMM registers.
  static const bool has = CpuHasAvx2() && __builtin_cpu_supports("avx512f");
  return has;
}

}  // namespace internal

namespace {

using internal::HostOptions;
using internal::Isa;

// ---- hashing --------------------------------------------------------------------

struct KeyTables {
  alignas(64) uint64_t a[spec::kBlockWords];
  alignas(64) uint64_t b[spec::kBlockWords];
};

constexpr KeyTables MakeKeyTables() {
  KeyTables t{};
  for (uint32_t i = 0; i < spec::kBlockWords; ++i) {
    t.a[i] = spec::TableKeyA(i);
    t.b[i] = spec::TableKeyB(i);
  }
  return t;
}

constexpr KeyTables kKeys = MakeKeyTables();

inline uint64_t Load64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);  // the format is little-endian; so is every host we build for
  return w;
}

// The key block of word `word` (the stream's words come in blocks of
// kBlockWords with keys of their own): its keys, the word's index in it, and
// where the block ends, or `end` if that comes first.
struct BlockSpan {
  spec::BlockKeys keys;
  uint32_t index;
  uint64_t end;
};

inline BlockSpan SpanAt(uint64_t word, uint64_t end) {
  const uint64_t block = word / spec::kBlockWords;
  return {spec::BlockKey(block), static_cast<uint32_t>(word % spec::kBlockWords),
          std::min(end, (block + 1) * spec::kBlockWords)};
}

// Adds the words from `word` to the end of `span` one at a time, advancing
// `p` and `word`: the scalar path, and the vector paths' last words.
inline void AddWordsOneByOne(const uint8_t*& p, uint64_t& word, const BlockSpan& span, uint32_t i,
                             uint64_t& a0, uint64_t& a1) {
  for (; word < span.end; ++word, ++i, p += 8) {
    const uint64_t w = Load64(p);
    a0 += spec::TermA(w, kKeys.a[i] + span.keys.a);
    a1 += spec::TermB(w, kKeys.b[i] + span.keys.b);
  }
}

// Adds words [first_word, first_word + nwords) read from `p` (which points at
// word first_word; any alignment). Reference loop: the AVX2 path must match it.
void HashWordsScalar(const uint8_t* p, uint64_t first_word, uint64_t nwords, spec::Lanes& lanes) {
  uint64_t word = first_word;
  const uint64_t end = first_word + nwords;
  while (word < end) {
    const BlockSpan span = SpanAt(word, end);
    AddWordsOneByOne(p, word, span, span.index, lanes.a0, lanes.a1);
  }
}

__attribute__((target("avx2"))) inline uint64_t HorizontalSum(__m256i v) {
  const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(s)) +
         static_cast<uint64_t>(_mm_extract_epi64(s, 1));
}

__attribute__((target("avx2"))) void HashWordsAvx2(const uint8_t* p, uint64_t first_word,
                                                   uint64_t nwords, spec::Lanes& lanes) {
  uint64_t word = first_word;
  const uint64_t end = first_word + nwords;
  __m256i acc_a = _mm256_setzero_si256(), acc_b = _mm256_setzero_si256();
  uint64_t a0 = 0, a1 = 0;  // scalar remainders
  while (word < end) {
    const BlockSpan span = SpanAt(word, end);
    const uint64_t block_end = span.end;
    uint32_t i = span.index;
    const __m256i ka = _mm256_set1_epi64x(static_cast<int64_t>(span.keys.a));
    const __m256i kb = _mm256_set1_epi64x(static_cast<int64_t>(span.keys.b));
    // Two words-of-four per iteration keeps two independent multiply chains in flight.
    for (; word + 8 <= block_end; word += 8, i += 8, p += 64) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
      const __m256i xa0 = _mm256_xor_si256(
          w0,
          _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kKeys.a + i)), ka));
      const __m256i xa1 = _mm256_xor_si256(
          w1, _mm256_add_epi64(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kKeys.a + i + 4)), ka));
      const __m256i xb0 = _mm256_xor_si256(
          w0,
          _mm256_add_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kKeys.b + i)), kb));
      const __m256i xb1 = _mm256_xor_si256(
          w1, _mm256_add_epi64(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kKeys.b + i + 4)), kb));
      const __m256i pa0 = _mm256_mul_epu32(xa0, _mm256_srli_epi64(xa0, 32));
      const __m256i pa1 = _mm256_mul_epu32(xa1, _mm256_srli_epi64(xa1, 32));
      const __m256i pb0 = _mm256_mul_epu32(xb0, _mm256_srli_epi64(xb0, 32));
      const __m256i pb1 = _mm256_mul_epu32(xb1, _mm256_srli_epi64(xb1, 32));
      // _MM_SHUFFLE(2, 3, 0, 1) swaps the 32-bit halves of each 64-bit word.
      acc_a = _mm256_add_epi64(acc_a, _mm256_add_epi64(pa0, _mm256_shuffle_epi32(w0, 0xB1)));
      acc_a = _mm256_add_epi64(acc_a, _mm256_add_epi64(pa1, _mm256_shuffle_epi32(w1, 0xB1)));
      acc_b = _mm256_add_epi64(acc_b, _mm256_add_epi64(pb0, w0));
      acc_b = _mm256_add_epi64(acc_b, _mm256_add_epi64(pb1, w1));
    }
    AddWordsOneByOne(p, word, span, i, a0, a1);
  }
  lanes.a0 += a0 + HorizontalSum(acc_a);
  lanes.a1 += a1 + HorizontalSum(acc_b);
}

// GCC 12's AVX-512 intrinsics start their results from a self-initialised
// _mm512_undefined_epi32(), which -W(maybe-)uninitialized flags once inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// The terms of eight words at table index k.. of a block with keys ka, kb
// (a function, not a lambda: lambdas do not inherit the target attribute).
// _MM_PERM_CDAB swaps the 32-bit halves of each 64-bit word (swap32).
__attribute__((target("avx512f"))) inline void Add8Words(__m512i w, uint32_t k, __m512i ka,
                                                        __m512i kb, __m512i& acc_a,
                                                        __m512i& acc_b) {
  const __m512i x = _mm512_xor_si512(w, _mm512_add_epi64(_mm512_loadu_si512(kKeys.a + k), ka));
  const __m512i y = _mm512_xor_si512(w, _mm512_add_epi64(_mm512_loadu_si512(kKeys.b + k), kb));
  acc_a = _mm512_add_epi64(acc_a, _mm512_add_epi64(_mm512_mul_epu32(x, _mm512_srli_epi64(x, 32)),
                                                   _mm512_shuffle_epi32(w, _MM_PERM_CDAB)));
  acc_b = _mm512_add_epi64(acc_b, _mm512_add_epi64(_mm512_mul_epu32(y, _mm512_srli_epi64(y, 32)), w));
}

// HashWordsAvx2 with eight words per register: the same terms, added in
// another order (addition mod 2^64 commutes), about twice the bytes per
// cycle where the CPU has AVX-512 (the bench: fingerprint_bench).
// `visit(chunk)` sees each 64 bytes hashed eight words at a time, in stream
// order, for a pass that does more with them (HashAndStatsFloat32Avx512);
// the words hashed one by one (a span's last, short of eight) are not seen.
template <typename Visit>
__attribute__((target("avx512f"), always_inline)) inline void HashWordsAvx512Visiting(
    const uint8_t* p, uint64_t first_word, uint64_t nwords, spec::Lanes& lanes, Visit visit) {
  uint64_t word = first_word;
  const uint64_t end = first_word + nwords;
  // Two accumulators per lane keep two independent add chains in flight.
  __m512i acc_a0 = _mm512_setzero_si512(), acc_a1 = _mm512_setzero_si512();
  __m512i acc_b0 = _mm512_setzero_si512(), acc_b1 = _mm512_setzero_si512();
  uint64_t a0 = 0, a1 = 0;  // scalar remainders
  while (word < end) {
    const BlockSpan span = SpanAt(word, end);
    const uint64_t block_end = span.end;
    uint32_t i = span.index;
    const __m512i ka = _mm512_set1_epi64(static_cast<int64_t>(span.keys.a));
    const __m512i kb = _mm512_set1_epi64(static_cast<int64_t>(span.keys.b));
    for (; word + 16 <= block_end; word += 16, i += 16, p += 128) {
      Add8Words(_mm512_loadu_si512(p), i, ka, kb, acc_a0, acc_b0);
      Add8Words(_mm512_loadu_si512(p + 64), i + 8, ka, kb, acc_a1, acc_b1);
      visit(p);
      visit(p + 64);
    }
    for (; word + 8 <= block_end; word += 8, i += 8, p += 64) {
      Add8Words(_mm512_loadu_si512(p), i, ka, kb, acc_a0, acc_b0);
      visit(p);
    }
    AddWordsOneByOne(p, word, span, i, a0, a1);
  }
  lanes.a0 += a0 + static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(acc_a0, acc_a1)));
  lanes.a1 += a1 + static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(acc_b0, acc_b1)));
}

__attribute__((target("avx512f"))) void HashWordsAvx512(const uint8_t* p, uint64_t first_word,
                                                        uint64_t nwords, spec::Lanes& lanes) {
  HashWordsAvx512Visiting(p, first_word, nwords, lanes, [](const uint8_t*) {});
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

using HashFn = void (*)(const uint8_t*, uint64_t, uint64_t, spec::Lanes&);

// The widest path the CPU runs, at most the one `isa` asks for.
HashFn SelectHash(Isa isa) {
  if ((isa == Isa::kAuto || isa == Isa::kAvx512) && internal::CpuHasAvx512()) {
    return HashWordsAvx512;
  }
  if (isa != Isa::kScalar && internal::CpuHasAvx2()) return HashWordsAvx2;
  return HashWordsScalar;
}

// Adds the zero-padded last word of the stream [offset, offset + len) held at
// `p`, when `len` ends mid-word (HashBytes).
inline void AddPartialLastWord(const uint8_t* p, uint64_t offset, uint64_t len,
                               spec::Lanes& lanes) {
  if (const uint64_t rest = len % 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + len / 8 * 8, rest);
    spec::AddWord(lanes, w, offset / 8 + len / 8);
  }
}

// Hashes the bytes [offset, offset + len) of the logical stream, held at `p`.
// `offset` is a multiple of 8; `len` may end mid-word only at the end of the
// stream (the zero-padded last word).
void HashBytes(HashFn hash, const uint8_t* p, uint64_t offset, uint64_t len, spec::Lanes& lanes) {
  hash(p, offset / 8, len / 8, lanes);
  AddPartialLastWord(p, offset, len, lanes);
}

// ---- statistics -----------------------------------------------------------------

// Decoding tables built from the spec functions, so CPU and GPU agree on
// every fp16 and fp8 value.
struct DecodeTables {
  std::vector<float> half;  // 65536 entries; every fp16 value is exact in fp32
  float e4m3[256];
  float e5m2[256];
  DecodeTables() : half(65536) {
    for (uint32_t i = 0; i < 65536; ++i) {
      half[i] = static_cast<float>(spec::HalfToDouble(static_cast<uint16_t>(i)));
    }
    for (uint32_t i = 0; i < 256; ++i) {
      e4m3[i] = static_cast<float>(spec::Fp8E4M3ToDouble(static_cast<uint8_t>(i)));
      e5m2[i] = static_cast<float>(spec::Fp8E5M2ToDouble(static_cast<uint8_t>(i)));
    }
  }
};

const DecodeTables& Tables() {
  static const DecodeTables* tables = new DecodeTables();
  return *tables;
}

// Per-tile floating statistics with 8 interleaved accumulators (element e of
// the tile goes to accumulator e % 8, combined in a fixed tree): the same
// order on every path and thread count, and a loop GCC can vectorise.
struct TileFloat {
  uint64_t nan = 0, inf = 0, finite = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0, l2 = 0;
};

// The accumulators of one tile: element e goes to slot e % 8. The AVX2
// kernels below keep the same eight slots in two registers and hand the
// remainder to Add(), so both paths perform the same roundings.
struct FloatAcc8 {
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  uint64_t nan[8] = {}, inf[8] = {};
  double mn[8] = {kInf, kInf, kInf, kInf, kInf, kInf, kInf, kInf};
  double mx[8] = {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
  double s[8] = {}, q[8] = {};

  void Add(uint64_t j, double v) {
    const bool is_nan = v != v;
    const bool is_inf = std::fabs(v) == kInf;
    const bool finite = !is_nan && !is_inf;
    const double f = finite ? v : 0.0;
    nan[j] += is_nan;
    inf[j] += is_inf;
    s[j] += f;
    q[j] += f * f;
    if (finite && v <= mn[j]) mn[j] = v;
    if (finite && v >= mx[j]) mx[j] = v;
  }

  TileFloat Finish(uint64_t n) const {
    TileFloat t;
    for (int j = 0; j < 8; ++j) {
      t.nan += nan[j];
      t.inf += inf[j];
      t.min = std::min(t.min, mn[j]);
      t.max = std::max(t.max, mx[j]);
    }
    t.finite = n - t.nan - t.inf;
    t.sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    t.l2 = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
    return t;
  }
};

struct TileInt {
  __int128 min = 0, max = 0, sum = 0;
  uint64_t count = 0;
};

namespace scalar_stats {
#include "fingerprint_stats.inc"
}  // namespace scalar_stats

// GCC's target pragma; clang's equivalent is an attribute pushed on every
// function (lambdas' call operators included).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
namespace avx2_stats {
#include "fingerprint_stats.inc"
}  // namespace avx2_stats
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

void StatsTileScalar(DType d, const uint8_t* p, uint64_t len, TileFloat* f, TileInt* i) {
  scalar_stats::StatsTile(d, p, len, f, i);
}
// Lambdas do not inherit a function's target attribute, so the AVX2
// statistics kernels are compiled under a target pragma instead.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

// Four slots of FloatAcc8 in registers; Add4 is FloatAcc8::Add for
// j = base..base+3 (same comparisons, same roundings, no FMA).
struct Avx2Slots {
  __m256i nan, inf;
  __m256d mn, mx, s, q;
};

inline void Add4(Avx2Slots& a, __m256d v) {
  const __m256d abs = _mm256_andnot_pd(_mm256_set1_pd(-0.0), v);
  const __m256d inf = _mm256_set1_pd(FloatAcc8::kInf);
  const __m256d is_nan = _mm256_cmp_pd(v, v, _CMP_UNORD_Q);
  const __m256d is_inf = _mm256_cmp_pd(abs, inf, _CMP_EQ_OQ);
  const __m256d finite = _mm256_cmp_pd(abs, inf, _CMP_LT_OQ);
  const __m256d f = _mm256_and_pd(v, finite);
  a.nan = _mm256_sub_epi64(a.nan, _mm256_castpd_si256(is_nan));
  a.inf = _mm256_sub_epi64(a.inf, _mm256_castpd_si256(is_inf));
  a.s = _mm256_add_pd(a.s, f);
  a.q = _mm256_add_pd(a.q, _mm256_mul_pd(f, f));
  a.mn = _mm256_blendv_pd(a.mn, v, _mm256_and_pd(finite, _mm256_cmp_pd(v, a.mn, _CMP_LE_OQ)));
  a.mx = _mm256_blendv_pd(a.mx, v, _mm256_and_pd(finite, _mm256_cmp_pd(v, a.mx, _CMP_GE_OQ)));
}

// Add4 for four finite values: nothing to count, nothing to mask, and
// min/max as MINPD/MAXPD, which return their second operand on ties (also for
// +0/-0), exactly as Add4's `v <= mn` / `v >= mx` select v.
inline void AddFinite4(Avx2Slots& a, __m256d v) {
  a.s = _mm256_add_pd(a.s, v);
  a.q = _mm256_add_pd(a.q, _mm256_mul_pd(v, v));
  a.mn = _mm256_min_pd(a.mn, v);
  a.mx = _mm256_max_pd(a.mx, v);
}

// True when all eight values are finite (no NaN, no infinity).
inline bool AllFinite8(__m256d v0, __m256d v1) {
  const __m256d sign = _mm256_set1_pd(-0.0);
  const __m256d inf = _mm256_set1_pd(FloatAcc8::kInf);
  const __m256d f0 = _mm256_cmp_pd(_mm256_andnot_pd(sign, v0), inf, _CMP_LT_OQ);
  const __m256d f1 = _mm256_cmp_pd(_mm256_andnot_pd(sign, v1), inf, _CMP_LT_OQ);
  return _mm256_movemask_pd(_mm256_and_pd(f0, f1)) == 0xF;
}

inline Avx2Slots Load4(const FloatAcc8& acc, int base) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc.nan + base)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc.inf + base)),
          _mm256_loadu_pd(acc.mn + base),
          _mm256_loadu_pd(acc.mx + base),
          _mm256_loadu_pd(acc.s + base),
          _mm256_loadu_pd(acc.q + base)};
}

inline void Store4(const Avx2Slots& a, FloatAcc8& acc, int base) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc.nan + base), a.nan);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc.inf + base), a.inf);
  _mm256_storeu_pd(acc.mn + base, a.mn);
  _mm256_storeu_pd(acc.mx + base, a.mx);
  _mm256_storeu_pd(acc.s + base, a.s);
  _mm256_storeu_pd(acc.q + base, a.q);
}

// Runs groups of eight elements through the registers; `load8(e)` yields
// elements e..e+7 as eight floats (or two vectors of four doubles).
template <typename Load8>
inline TileFloat Avx2FloatTile(uint64_t n, Load8 load8, const uint8_t* p, size_t unit,
                               auto decode) {
  FloatAcc8 acc;
  Avx2Slots lo = Load4(acc, 0), hi = Load4(acc, 4);
  uint64_t e = 0;
  for (; e + 8 <= n; e += 8) {
    __m256d v0, v1;
    load8(e, v0, v1);
    if (AllFinite8(v0, v1)) {  // the common case: a third of the work
      AddFinite4(lo, v0);
      AddFinite4(hi, v1);
    } else {
      Add4(lo, v0);
      Add4(hi, v1);
    }
  }
  Store4(lo, acc, 0);
  Store4(hi, acc, 4);
  for (; e < n; ++e) acc.Add(e % 8, decode(p + e * unit));
  return acc.Finish(n);
}

inline void Widen(__m256 f, __m256d& v0, __m256d& v1) {
  v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
  v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
}

// Avx2FloatTile for float32, with the finiteness test and min/max of finite
// groups done on the eight floats before widening. Widening is exact and
// monotonic, so the float min/max equal the double ones. They are folded
// into the double slots before every non-finite group and at the end with
// the newer values as MINPD/MAXPD's second operand, which wins ties: Add4's
// `v <= mn` also keeps the later of equal values (-0 and +0 included).
inline TileFloat Avx2Float32Tile(const uint8_t* p, uint64_t n) {
  FloatAcc8 acc;
  Avx2Slots lo = Load4(acc, 0), hi = Load4(acc, 4);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 mn = inf, mx = neg_inf;
  auto fold = [&] {
    __m256d a0, a1;
    Widen(mn, a0, a1);
    lo.mn = _mm256_min_pd(lo.mn, a0);
    hi.mn = _mm256_min_pd(hi.mn, a1);
    Widen(mx, a0, a1);
    lo.mx = _mm256_max_pd(lo.mx, a0);
    hi.mx = _mm256_max_pd(hi.mx, a1);
    mn = inf;
    mx = neg_inf;
  };
  uint64_t e = 0;
  for (; e + 8 <= n; e += 8) {
    const __m256 f = _mm256_loadu_ps(reinterpret_cast<const float*>(p + e * 4));
    const __m256 finite = _mm256_cmp_ps(_mm256_andnot_ps(sign, f), inf, _CMP_LT_OQ);
    __m256d v0, v1;
    Widen(f, v0, v1);
    if (_mm256_movemask_ps(finite) == 0xFF) {
      mn = _mm256_min_ps(mn, f);
      mx = _mm256_max_ps(mx, f);
      lo.s = _mm256_add_pd(lo.s, v0);
      lo.q = _mm256_add_pd(lo.q, _mm256_mul_pd(v0, v0));
      hi.s = _mm256_add_pd(hi.s, v1);
      hi.q = _mm256_add_pd(hi.q, _mm256_mul_pd(v1, v1));
    } else {
      fold();
      Add4(lo, v0);
      Add4(hi, v1);
    }
  }
  fold();
  Store4(lo, acc, 0);
  Store4(hi, acc, 4);
  for (; e < n; ++e) {
    float v;
    std::memcpy(&v, p + e * 4, 4);
    acc.Add(e % 8, static_cast<double>(v));
  }
  return acc.Finish(n);
}

void StatsTileAvx2(DType d, const uint8_t* p, uint64_t len, TileFloat* f, TileInt* i) {
  switch (d) {
    case DType::kFloat32:
    case DType::kComplex64:
      *f = Avx2Float32Tile(p, len / 4);
      return;
    case DType::kFloat64:
    case DType::kComplex128:
      *f = Avx2FloatTile(
          len / 8,
          [p](uint64_t e, __m256d& v0, __m256d& v1) {
            v0 = _mm256_loadu_pd(reinterpret_cast<const double*>(p + e * 8));
            v1 = _mm256_loadu_pd(reinterpret_cast<const double*>(p + e * 8 + 32));
          },
          p, 8,
          [](const uint8_t* q) {
            double v;
            std::memcpy(&v, q, 8);
            return v;
          });
      return;
    case DType::kFloat16:
      // F16C converts every fp16 value (subnormals, Inf, NaN) exactly.
      *f = Avx2FloatTile(
          len / 2,
          [p](uint64_t e, __m256d& v0, __m256d& v1) {
            Widen(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + e * 2))), v0,
                  v1);
          },
          p, 2,
          [](const uint8_t* q) {
            uint16_t h;
            std::memcpy(&h, q, 2);
            return spec::HalfToDouble(h);
          });
      return;
    case DType::kBFloat16:
      *f = Avx2FloatTile(
          len / 2,
          [p](uint64_t e, __m256d& v0, __m256d& v1) {
            const __m256i w =
                _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + e * 2)));
            Widen(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), v0, v1);
          },
          p, 2,
          [](const uint8_t* q) {
            uint16_t h;
            std::memcpy(&h, q, 2);
            return spec::BFloat16ToDouble(h);
          });
      return;
    default:
      avx2_stats::StatsTile(d, p, len, f, i);
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c,avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f")
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // as for HashWordsAvx512
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Avx2Float32Tile with FloatAcc8's eight slots of sum and l2 in one register
// each: the same additions in the same order per slot, half the
// instructions. A group with a non-finite value goes through FloatAcc8::Add
// (what Add4 computes), with the register slots spilled around it. Groups
// are added in element order (Group), then Finish adds the rest.
struct Avx512Float32Stats {
  FloatAcc8 acc;
  __m512d s = _mm512_loadu_pd(acc.s), q = _mm512_loadu_pd(acc.q);
  __m512d mn_d = _mm512_loadu_pd(acc.mn), mx_d = _mm512_loadu_pd(acc.mx);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 mn = inf, mx = neg_inf;

  // Declared, so that it is compiled for this target (an implicit one is not).
  Avx512Float32Stats() {}
  Avx512Float32Stats(const Avx512Float32Stats&) = delete;

  // Float min/max folded into the double slots, newer values second (see
  // Avx2Float32Tile).
  void Fold() {
    mn_d = _mm512_min_pd(mn_d, _mm512_cvtps_pd(mn));
    mx_d = _mm512_max_pd(mx_d, _mm512_cvtps_pd(mx));
    mn = inf;
    mx = neg_inf;
  }
  void Spill() {
    Fold();
    _mm512_storeu_pd(acc.s, s);
    _mm512_storeu_pd(acc.q, q);
    _mm512_storeu_pd(acc.mn, mn_d);
    _mm512_storeu_pd(acc.mx, mx_d);
  }
  // Elements e..e+7 of the tile, at `p` (e a multiple of 8: slots 0..7).
  void Group(const uint8_t* p) {
    const __m256 f = _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    const __m256 finite = _mm256_cmp_ps(_mm256_andnot_ps(sign, f), inf, _CMP_LT_OQ);
    if (_mm256_movemask_ps(finite) == 0xFF) {
      const __m512d v = _mm512_cvtps_pd(f);
      mn = _mm256_min_ps(mn, f);
      mx = _mm256_max_ps(mx, f);
      s = _mm512_add_pd(s, v);
      q = _mm512_add_pd(q, _mm512_mul_pd(v, v));
    } else {
      Spill();
      for (uint64_t j = 0; j < 8; ++j) {
        float v;
        std::memcpy(&v, p + j * 4, 4);
        acc.Add(j, static_cast<double>(v));
      }
      s = _mm512_loadu_pd(acc.s);
      q = _mm512_loadu_pd(acc.q);
      mn_d = _mm512_loadu_pd(acc.mn);
      mx_d = _mm512_loadu_pd(acc.mx);
    }
  }
  // Adds elements e..n-1 of the tile at `tile` (e a multiple of 8) and
  // returns the tile's statistics.
  TileFloat Finish(const uint8_t* tile, uint64_t e, uint64_t n) {
    for (; e + 8 <= n; e += 8) Group(tile + e * 4);
    Spill();
    for (; e < n; ++e) {
      float v;
      std::memcpy(&v, tile + e * 4, 4);
      acc.Add(e % 8, static_cast<double>(v));
    }
    return acc.Finish(n);
  }
};

inline TileFloat Avx512Float32Tile(const uint8_t* p, uint64_t n) {
  Avx512Float32Stats stats;
  return stats.Finish(p, 0, n);
}

// HashBytes and Avx512Float32Tile in one pass over a float32 tile at stream
// byte `offset` (a multiple of 64: blocks then start on 16-element groups,
// so only the stream's last words are hashed one by one): each 64 bytes
// loaded feed the hash's terms and two statistics groups. The statistics'
// add chains (one dependent add per eight elements, in a fixed order) and
// the hash's multiplies then overlap, where two passes ran one after the
// other (fingerprint_bench, TrainingFloats). Same terms, same additions in
// the same order: the same bits as the two passes.
void HashAndStatsFloat32Avx512(const uint8_t* p, uint64_t offset, uint64_t len, spec::Lanes& lanes,
                               TileFloat* f) {
  Avx512Float32Stats stats;
  uint64_t grouped = 0;  // elements from `p` on that went through stats.Group
  // Everything inlined into this one function, so that the statistics'
  // registers stay registers.
  HashWordsAvx512Visiting(p, offset / 8, len / 8, lanes, [&](const uint8_t* chunk) {
    stats.Group(chunk);
    stats.Group(chunk + 32);
    grouped += 16;
  });
  AddPartialLastWord(p, offset, len, lanes);
  *f = stats.Finish(p, grouped, len / 4);
}

void StatsTileAvx512(DType d, const uint8_t* p, uint64_t len, TileFloat* f, TileInt* i) {
  if (d == DType::kFloat32 || d == DType::kComplex64) {
    *f = Avx512Float32Tile(p, len / 4);
  } else {
    StatsTileAvx2(d, p, len, f, i);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// ---- walking the tensor -----------------------------------------------------------

// Copies logical bytes [offset, offset + len) of a strided tensor into `out`.
// `offset` and `len` are multiples of the element size.
void Gather(const TensorView& t, uint64_t offset, uint64_t len, uint8_t* out) {
  const size_t es = DTypeSize(t.dtype);
  const size_t rank = t.shape.size();
  uint64_t e = offset / es;
  const uint64_t count = len / es;
  std::vector<int64_t> idx(rank);
  for (size_t d = rank; d-- > 0;) {
    const auto dim = static_cast<uint64_t>(t.shape[d]);
    idx[d] = static_cast<int64_t>(e % dim);
    e /= dim;
  }
  const auto* base = static_cast<const uint8_t*>(t.data);
  int64_t elem_offset = 0;  // in elements, may be negative
  for (size_t d = 0; d < rank; ++d) elem_offset += idx[d] * t.strides[d];
  for (uint64_t k = 0; k < count; ++k) {
    std::memcpy(out + k * es, base + elem_offset * static_cast<int64_t>(es), es);
    for (size_t d = rank; d-- > 0;) {  // odometer increment, innermost first
      elem_offset += t.strides[d];
      if (++idx[d] < t.shape[d]) break;
      elem_offset -= t.strides[d] * t.shape[d];
      idx[d] = 0;
    }
  }
}

bool IsContiguous(const TensorView& t) {
  if (t.strides.empty()) return true;
  int64_t expected = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] == 0) return true;
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

struct Partial {
  spec::Lanes lanes;
  TileFloat f;
  spec::IntStats i;
  bool any_float = false;
};

void MergeFloatCounts(TileFloat& into, const TileFloat& t) {
  into.nan += t.nan;
  into.inf += t.inf;
  into.finite += t.finite;
  into.min = std::min(into.min, t.min);
  into.max = std::max(into.max, t.max);
}

// The calling thread's tile buffer for strided tensors, kept for its next
// call (the adapter fingerprints one tensor after another). Declared in a
// function that every thread using it runs, so that each thread's buffer is
// constructed, and freed when the thread exits (a pool's threads included).
std::vector<uint8_t>& ThreadGatherBuffer() {
  thread_local std::vector<uint8_t> buffer;
  return buffer;
}

}  // namespace

namespace internal {

Fingerprint FingerprintHostWith(const TensorView& tensor, const HostOptions& options,
                                ByteSums* sums) {
  Fingerprint result;
  if (sums != nullptr) *sums = ByteSums{};
  if (!ValidateView(tensor).empty()) return result;
  const uint64_t es = DTypeSize(tensor.dtype);
  const uint64_t total = static_cast<uint64_t>(NumElements(tensor.shape)) * es;
  const bool contiguous = IsContiguous(tensor);
  const uint64_t tile = std::max<uint64_t>(16, options.tile_bytes / 16 * 16);
  const uint64_t tiles = (total + tile - 1) / tile;
  const HashFn hash = SelectHash(options.isa);
  const auto stats_tile = hash == HashWordsAvx512 ? StatsTileAvx512
                          : hash == HashWordsAvx2 ? StatsTileAvx2
                                                  : StatsTileScalar;
  const bool floating = IsFloating(tensor.dtype);
  // Tiles start on 64-byte stream offsets (HashAndStatsFloat32Avx512).
  const bool fused_float32 = hash == HashWordsAvx512 && options.stats && tile % 64 == 0 &&
                             (tensor.dtype == DType::kFloat32 || tensor.dtype == DType::kComplex64);

  int threads = options.threads;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const uint64_t by_size =
      std::max<uint64_t>(1, total / std::max<uint64_t>(1, options.min_bytes_per_thread));
  threads = static_cast<int>(
      std::min<uint64_t>({static_cast<uint64_t>(threads), by_size, std::max<uint64_t>(tiles, 1)}));

  // sum/l2 are folded tile by tile in tile order, so they do not depend on
  // the thread count: one thread folds as it goes (`fold`); several keep
  // per-tile sums (`tile_sum`, `tile_l2`) that are folded in order below.
  double fold_sum = 0, fold_l2 = 0;
  std::vector<double> tile_sum(options.stats && floating && threads > 1 ? tiles : 0);
  std::vector<double> tile_l2(tile_sum.size());
  Partial single;
  std::vector<Partial> partials(threads > 1 ? threads : 0);

  auto work = [&](int t, std::vector<uint8_t>& gathered) {
    const uint64_t t0 = tiles * t / threads, t1 = tiles * (t + 1) / threads;
    Partial& part = threads > 1 ? partials[t] : single;
    if (!contiguous && gathered.size() < tile) gathered.resize(tile);
    for (uint64_t k = t0; k < t1; ++k) {
      const uint64_t offset = k * tile;
      const uint64_t len = std::min(tile, total - offset);
      const uint8_t* p;
      if (contiguous) {
        p = static_cast<const uint8_t*>(tensor.data) + offset;
      } else {
        Gather(tensor, offset, len, gathered.data());
        p = gathered.data();
      }
      TileFloat f;
      TileInt i;
      if (fused_float32) {
        HashAndStatsFloat32Avx512(p, offset, len, part.lanes, &f);
      } else {
        HashBytes(hash, p, offset, len, part.lanes);
        if (!options.stats) continue;
        stats_tile(tensor.dtype, p, len, &f, &i);
      }
      if (floating) {
        MergeFloatCounts(part.f, f);
        if (threads > 1) {
          tile_sum[k] = f.sum;
          tile_l2[k] = f.l2;
        } else {
          fold_sum += f.sum;
          fold_l2 += f.l2;
        }
      } else if (i.count) {
        spec::IntStats s;
        s.count = i.count;
        s.min = i.min;
        s.max = i.max;
        s.sum = i.sum;
        part.i.Merge(s);
      }
    }
  };
  if (threads == 1) {
    work(0, ThreadGatherBuffer());
  } else if (options.run_parallel != nullptr) {
    // A pool thread runs its shares one after another: its own buffer serves them.
    (*options.run_parallel)(threads, [&work](int t) { work(t, ThreadGatherBuffer()); });
  } else {
    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    for (int t = 1; t < threads; ++t) {
      pool.emplace_back([&work, t] {
        std::vector<uint8_t> gathered;
        work(t, gathered);
      });
    }
    work(0, ThreadGatherBuffer());
    for (auto& th : pool) th.join();
  }
  for (uint64_t k = 0; k < tile_sum.size(); ++k) {
    fold_sum += tile_sum[k];
    fold_l2 += tile_l2[k];
  }
  spec::Lanes lanes;
  TileFloat f;
  spec::IntStats ints;
  const std::span<const Partial> parts =
      threads > 1 ? std::span<const Partial>(partials) : std::span<const Partial>(&single, 1);
  for (const Partial& part : parts) {
    lanes.a0 += part.lanes.a0;
    lanes.a1 += part.lanes.a1;
    MergeFloatCounts(f, part.f);
    ints.Merge(part.i);
  }
  const ByteSums byte_sums{lanes.a0, lanes.a1};
  if (sums != nullptr) *sums = byte_sums;
  result.digest = Refinalize(byte_sums, tensor.dtype, tensor.shape);

  if (options.stats) {
    Stats& s = result.stats;
    if (floating) {
      s.nan_count = f.nan;
      s.inf_count = f.inf;
      if (f.finite) {
        s.min = f.min;
        s.max = f.max;
      }
      s.sum = fold_sum;
      s.l2 = std::sqrt(fold_l2);
    } else if (ints.count) {
      s.min = spec::Int128ToDouble(ints.min);
      s.max = spec::Int128ToDouble(ints.max);
      s.sum = spec::Int128ToDouble(ints.sum);
    }
  }
  return result;
}

}  // namespace internal

Fingerprint FingerprintHost(const TensorView& tensor, int threads, ByteSums* sums) {
  internal::HostOptions options;
  options.threads = threads;
  return internal::FingerprintHostWith(tensor, options, sums);
}

Fingerprint FingerprintHostOn(const TensorView& tensor, int tasks, const ParallelFor& run,
                              ByteSums* sums) {
  internal::HostOptions options;
  options.threads = std::max(1, tasks);
  options.min_bytes_per_thread = options.tile_bytes;  // the caller sized `tasks`
  options.run_parallel = &run;
  return internal::FingerprintHostWith(tensor, options, sums);
}

Digest Refinalize(const ByteSums& sums, DType dtype, std::span<const int64_t> shape) {
  const MetaKey mk = ComputeMeta(dtype, shape);
  spec::Meta meta;
  meta.lo = mk.lo;
  meta.hi = mk.hi;
  spec::Lanes lanes;
  lanes.a0 = sums.a0;
  lanes.a1 = sums.a1;
  Digest digest;
  spec::Finalize(lanes, meta, &digest.lo, &digest.hi);
  return digest;
}

Digest DigestHost(const TensorView& tensor, int threads) {
  internal::HostOptions options;
  options.threads = threads;
  options.stats = false;
  return internal::FingerprintHostWith(tensor, options).digest;
}

}  // namespace opguard::fingerprint
