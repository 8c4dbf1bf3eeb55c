// CUDA kernels of the fingerprint. The per-word math and the split of a
// tensor between threads are fingerprint_spec.h and fingerprint_partition.h,
// shared with the CPU path and its unit tests; this file adds the reductions
// (fixed-shape trees, so a given launch shape always rounds the fp64 stats the
// same way), the launches and the asynchronous result collection.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fingerprint_partition.h"
#include "fingerprint_spec.h"
#include "opguard/fingerprint/fingerprint_cuda.h"

namespace opguard::fingerprint::cuda {
namespace {

namespace spec = ::opguard::fingerprint::spec;

// How the statistics read a word: the element (or complex component) type.
enum Kind : uint32_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kE4M3,
  kE5M2,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kU16,
  kU32,
  kU64,
};

Kind KindOf(DType d) {
  switch (d) {
    case DType::kFloat64:
    case DType::kComplex128:
      return kF64;
    case DType::kFloat32:
    case DType::kComplex64:
      return kF32;
    case DType::kFloat16:
      return kF16;
    case DType::kBFloat16:
      return kBF16;
    case DType::kFloat8E4M3:
      return kE4M3;
    case DType::kFloat8E5M2:
      return kE5M2;
    case DType::kInt64:
      return kI64;
    case DType::kInt32:
      return kI32;
    case DType::kInt16:
      return kI16;
    case DType::kInt8:
      return kI8;
    case DType::kUInt8:
    case DType::kBool:
      return kU8;
    case DType::kUInt16:
      return kU16;
    case DType::kUInt32:
      return kU32;
    default:
      return kU64;
  }
}

__host__ __device__ constexpr bool IsFloatKind(Kind k) { return k <= kE5M2; }

template <Kind K>
struct Partial {
  spec::Lanes lanes;
  std::conditional_t<IsFloatKind(K), spec::FloatStats, spec::IntStats> stats;

  __device__ void Merge(const Partial& o) {
    lanes.a0 += o.lanes.a0;
    lanes.a1 += o.lanes.a1;
    stats.Merge(o.stats);
  }
};

// Decodes the valid bytes of one word into elements, as FingerprintHost does.
template <Kind K>
struct Visitor {
  Partial<K>* part;
  __device__ void operator()(uint64_t w, uint32_t valid) {
    auto& s = part->stats;
    if constexpr (K == kF64) {
      if (valid == 8) s.Add(__longlong_as_double(static_cast<long long>(w)));
    } else if constexpr (K == kF32) {
      for (uint32_t k = 0; k + 4 <= valid; k += 4) {
        s.Add(static_cast<double>(__uint_as_float(static_cast<uint32_t>(w >> (8 * k)))));
      }
    } else if constexpr (K == kF16 || K == kBF16) {
      for (uint32_t k = 0; k + 2 <= valid; k += 2) {
        const auto h = static_cast<uint16_t>(w >> (8 * k));
        s.Add(K == kF16 ? spec::HalfToDouble(h) : spec::BFloat16ToDouble(h));
      }
    } else if constexpr (K == kE4M3 || K == kE5M2) {
      for (uint32_t k = 0; k < valid; ++k) {
        const auto b = static_cast<uint8_t>(w >> (8 * k));
        s.Add(K == kE4M3 ? spec::Fp8E4M3ToDouble(b) : spec::Fp8E5M2ToDouble(b));
      }
    } else {
      using T = std::conditional_t<
          K == kI64, int64_t,
          std::conditional_t<
              K == kI32, int32_t,
              std::conditional_t<
                  K == kI16, int16_t,
                  std::conditional_t<
                      K == kI8, int8_t,
                      std::conditional_t<K == kU8, uint8_t,
                                         std::conditional_t<K == kU16, uint16_t,
                                                            std::conditional_t<K == kU32, uint32_t,
                                                                               uint64_t>>>>>>>;
      for (uint32_t k = 0; k + sizeof(T) <= valid; k += sizeof(T)) {
        T v;
        const uint64_t shifted = w >> (8 * k);
        memcpy(&v, &shifted, sizeof(T));
        s.Add(static_cast<__int128>(v));
      }
    }
  }
};

template <Kind K>
__device__ void WriteSlot(const Partial<K>& p, uint64_t meta_lo, uint64_t meta_hi,
                          ResultSlot* slot) {
  spec::Meta meta;
  meta.lo = meta_lo;
  meta.hi = meta_hi;
  ResultSlot r{};
  spec::Finalize(p.lanes, meta, &r.lo, &r.hi);
  if constexpr (IsFloatKind(K)) {
    r.nan_count = p.stats.nan_count;
    r.inf_count = p.stats.inf_count;
    if (p.stats.finite_count) {
      r.min = p.stats.min;
      r.max = p.stats.max;
    }
    r.sum = p.stats.sum;
    r.l2 = sqrt(p.stats.l2);
  } else if (p.stats.count) {
    r.min = spec::Int128ToDouble(p.stats.min);
    r.max = spec::Int128ToDouble(p.stats.max);
    r.sum = spec::Int128ToDouble(p.stats.sum);
  }
  *slot = r;
}

// Reads another CTA's partial through L2 (ld.cg): this SM's L1 may hold
// stale lines, and the writer's __threadfence only orders the L2 view.
template <class T>
__device__ T LoadCg(const T* p) {
  static_assert(sizeof(T) % 8 == 0);
  T v;
  auto* dst = reinterpret_cast<unsigned long long*>(&v);
  const auto* src = reinterpret_cast<const unsigned long long*>(p);
  for (size_t i = 0; i < sizeof(T) / 8; ++i) dst[i] = __ldcg(src + i);
  return v;
}

// Reduces one Partial per thread to shared[0] with a fixed tree.
template <Kind K, int kThreads>
__device__ void CtaReduce(Partial<K>* shared) {
  __syncthreads();
#pragma unroll
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) shared[threadIdx.x].Merge(shared[threadIdx.x + s]);
    __syncthreads();
  }
}

