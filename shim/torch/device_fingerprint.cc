#include "device_fingerprint.h"

#include <ATen/record_function.h>

#include "torch_compat.h"

#if defined(OPGUARD_TORCH_CUDA)
// Device-generic guard and event (through the CUDA guard implementation
// libc10_cuda registers): no CUDA runtime call is compiled into the adapter,
// which therefore needs no libcudart of its own.
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace opguard::torch_adapter {

bool FingerprintDeviceTensor(const at::Tensor& t, Shapes& shapes, opguard_tensor* out,
                             Shapes::At* shape) {
#if !defined(OPGUARD_TORCH_CUDA)
  (void)t;
  (void)shapes;
  (void)out;
  (void)shape;
  return false;
#else
  static const bool supported = opguard_api_version() >= 3;
  if (!supported || !t.defined() || !t.is_cuda() || t.is_sparse() || t.is_quantized() ||
      !t.has_storage()) {
    return false;
  }
  const uint8_t dtype = ToOpGuardDType(t.scalar_type());
  if (dtype == OPGUARD_DTYPE_UNKNOWN) return false;
  *shape = shapes.Add(t.sizes());
  const c10::DeviceIndex device = t.device().index();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  // A strided tensor is fingerprinted in logical order: made contiguous on
  // the same stream first, unseen by observers (it is OpGuard's copy, not the
  // program's op) and outside autograd. The copy goes back to the caching
  // allocator when this returns, which hands its memory only to work ordered
  // after the fingerprint on this stream.
  at::Tensor bytes = t;
  if (!t.is_contiguous()) {
    at::DisableRecordFunctionGuard no_observers;
    at::NoGradGuard no_grad;
    bytes = t.contiguous();
  }
  const auto sizes = bytes.sizes();
  if (opguard_fingerprint_device_async(bytes.numel() == 0 ? nullptr : bytes.data_ptr(), dtype,
                                       sizes.data(), static_cast<uint32_t>(sizes.size()), nullptr,
                                       device, stream, out) != OPGUARD_OK) {
    return false;
  }
  out->shape = nullptr;  // the record points at `shapes` once complete
  return true;
#endif
}

#if defined(OPGUARD_TORCH_CUDA)
struct StreamAfterWork::Guard {
  c10::cuda::CUDAStream stream;
  c10::StreamGuard current;
  explicit Guard(c10::cuda::CUDAStream s) : stream(s), current(s.unwrap()) {}
};

namespace {

class CudaFence final : public FingerprintFence {
 public:
  explicit CudaFence(const c10::cuda::CUDAStream& stream)
      : device_(stream.device_index()), event_(c10::DeviceType::CUDA) {
    event_.record(stream);
  }
  bool Passed() const override { return event_.query(); }
  void OrderCurrentStreamAfter() const override {
    event_.block(c10::cuda::getCurrentCUDAStream(device_));
  }

 private:
  c10::DeviceIndex device_;
  c10::Event event_;
};

}  // namespace
#endif

StreamAfterWork::StreamAfterWork(c10::ivalue::Future* completed_future,
                                 const std::vector<at::Tensor>& outputs)
    : outputs_(outputs) {
#if !defined(OPGUARD_TORCH_CUDA)
  (void)completed_future;
#else
  if (completed_future == nullptr || !completed_future->completed()) return;
  c10::DeviceIndex device = -1;
  for (const at::Tensor& t : outputs) {
    if (t.defined() && t.is_cuda()) {
      device = t.device().index();
      break;
    }
  }
  if (device < 0) return;
  guard_ = new Guard(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device));
  // Completed: wait() does not block the host; it makes the current streams
  // (ours, just set) wait for the work's events, and records the work's
  // result storages as used on them.
  completed_future->wait();
  active_ = true;
#endif
}

std::shared_ptr<FingerprintFence> StreamAfterWork::Fence() {
#if defined(OPGUARD_TORCH_CUDA)
  if (guard_ != nullptr) return std::make_shared<CudaFence>(guard_->stream);
#endif
  return nullptr;
}

StreamAfterWork::~StreamAfterWork() {
#if defined(OPGUARD_TORCH_CUDA)
  if (guard_ == nullptr) return;
  for (const at::Tensor& t : outputs_) {
    if (t.defined() && t.is_cuda() && t.has_storage() &&
        t.device().index() == guard_->stream.device_index()) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), guard_->stream);
    }
  }
  delete guard_;
#endif
}

}  // namespace opguard::torch_adapter
