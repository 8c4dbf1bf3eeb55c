#include "tensor_fingerprint.h"

#include <algorithm>
#include <immintrin.h>

#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "adapter_state.h"
#include "async_fingerprints.h"
#include "device_fingerprint.h"
#include "intra_op_pool.h"
#include "torch_compat.h"

namespace opguard::torch_adapter {
namespace {

// Copies `count` elements of `T` that lie `stride` elements apart.
template <typename T>
inline void CopyStrided(uint8_t* out, const uint8_t* src, int64_t count, int64_t stride) {
  for (int64_t i = 0; i < count; ++i, src += stride * static_cast<int64_t>(sizeof(T))) {
    T v;
    std::memcpy(&v, src, sizeof(T));
    std::memcpy(out + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
  }
}

// Copies a `rows` x `cols` plane of `T` whose rows lie 1 element apart and
// columns `col_stride` elements apart (a transposed matrix: a weight's
// `t()` in every Linear's backward) into `out` row by row, in square blocks:
// reading a row walks across columns, each in another cache line, and a
// block's lines are all reused for its next rows while still in L1.
template <typename T>
void CopyTransposed(uint8_t* out, const uint8_t* src, int64_t rows, int64_t cols,
                    int64_t col_stride) {
  constexpr int64_t kBlock = 16;
  constexpr auto kSize = static_cast<int64_t>(sizeof(T));
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          T v;
          std::memcpy(&v, src + (r + c * col_stride) * kSize, sizeof(T));
          std::memcpy(out + (r * cols + c) * kSize, &v, sizeof(T));
        }
      }
    }
  }
}

// CopyTransposed for one 8x8 block of 4-byte elements: eight column loads
// transposed in registers into eight row stores (shuffles move bits, never
// interpret them as floats). `col_bytes`, `row_bytes`: the source's column
// and the output's row pitch.
__attribute__((target("avx2"))) void Transpose8x8(const uint8_t* src, int64_t col_bytes,
                                                  uint8_t* out, int64_t row_bytes) {
  __m256 c0 = _mm256_loadu_ps(reinterpret_cast<const float*>(src));
  __m256 c1 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + col_bytes));
  __m256 c2 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 2 * col_bytes));
  __m256 c3 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 3 * col_bytes));
  __m256 c4 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 4 * col_bytes));
  __m256 c5 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 5 * col_bytes));
  __m256 c6 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 6 * col_bytes));
  __m256 c7 = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 7 * col_bytes));
  const __m256 t0 = _mm256_unpacklo_ps(c0, c1), t1 = _mm256_unpackhi_ps(c0, c1);
  const __m256 t2 = _mm256_unpacklo_ps(c2, c3), t3 = _mm256_unpackhi_ps(c2, c3);
  const __m256 t4 = _mm256_unpacklo_ps(c4, c5), t5 = _mm256_unpackhi_ps(c4, c5);
  const __m256 t6 = _mm256_unpacklo_ps(c6, c7), t7 = _mm256_unpackhi_ps(c6, c7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 0 * row_bytes), _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 1 * row_bytes), _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 2 * row_bytes), _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 3 * row_bytes), _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 4 * row_bytes), _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 5 * row_bytes), _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 6 * row_bytes), _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 7 * row_bytes), _mm256_permute2f128_ps(u3, u7, 0x31));
}

// CopyTransposed<uint32_t> (float32, int32: most tensors), the whole 8x8
// blocks in AVX2 registers where the CPU has AVX2, the edges element by
// element.
void CopyTransposed4(uint8_t* out, const uint8_t* src, int64_t rows, int64_t cols,
                     int64_t col_stride) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (!avx2 || rows < 8 || cols < 8) {
    CopyTransposed<uint32_t>(out, src, rows, cols, col_stride);
    return;
  }
  const int64_t full_rows = rows / 8 * 8, full_cols = cols / 8 * 8;
  for (int64_t r0 = 0; r0 < full_rows; r0 += 8) {
    for (int64_t c0 = 0; c0 < full_cols; c0 += 8) {
      Transpose8x8(src + (r0 + c0 * col_stride) * 4, col_stride * 4, out + (r0 * cols + c0) * 4,
                   cols * 4);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    // The columns right of the blocks in every row, all columns in the rows below them.
    for (int64_t c = r < full_rows ? full_cols : 0; c < cols; ++c) {
      std::memcpy(out + (r * cols + c) * 4, src + (r + c * col_stride) * 4, 4);
    }
  }
}