constexpr int kThreads = 256;       // single-tensor kernel
constexpr int kBatchThreads = 128;  // batched kernel: one CTA per small tensor
constexpr uint32_t kMaxCtas = 2048;

struct Workspace {
  unsigned int ticket;  // CTAs done in the current launch; reset by the last one
};

// Single tensor, whole grid: each CTA stores its partial; the last CTA to
// finish folds them in CTA order and writes the slot.
template <Kind K>
__global__ void __launch_bounds__(kThreads)
    FingerprintKernel(const uint8_t* data, uint64_t nbytes, uint64_t meta_lo, uint64_t meta_hi,
                      Partial<K>* partials, Workspace* ws, ResultSlot* slot) {
  // Raw storage: __shared__ variables cannot have constructors.
  __shared__ __align__(16) unsigned char raw[sizeof(Partial<K>) * kThreads];
  __shared__ bool last;
  auto* shared = reinterpret_cast<Partial<K>*>(raw);
  Partial<K> mine{};
  Visitor<K> visit{&mine};
  const uint64_t warps = gridDim.x * (kThreads / spec::kWarpSize);
  const uint64_t warp = blockIdx.x * (kThreads / spec::kWarpSize) + threadIdx.x / spec::kWarpSize;
  spec::ThreadWork(data, nbytes, warp, warps, threadIdx.x % spec::kWarpSize, mine.lanes, visit);
  shared[threadIdx.x] = mine;
  CtaReduce<K, kThreads>(shared);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = shared[0];
    __threadfence();
    last = atomicAdd(&ws->ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Partial<K> fold{};
  for (uint32_t c = threadIdx.x; c < gridDim.x; c += kThreads) {
    fold.Merge(LoadCg(&partials[c]));
  }
  shared[threadIdx.x] = fold;
  CtaReduce<K, kThreads>(shared);
  if (threadIdx.x == 0) {
    WriteSlot(shared[0], meta_lo, meta_hi, slot);
    ws->ticket = 0;  // stream order makes the next launch see 0
  }
}

struct BatchItem {
  const uint8_t* data;
  uint64_t nbytes;
  uint64_t meta_lo;
  uint64_t meta_hi;
  ResultSlot* slot;
  uint32_t kind;
};

template <Kind K>
__device__ void BatchOne(const BatchItem& item, void* smem) {
  auto* shared = static_cast<Partial<K>*>(smem);
  Partial<K> mine{};
  Visitor<K> visit{&mine};
  spec::ThreadWork(item.data, item.nbytes, threadIdx.x / spec::kWarpSize,
                   kBatchThreads / spec::kWarpSize, threadIdx.x % spec::kWarpSize, mine.lanes,
                   visit);
  shared[threadIdx.x] = mine;
  CtaReduce<K, kBatchThreads>(shared);
  if (threadIdx.x == 0) WriteSlot(shared[0], item.meta_lo, item.meta_hi, item.slot);
}

constexpr size_t kBatchShared =
    kBatchThreads * std::max(sizeof(Partial<kF64>), sizeof(Partial<kI64>));

__global__ void __launch_bounds__(kBatchThreads) BatchKernel(const BatchItem* items) {
  __shared__ __align__(16) unsigned char smem[kBatchShared];
  const BatchItem item = items[blockIdx.x];
  switch (item.kind) {
    case kF64:
      BatchOne<kF64>(item, smem);
      break;
    case kF32:
      BatchOne<kF32>(item, smem);
      break;
    case kF16:
      BatchOne<kF16>(item, smem);
      break;
    case kBF16:
      BatchOne<kBF16>(item, smem);
      break;
    case kE4M3:
      BatchOne<kE4M3>(item, smem);
      break;
    case kE5M2:
      BatchOne<kE5M2>(item, smem);
      break;
    case kI64:
      BatchOne<kI64>(item, smem);
      break;
    case kI32:
      BatchOne<kI32>(item, smem);
      break;
    case kI16:
      BatchOne<kI16>(item, smem);
      break;
    case kI8:
      BatchOne<kI8>(item, smem);
      break;
    case kU8:
      BatchOne<kU8>(item, smem);
      break;
    case kU16:
      BatchOne<kU16>(item, smem);
      break;
    case kU32:
      BatchOne<kU32>(item, smem);
      break;
    default:
      BatchOne<kU64>(item, smem);
      break;
  }
}

bool Contiguous(const TensorView& t) {
  if (t.strides.empty()) return true;
  int64_t expected = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] == 0) return true;
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

