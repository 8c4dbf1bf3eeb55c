// The OpGuard tensor fingerprint: a 128-bit, position-sensitive digest of a
// tensor's logical bytes, with its dtype and shape mixed in, plus secondary
// statistics computed in the same pass. Specified in docs/fingerprint.md; the
// CPU path here and the CUDA kernels (fingerprint_cuda.h) return identical
// bits for identical input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace opguard::fingerprint {

// Numbering matches opguard.wire.DType (idl/common.fbs); keep them in step.
// clang-format off
enum class DType : uint8_t {
  kUnknown = 0,
  kFloat64, kFloat32, kFloat16, kBFloat16, kFloat8E4M3, kFloat8E5M2,
  kInt64, kInt32, kInt16, kInt8, kUInt8, kBool,
  kUInt16, kUInt32, kUInt64, kComplex64, kComplex128,
};
// clang-format on

// Bytes per element; 0 for kUnknown.
size_t DTypeSize(DType dtype);
bool IsFloating(DType dtype);
// Canonical name ("float32", "bfloat16", "float8_e4m3fn", ...).
std::string_view DTypeName(DType dtype);
// Accepts canonical names and common aliases (fp32, f32, bf16, half, fp8_e5m2, ...).
bool ParseDType(std::string_view text, DType* out);

struct Digest {
  uint64_t lo = 0;  // digest bytes 0..7, little-endian
  uint64_t hi = 0;  // digest bytes 8..15, little-endian
  bool operator==(const Digest&) const = default;
  // 32 lower-case hex digits: the 16 digest bytes in order.
  std::string Hex() const;
};

// Secondary statistics (the digest alone decides equality). Floating dtypes:
// all fields, accumulated in fp64 over finite values; integer/bool: min, max
// and sum only. Empty tensors: counts 0, min/max/sum/l2 0.
struct Stats {
  uint64_t nan_count = 0;
  uint64_t inf_count = 0;
  double min = 0;
  double max = 0;
  double sum = 0;
  double l2 = 0;
};

struct Fingerprint {
  Digest digest;
  Stats stats;
};

// A tensor as the fingerprint sees it: element type, logical shape and, for
// non-contiguous tensors, strides in elements (empty = C-contiguous).
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kUnknown;
  std::span<const int64_t> shape;
  std::span<const int64_t> strides;
};

// The two 64-bit sums over a tensor's logical byte stream, before Finalize
// mixes in the dtype and shape: a tensor with the same bytes under another
// shape of the same dtype (a reshape or view of a contiguous tensor) has the
// same sums and statistics, so its digest is Refinalize(sums, dtype, shape)
// without reading the bytes again.
struct ByteSums {
  uint64_t a0 = 0;
  uint64_t a1 = 0;
};

// CPU path. `threads` = 1 runs on the calling thread only; 0 uses the
// hardware concurrency. The result does not depend on `threads`.
// Precondition: ValidateView(tensor) is ok; an invalid view yields a
// Fingerprint{} (all-zero digest) instead of crashing. `sums` (may be null)
// receives the byte sums.
Fingerprint FingerprintHost(const TensorView& tensor, int threads = 1, ByteSums* sums = nullptr);

// ---- additions (beyond the original contract) --------------------------------

// A caller's thread pool: runs task(0) .. task(tasks - 1), in any order and
// on any of its threads, and returns once all have returned. (The PyTorch
// adapter passes torch's intra-op pool, whose threads are idle while the
// training thread fingerprints.)
using ParallelFor = std::function<void(int tasks, const std::function<void(int)>& task)>;

// FingerprintHost with the tensor split into at most `tasks` shares run by
// `run` instead of threads of its own; the same result as FingerprintHost.
Fingerprint FingerprintHostOn(const TensorView& tensor, int tasks, const ParallelFor& run,
                              ByteSums* sums = nullptr);

// The digest alone, skipping the statistics (about twice as fast for
// floating tensors). Equal to FingerprintHost(tensor, threads).digest.
Digest DigestHost(const TensorView& tensor, int threads = 1);

// Element count of `shape` (1 for rank 0); -1 if a dimension is negative or
// the product overflows int64.
int64_t NumElements(std::span<const int64_t> shape);

// Empty string when `tensor` can be fingerprinted (known dtype, non-negative
// dims, strides empty or of the same rank, data non-null unless empty);
// otherwise a one-line reason.
std::string ValidateView(const TensorView& tensor);

// The digest of bytes with `sums` as a tensor of `dtype` and `shape`.
Digest Refinalize(const ByteSums& sums, DType dtype, std::span<const int64_t> shape);

// The 128-bit metadata term (dtype, shape, byte length) that Finalize mixes
// into the lane sums. Exposed so the CUDA launcher computes it on the host.
struct MetaKey {
  uint64_t lo = 0;
  uint64_t hi = 0;
};
MetaKey ComputeMeta(DType dtype, std::span<const int64_t> shape);

}  // namespace opguard::fingerprint
