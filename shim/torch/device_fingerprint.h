// CUDA tensors fingerprinted on the device, on torch's current stream for
// their device (the stream the op just ran on), through the shim's CUDA
// backend (opguard_fingerprint_device_async): the record carries a pending
// fingerprint until the kernel's result lands. Compiled in only when the
// torch the adapter is built against has CUDA (OPGUARD_TORCH_CUDA, set by
// shim/torch/CMakeLists.txt); otherwise device tensors stay gaps.
#pragma once

#include <ATen/ATen.h>

#include "op_record.h"
#include "opguard/shim.h"

namespace opguard::torch_adapter {

// Fills `out` (shape pointer unset) with a pending device fingerprint of `t`
// and stores its shape in `shapes`; false when this build has no device path
// or the tensor has no bytes OpGuard can read (sparse, quantized, unknown
// dtype). A failure later (no driver, CUDA graph capture) makes the record a
// gap with its reason, in the shim.
bool FingerprintDeviceTensor(const at::Tensor& t, Shapes& shapes, opguard_tensor* out,
                             Shapes::At* shape);

}  // namespace opguard::torch_adapter