using Dims = c10::SmallVector<int64_t, 8>;

// Steps the index `index` of dimensions [0, dims) to the next one in
// row-major order, and `offset` (in elements) with it.
inline void NextIndex(Dims& index, int64_t& offset, const Dims& size, const Dims& stride,
                      size_t dims) {
  for (size_t d = dims; d-- > 0;) {
    offset += stride[d];
    if (++index[d] < size[d]) return;
    offset -= stride[d] * size[d];
    index[d] = 0;
  }
}

// Copies the elements of a strided tensor into `buf` in logical (row-major)
// order. False (nothing copied) above kMaxGatherBytes: the fingerprint then
// reads the strided tensor itself.
//
// Dimensions of size 1 are dropped and neighbours that are contiguous with
// each other merged first, so that a transposed view walks as few rows as
// its layout allows; a transposed plane is copied in blocks, other rows
// whose elements lie apart by element size (views of weights and attention
// heads: most strided tensors here).
constexpr size_t kMaxGatherBytes = 1u << 20;
bool GatherLogical(const void* data, size_t element_size, at::IntArrayRef sizes,
                   at::IntArrayRef strides, std::vector<uint8_t>& buf) {
  size_t numel = 1;
  for (int64_t d : sizes) numel *= static_cast<size_t>(d);
  if (sizes.empty() || numel == 0 || numel * element_size > kMaxGatherBytes) return false;
  Dims size, stride;  // collapsed, outermost first
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (!size.empty() && stride.back() == strides[d] * sizes[d]) {
      size.back() *= sizes[d];
      stride.back() = strides[d];
    } else {
      size.push_back(sizes[d]);
      stride.push_back(strides[d]);
    }
  }
  if (size.empty()) {  // a single element
    size.push_back(1);
    stride.push_back(1);
  }
  buf.resize(numel * element_size);
  const size_t ndim = size.size();
  const auto* base = static_cast<const uint8_t*>(data);
  uint8_t* out = buf.data();
  const int64_t inner = size[ndim - 1];
  const int64_t inner_stride = stride[ndim - 1];
  const size_t row_bytes = static_cast<size_t>(inner) * element_size;
  // The last two dimensions transposed (the one before the last is the
  // contiguous one): plane by plane, in blocks.
  if (ndim >= 2 && stride[ndim - 2] == 1 && inner_stride != 1 &&
      (element_size == 1 || element_size == 2 || element_size == 4 || element_size == 8)) {
    const int64_t rows = size[ndim - 2];
    const size_t plane_bytes = static_cast<size_t>(rows) * row_bytes;
    Dims plane(ndim - 2, 0);
    int64_t plane_offset = 0;  // in elements, of plane[0 .. ndim-3]
    for (size_t done = 0; done < numel; done += static_cast<size_t>(rows * inner),
                out += plane_bytes) {
      const uint8_t* src = base + plane_offset * static_cast<int64_t>(element_size);
      switch (element_size) {
        case 1: CopyTransposed<uint8_t>(out, src, rows, inner, inner_stride); break;
        case 2: CopyTransposed<uint16_t>(out, src, rows, inner, inner_stride); break;
        case 4: CopyTransposed4(out, src, rows, inner, inner_stride); break;
        default: CopyTransposed<uint64_t>(out, src, rows, inner, inner_stride); break;
      }
      NextIndex(plane, plane_offset, size, stride, ndim - 2);
    }
    return true;
  }
  Dims index(ndim, 0);
  int64_t row_offset = 0;  // in elements, of index[0 .. ndim-2]
  for (size_t done = 0; done < numel; done += static_cast<size_t>(inner), out += row_bytes) {
    const uint8_t* src = base + row_offset * static_cast<int64_t>(element_size);
    if (inner_stride == 1) {
      std::memcpy(out, src, row_bytes);
    } else {
      switch (element_size) {
        case 1: CopyStrided<uint8_t>(out, src, inner, inner_stride); break;
        case 2: CopyStrided<uint16_t>(out, src, inner, inner_stride); break;
        case 4: CopyStrided<uint32_t>(out, src, inner, inner_stride); break;
        case 8: CopyStrided<uint64_t>(out, src, inner, inner_stride); break;
        default:
          for (int64_t i = 0; i < inner; ++i) {
            std::memcpy(out + i * static_cast<int64_t>(element_size),
                        src + i * inner_stride * static_cast<int64_t>(element_size), element_size);
          }
      }
    }
    NextIndex(index, row_offset, size, stride, ndim - 1);
  }
  return true;
}

}  // namespace