template <Kind K>
cudaError_t LaunchOne(const uint8_t* data, uint64_t nbytes, const MetaKey& meta, void* partials,
                      Workspace* ws, ResultSlot* slot, uint32_t sms, cudaStream_t stream) {
  const bool aligned16 = reinterpret_cast<uintptr_t>(data) % 16 == 0;
  constexpr uint64_t kWarpsPerCta = kThreads / spec::kWarpSize;
  // Enough warps for every full block (or every word on the byte path),
  // capped at a few waves of CTAs: the grid-stride loops do the rest.
  const uint64_t units =
      aligned16 ? nbytes / spec::kBlockBytes + 1 : (nbytes / 8) / spec::kWarpSize + 1;
  uint64_t ctas = (units + kWarpsPerCta - 1) / kWarpsPerCta;
  ctas = std::min<uint64_t>({ctas, uint64_t{sms} * 8, kMaxCtas});
  FingerprintKernel<K><<<static_cast<unsigned>(std::max<uint64_t>(ctas, 1)), kThreads, 0, stream>>>(
      data, nbytes, meta.lo, meta.hi, static_cast<Partial<K>*>(partials), ws, slot);
  return cudaGetLastError();
}

}  // namespace

struct Fingerprinter::Impl {
  void* partials = nullptr;  // kMaxCtas partials of the largest kind
  Workspace* ws = nullptr;
  BatchItem* device_items = nullptr;
  BatchItem* staging = nullptr;  // pinned
  cudaEvent_t staged = nullptr;  // the last upload of `staging` has completed
  uint32_t max_batch = 0;
  uint32_t sms = 0;
};

std::unique_ptr<Fingerprinter> Fingerprinter::Create(cudaError_t* error, uint32_t max_batch) {
  std::unique_ptr<Fingerprinter> f(new Fingerprinter());
  f->impl_ = new Impl();
  Impl& m = *f->impl_;
  m.max_batch = std::max<uint32_t>(max_batch, 1);
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const size_t partial_bytes = std::max(sizeof(Partial<kF64>), sizeof(Partial<kI64>));
  if (e == cudaSuccess) e = cudaMalloc(&m.partials, partial_bytes * kMaxCtas);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&m.ws), sizeof(Workspace));
  if (e == cudaSuccess) e = cudaMemset(m.ws, 0, sizeof(Workspace));
  if (e == cudaSuccess) {
    e = cudaMalloc(reinterpret_cast<void**>(&m.device_items), sizeof(BatchItem) * m.max_batch);
  }
  if (e == cudaSuccess) {
    e = cudaMallocHost(reinterpret_cast<void**>(&m.staging), sizeof(BatchItem) * m.max_batch);
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m.staged, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();  // the memset above, once, at setup
  m.sms = static_cast<uint32_t>(std::max(sms, 1));
  if (error) *error = e;
  if (e != cudaSuccess) return nullptr;
  return f;
}

Fingerprinter::~Fingerprinter() {
  if (!impl_) return;
  cudaFree(impl_->partials);
  cudaFree(impl_->ws);
  cudaFree(impl_->device_items);
  cudaFreeHost(impl_->staging);
  if (impl_->staged) cudaEventDestroy(impl_->staged);
  delete impl_;
}

