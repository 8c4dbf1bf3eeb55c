// CUDA tensors fingerprinted on the device, on torch's current stream for
// their device (the stream the op just ran on), through the shim's CUDA
// backend (opguard_fingerprint_device_async): the record carries a pending
// fingerprint until the kernel's result lands. Compiled in only when the
// torch the adapter is built against has CUDA (OPGUARD_TORCH_CUDA, set by
// shim/torch/CMakeLists.txt); otherwise device tensors stay gaps.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

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

// A collective's outputs are fingerprinted on a stream ordered after its
// work, without a host wait: while this lives, the current stream of the
// device of `outputs` is a stream from torch's pool that waits, on the
// device, for the events of the work's completed future (a CUDA future:
// NCCL's works, gloo's on CUDA tensors), so FingerprintDeviceTensor enqueues
// behind the collective. The training thread's own streams are left alone
// (a wait there would serialise DDP's compute with its communication). At
// the end the outputs' memory is marked in use by that stream, so the
// caching allocator cannot hand it out before the fingerprints have read
// it. Does nothing for a future without device events (CPU tensors) and in
// a build without the device path.
class FingerprintFence;

class StreamAfterWork {
 public:
  StreamAfterWork(c10::ivalue::Future* completed_future, const std::vector<at::Tensor>& outputs);
  ~StreamAfterWork();
  StreamAfterWork(const StreamAfterWork&) = delete;
  StreamAfterWork& operator=(const StreamAfterWork&) = delete;

  // Whether the outputs are fingerprinted on a stream of OpGuard's.
  bool active() const { return active_; }
  // After the fingerprints were enqueued: a fence behind them on that
  // stream (null when not active).
  std::shared_ptr<FingerprintFence> Fence();

 private:
  const std::vector<at::Tensor>& outputs_;
  bool active_ = false;
#if defined(OPGUARD_TORCH_CUDA)
  struct Guard;
  Guard* guard_ = nullptr;
#endif
};

// The point on OpGuard's stream after a collective's output fingerprints.
// An op that writes the output later must not run before them: such an op
// waits for the work's events, which say nothing of OpGuard's stream, so
// the op observer makes it wait for this too (collectives.cc).
class FingerprintFence {
 public:
  virtual ~FingerprintFence() = default;
  // The fingerprints have run (never blocks).
  virtual bool Passed() const = 0;
  // The current stream of the fence's device waits for it, on the device.
  virtual void OrderCurrentStreamAfter() const = 0;
};

}  // namespace opguard::torch_adapter