bool DescribeTensor(const at::Tensor& t, Shapes& shapes, opguard_tensor* out, Shapes::At* shape) {
  std::memset(out, 0, sizeof(*out));
  if (!t.defined() || HoldsNoData(t)) return false;
  out->dtype = ToOpGuardDType(t.scalar_type());
  if (out->dtype == OPGUARD_DTYPE_UNKNOWN) return false;
  *shape = shapes.Add(t.sizes());
  out->ndim = static_cast<uint32_t>(t.dim());
  out->device = t.is_cuda() ? static_cast<int16_t>(t.get_device()) : int16_t{-1};
  return true;
}

bool FingerprintTensor(const at::Tensor& t, ThreadState& ts, Shapes& shapes, opguard_tensor* out,
                       Shapes::At* shape, uint64_t cached_since, bool may_defer) {
  std::memset(out, 0, sizeof(*out));
  if (HoldsNoData(t)) return false;
  if (t.defined() && t.is_cuda()) return FingerprintDeviceTensor(t, shapes, out, shape);
  if (!t.defined() || !t.device().is_cpu() || t.is_sparse() || t.is_quantized() ||
      t.is_mkldnn() || !t.has_storage()) {
    return false;
  }
  uint8_t dtype = ToOpGuardDType(t.scalar_type());
  if (dtype == OPGUARD_DTYPE_UNKNOWN) return false;
  at::IntArrayRef sizes = t.sizes();
  at::IntArrayRef strides = t.strides();
  *shape = shapes.Add(sizes);
  const void* data = t.numel() == 0 ? nullptr : t.data_ptr();
  if (data == nullptr && t.numel() != 0) return false;  // a wrapper subclass: no bytes of its own
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();

  size_t layout_hash = sizes.size();
  for (size_t i = 0; i < sizes.size(); ++i) {
    layout_hash = layout_hash * 1000003u ^ static_cast<size_t>(sizes[i]);
    layout_hash = layout_hash * 1000003u ^ static_cast<size_t>(strides[i]);
  }
  // A contiguous tensor's entry serves every shape of its bytes: a reshape
  // or view of it (view, reshape, flatten, squeeze, ...) is finalized from
  // the cached byte sums without reading the bytes (docs/fingerprint.md).
  const bool contiguous = t.is_contiguous();
  const uint32_t ndim = static_cast<uint32_t>(sizes.size());
  FingerprintCache::Key key{data, TensorVersion(t), dtype, contiguous,
                            contiguous ? t.numel() * t.element_size() : layout_hash};
  if (ts.collective_writes_seen != g_collective_writes->Count()) {
    g_collective_writes->Apply(ts.collective_writes_seen, ts.cache, ts.uninitialised);
  }
  // Memory an op handed out uninitialised (aten::empty) is often filled
  // without an op or a version bump (torch.LongTensor([n]) writes it in C++):
  // its fingerprint is never cached, so a later read hashes what is there
  // rather than the garbage seen at allocation. Nor is that of a storage with
  // views whose version counters are their own (ThreadState::unversioned_views).
  const bool cacheable =
      data != nullptr && !ts.uninitialised.Contains(t) && !ts.unversioned_views.Contains(t);
  if (cacheable && cached_since != kHashBytes) {
    const auto* hit = ts.cache.Find(key, storage, cached_since);
    if (hit != nullptr && hit->pending && hit->layout_hash != layout_hash) hit = nullptr;
    if (hit != nullptr) {
      if (hit->layout_hash == layout_hash) {
        out->fp_lo = hit->lo;
        out->fp_hi = hit->hi;
      } else if (opguard_fingerprint_reshape(&hit->sums, dtype, sizes.data(), ndim, out) !=
                 OPGUARD_OK) {
        return false;
      }
      out->stats = hit->stats;
      out->has_stats = hit->has_stats;
      out->dtype = dtype;
      out->device = -1;
      out->ndim = ndim;
      return true;
    }
  }
  // A large output is hashed on the shim's fingerprint thread; the record
  // carries a pending fingerprint until then (async_fingerprints.h says why
  // the bytes it reads are the op's).
  const uint64_t min_async = AsyncMinBytes();
  if (may_defer && cacheable && contiguous && min_async != 0 &&
      static_cast<uint64_t>(t.numel()) * t.element_size() >= min_async &&
      SubmitHostFingerprint(t, dtype, sizes.data(), ndim, out)) {
    ts.cache.Put(key, FingerprintCache::Value{t.storage().getWeakStorageImpl(), out->fp_lo,
                                              out->fp_hi, {}, out->has_stats, {}, layout_hash,
                                              /*pending=*/true});
    out->shape = nullptr;
    return true;
  }
  // A strided tensor is fingerprinted in logical order, as its contiguous
  // copy would be (docs/fingerprint.md): small ones are gathered here into a
  // per-thread buffer, which spares the fingerprint's own gather its 64 KiB
  // tile buffer per call.
  const void* bytes = data;
  const int64_t* fp_strides = nullptr;
  if (data != nullptr && !contiguous) {
    if (!GatherLogical(data, t.element_size(), sizes, strides, ts.gather)) {
      fp_strides = strides.data();
    } else {
      bytes = ts.gather.data();
    }
  }
  opguard_byte_sums sums{};
  // On the training thread a large tensor is hashed on torch's intra-op pool
  // too (intra_op_pool.h); other threads (gloo's, the autograd engine's
  // device threads) would each start an OpenMP team of their own.
  static const bool pool_supported = opguard_api_version() >= 5;
  const int shares = pool_supported && std::this_thread::get_id() == g_adapter.main_thread
                         ? IntraOpShares(static_cast<uint64_t>(t.numel()) * t.element_size())
                         : 1;
  const int rc = shares > 1 ? opguard_fingerprint_host_parallel(bytes, dtype, sizes.data(), ndim,
                                                                fp_strides, shares,
                                                                &RunOnIntraOpPool, nullptr, out,
                                                                &sums)
                            : opguard_fingerprint_host_sums(bytes, dtype, sizes.data(), ndim,
                                                            fp_strides, out, &sums);
  if (rc != OPGUARD_OK) return false;
  if (cacheable) {
    ts.cache.Put(key, FingerprintCache::Value{t.storage().getWeakStorageImpl(), out->fp_lo,
                                              out->fp_hi, out->stats, out->has_stats, sums,
                                              layout_hash});
  }
  out->shape = nullptr;  // the record points at `shapes` once complete
  return true;
}

