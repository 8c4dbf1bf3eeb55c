// Every difference between the torch versions the adapter builds against
// (Debian's 1.13 and current 2.x) lives here, so adapter.cc reads the same on
// both.
#pragma once

#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/api/include/torch/version.h>

#include <cstdint>

#include "opguard/shim.h"

namespace opguard::torch_adapter {

#define OPGUARD_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||          \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// OPGUARD_DTYPE_* for an ATen scalar type; OPGUARD_DTYPE_UNKNOWN if OpGuard
// has no fingerprint definition for it (quantized types, for example).
inline uint8_t ToOpGuardDType(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return OPGUARD_DTYPE_FLOAT64;
    case at::kFloat: return OPGUARD_DTYPE_FLOAT32;
    case at::kHalf: return OPGUARD_DTYPE_FLOAT16;
    case at::kBFloat16: return OPGUARD_DTYPE_BFLOAT16;
    case at::kLong: return OPGUARD_DTYPE_INT64;
    case at::kInt: return OPGUARD_DTYPE_INT32;
    case at::kShort: return OPGUARD_DTYPE_INT16;
    case at::kChar: return OPGUARD_DTYPE_INT8;
    case at::kByte: return OPGUARD_DTYPE_UINT8;
    case at::kBool: return OPGUARD_DTYPE_BOOL;
    case at::kComplexFloat: return OPGUARD_DTYPE_COMPLEX64;
    case at::kComplexDouble: return OPGUARD_DTYPE_COMPLEX128;
#if OPGUARD_TORCH_AT_LEAST(2, 1)
    case at::kFloat8_e4m3fn: return OPGUARD_DTYPE_FLOAT8_E4M3;
    case at::kFloat8_e5m2: return OPGUARD_DTYPE_FLOAT8_E5M2;
#endif
#if OPGUARD_TORCH_AT_LEAST(2, 3)
    case at::kUInt16: return OPGUARD_DTYPE_UINT16;
    case at::kUInt32: return OPGUARD_DTYPE_UINT32;
    case at::kUInt64: return OPGUARD_DTYPE_UINT64;
#endif
    default: return OPGUARD_DTYPE_UNKNOWN;
  }
}

// The autograd sequence number the next autograd node created on this thread
// will get.
inline int64_t PeekSequenceNumber() { return static_cast<int64_t>(at::sequence_number::peek()); }

// Version counter of a tensor (bumped by every in-place write).
inline uint32_t TensorVersion(const at::Tensor& t) {
  return static_cast<uint32_t>(t.unsafeGetTensorImpl()->version_counter().current_version());
}

}  // namespace opguard::torch_adapter