cudaError_t Fingerprinter::Enqueue(const TensorView& tensor, ResultSlot* slot,
                                   cudaStream_t stream) {
  if (!ValidateView(tensor).empty() || !Contiguous(tensor) || slot == nullptr) {
    return cudaErrorInvalidValue;
  }
  const auto* data = static_cast<const uint8_t*>(tensor.data);
  const uint64_t nbytes =
      static_cast<uint64_t>(NumElements(tensor.shape)) * DTypeSize(tensor.dtype);
  const MetaKey meta = ComputeMeta(tensor.dtype, tensor.shape);
  Impl& m = *impl_;
  switch (KindOf(tensor.dtype)) {
#define OPGUARD_FP_CASE(k) \
  case k:                  \
    return LaunchOne<k>(data, nbytes, meta, m.partials, m.ws, slot, m.sms, stream);
    OPGUARD_FP_CASE(kF64)
    OPGUARD_FP_CASE(kF32) OPGUARD_FP_CASE(kF16) OPGUARD_FP_CASE(kBF16) OPGUARD_FP_CASE(kE4M3)
        OPGUARD_FP_CASE(kE5M2) OPGUARD_FP_CASE(kI64) OPGUARD_FP_CASE(kI32) OPGUARD_FP_CASE(kI16)
            OPGUARD_FP_CASE(kI8) OPGUARD_FP_CASE(kU8) OPGUARD_FP_CASE(kU16) OPGUARD_FP_CASE(kU32)
                OPGUARD_FP_CASE(kU64)
#undef OPGUARD_FP_CASE
  }
  return cudaErrorInvalidValue;
}

cudaError_t Fingerprinter::EnqueueBatch(std::span<const TensorView> tensors, ResultSlot* slots,
                                        cudaStream_t stream) {
  Impl& m = *impl_;
  if (tensors.size() > m.max_batch || (slots == nullptr && !tensors.empty())) {
    return cudaErrorInvalidValue;
  }
  for (const auto& t : tensors) {
    if (!ValidateView(t).empty() || !Contiguous(t)) return cudaErrorInvalidValue;
  }
  // The previous batch's upload must be done before `staging` is rewritten.
  cudaError_t e = cudaEventSynchronize(m.staged);
  if (e != cudaSuccess) return e;
  uint32_t n = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    const uint64_t nbytes = static_cast<uint64_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
    if (nbytes > kBatchMaxBytes) {
      if ((e = Enqueue(t, slots + i, stream)) != cudaSuccess) return e;
      continue;
    }
    const MetaKey meta = ComputeMeta(t.dtype, t.shape);
    m.staging[n++] = {
        static_cast<const uint8_t*>(t.data), nbytes, meta.lo, meta.hi, slots + i, KindOf(t.dtype)};
  }
  if (n == 0) return cudaSuccess;
  e = cudaMemcpyAsync(m.device_items, m.staging, sizeof(BatchItem) * n, cudaMemcpyHostToDevice,
                      stream);
  if (e == cudaSuccess) e = cudaEventRecord(m.staged, stream);
  if (e != cudaSuccess) return e;
  BatchKernel<<<n, kBatchThreads, 0, stream>>>(m.device_items);
  return cudaGetLastError();
}

std::unique_ptr<ResultCollector> ResultCollector::Create(cudaError_t* error, size_t capacity) {
  std::unique_ptr<ResultCollector> c(new ResultCollector());
  c->capacity_ = std::max<size_t>(capacity, 1);
  cudaError_t e =
      cudaMallocHost(reinterpret_cast<void**>(&c->host_), sizeof(ResultSlot) * c->capacity_);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->done_, cudaEventDisableTiming);
  if (error) *error = e;
  if (e != cudaSuccess) return nullptr;
  return c;
}

ResultCollector::~ResultCollector() {
  if (host_) cudaFreeHost(host_);
  if (done_) cudaEventDestroy(done_);
}

cudaError_t ResultCollector::Collect(const ResultSlot* device_slots, size_t count,
                                     cudaStream_t stream) {
  if (count > capacity_) return cudaErrorInvalidValue;
  count_ = count;
  cudaError_t e = cudaMemcpyAsync(host_, device_slots, sizeof(ResultSlot) * count,
                                  cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaEventRecord(done_, stream);
  return e;
}

bool ResultCollector::Ready() const { return cudaEventQuery(done_) == cudaSuccess; }

cudaError_t ResultCollector::Query() const { return cudaEventQuery(done_); }

cudaError_t ResultCollector::Wait() const { return cudaEventSynchronize(done_); }

std::span<const ResultSlot> ResultCollector::results() const { return {host_, count_}; }

}  // namespace opguard::fingerprint::cuda