// Scalars are recorded as their raw bits (a Python float is a double).
bool ScalarValue(const c10::IValue& v, opguard_value* out) {
  uint64_t bits = 0;
  if (v.isDouble()) {
    double d = v.toDouble();
    std::memcpy(&bits, &d, sizeof(d));
    out->scalar_dtype = OPGUARD_DTYPE_FLOAT64;
  } else if (v.isInt()) {
    int64_t i = v.toInt();
    std::memcpy(&bits, &i, sizeof(i));
    out->scalar_dtype = OPGUARD_DTYPE_INT64;
  } else if (v.isBool()) {
    bits = v.toBool() ? 1 : 0;
    out->scalar_dtype = OPGUARD_DTYPE_BOOL;
  } else {
    return false;
  }
  out->kind = OPGUARD_VALUE_SCALAR;
  out->scalar_bits = bits;
  return true;
}

bool FingerprintAll(at::TensorList tensors, OpContext& ctx, ThreadState& ts) {
  for (const at::Tensor& t : tensors) {
    opguard_tensor out;
    Shapes::At shape;
    if (!FingerprintTensor(t, ts, ctx.shapes, &out, &shape, kHashBytes)) return false;
    // A receiving rank's broadcast buffer, fresh from torch.empty: its bytes
    // at launch are garbage, never evidence.
    if (ts.uninitialised.Contains(t)) ctx.uninitialised_output = true;
    ctx.outputs.Add(out, shape);
  }
  return true;
}

// Their bytes differ from run to run by definition. They are recorded (shapes
// and order still anchor the alignment's structure) but flagged so that their
// fingerprints are never used as evidence of a divergence.
bool HasUninitialisedOutput(const char* name) {
  static constexpr std::string_view kNames[] = {
      "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
      "aten::new_empty_strided", "aten::resize_", "aten::resize_as_"};
  for (std::string_view candidate : kNames) {
    if (candidate == name) return true;
  }
  return false;
}

void ForgetTensors(const c10::IValue& v, ThreadState& ts) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.has_storage()) ts.cache.StorageWritten(t.storage().unsafeGetStorageImpl());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) ForgetTensors(e, ts);
  }
}

}  // namespace opguard::torch_adapter
