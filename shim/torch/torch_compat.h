// Every difference between the torch versions the adapter builds against
// (Debian's 1.13 and current 2.x) lives here, so the adapter reads the same on
// both.
#pragma once

#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/api/include/torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <string_view>

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

// c10d's dispatcher ops (c10d::allreduce_, ...) take the process group and
// the reduce op, and return the work, as TorchScript custom-class objects: an
// object of class __torch__.torch.classes.c10d.<Name> whose one slot is a
// capsule holding the C++ object. Null if `v` is not one of class `name`.
inline c10::intrusive_ptr<torch::CustomClassHolder> CustomClassOf(const c10::IValue& v,
                                                                  const char* name) {
  if (!v.isObject()) return {};
  const auto& object = v.toObjectRef();
  const auto& type_name = object.type()->name();
  static constexpr std::string_view kNamespace = "__torch__.torch.classes.c10d.";
  if (!type_name || type_name->name() != name ||
      std::string_view(type_name->qualifiedName()).substr(0, kNamespace.size()) != kNamespace ||
      object.slots().size() != 1 ||
      !object.getSlot(0).isCapsule()) {
    return {};
  }
  return object.getSlot(0).toCapsule();
}

// Members of a process group (0 if `v` is not one).
inline int ProcessGroupSize(const c10::IValue& v) {
  auto holder = CustomClassOf(v, "ProcessGroup");
  return holder ? static_cast<const c10d::ProcessGroup*>(holder.get())->getSize() : 0;
}

// OPGUARD_REDUCE_* numbering (0 sum, 1 prod, 2 max, 3 min, 4 avg) of a
// c10d ReduceOp; 255 for the others (bitwise, premultiplied sum) and non-ops.
inline uint8_t ReduceOpCode(const c10::IValue& v) {
  auto holder = CustomClassOf(v, "ReduceOp");
  if (!holder) return 255;
  switch (static_cast<const c10d::ReduceOp*>(holder.get())->op_) {
    case c10d::ReduceOp::SUM: return 0;
    case c10d::ReduceOp::PRODUCT: return 1;
    case c10d::ReduceOp::MAX: return 2;
    case c10d::ReduceOp::MIN: return 3;
    case c10d::ReduceOp::AVG: return 4;
    default: return 255;
  }
}

// The future a collective's work completes (on the backend's own thread,
// with the outputs final), or null if `v` is not a work or has none (gloo's
// send/recv works throw from getFuture).
inline c10::intrusive_ptr<c10::ivalue::Future> WorkFuture(const c10::IValue& v) {
  auto holder = CustomClassOf(v, "Work");
  if (!holder) return {};
  try {
    return static_cast<c10d::Work*>(holder.get())->getFuture();
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace opguard::torch_adapter
