// libopguard_shim_cuda.so: the shim's CUDA backend (shim/src/device_ops.h).
// libopguard_shim.so loads it with dlopen when the first device fingerprint
// is asked for, so hosts without CUDA never load the CUDA runtime; the
// runtime is linked in statically, so it needs only the driver.
//
// A launch enqueues, on the caller's stream and behind the op's kernels:
// the fingerprint kernel (Fingerprinter, one per device and stream: it
// reuses its workspace in stream order) writing the slot's device result,
// then the slot's ResultCollector copy into pinned host memory and its
// event. The sender thread polls the event. Nothing waits for the device.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device_ops.h"
#include "opguard/fingerprint/fingerprint.h"
#include "opguard/fingerprint/fingerprint_cuda.h"

namespace {

namespace fp = opguard::fingerprint;
namespace fpc = opguard::fingerprint::cuda;

void SetWhy(char* why, size_t len, const std::string& text) {
  if (len == 0) return;
  std::snprintf(why, len, "%s", text.c_str());
}

std::string CudaWhy(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// Switches to a device for the scope of a launch and back.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      switched_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
  bool switched_ = false;
};

class Backend {
 public:
  explicit Backend(uint32_t slots) : slots_(slots) {}
  ~Backend() {
    for (auto& [device, mem] : device_slots_) {
      DeviceScope scope(device);
      cudaFree(mem);
    }
  }

  int Launch(uint32_t slot, const opguard_device_tensor& t, cudaStream_t stream, char* why,
             size_t len) {
    DeviceScope scope(t.device);
    // Inside a capture nothing may be enqueued: the kernel would become part
    // of the graph and its result would land at every replay into a slot
    // long since reused. Skipped; the record becomes a gap with this reason.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &capture);
    if (e == cudaErrorStreamCaptureImplicit || capture != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      SetWhy(why, len, "cuda graph capture");
      return 1;
    }
    if (e != cudaSuccess) return Fail(why, len, CudaWhy("cudaStreamIsCapturing", e));
    std::string err;
    fpc::ResultSlot* device_slot = DeviceSlot(t.device, slot, &err);
    if (device_slot == nullptr) return Fail(why, len, err);
    fpc::Fingerprinter* f = FingerprinterFor(t.device, stream, &err);
    if (f == nullptr) return Fail(why, len, err);
    fpc::ResultCollector* collector = CollectorFor(t.device, slot, &err);
    if (collector == nullptr) return Fail(why, len, err);
    fp::TensorView view;
    view.data = t.data;
    view.dtype = static_cast<fp::DType>(t.dtype);
    view.shape = std::span<const int64_t>(t.shape, t.ndim);
    e = f->Enqueue(view, device_slot, stream);
    if (e != cudaSuccess) return Fail(why, len, CudaWhy("fingerprint launch", e));
    e = collector->Collect(device_slot, 1, stream);
    if (e != cudaSuccess) return Fail(why, len, CudaWhy("result copy", e));
    return 0;
  }

  int Poll(uint32_t slot, opguard_tensor* out, char* why, size_t len) {
    static thread_local bool relaxed = false;
    if (!relaxed) {
      // The sender thread must be able to query events while the training
      // thread captures a graph in global mode (as PyTorch's allocator does).
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      relaxed = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    }
    fpc::ResultCollector* collector = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = collectors_.find(slot);
      if (it != collectors_.end()) collector = it->second.second.get();
    }
    if (collector == nullptr) {
      SetWhy(why, len, "no result slot");
      return -1;
    }
    cudaError_t e = collector->Query();
    if (e == cudaErrorNotReady) return 0;
    if (e != cudaSuccess) {
      SetWhy(why, len, CudaWhy("fingerprint", e));
      return -1;
    }
    const fpc::ResultSlot& r = collector->results()[0];
    out->fp_lo = r.lo;
    out->fp_hi = r.hi;
    out->has_stats = 1;
    out->stats = {r.nan_count, r.inf_count, r.min, r.max, r.sum, r.l2};
    return 1;
  }

 private:
  static int Fail(char* why, size_t len, const std::string& text) {
    (void)cudaGetLastError();  // leave no sticky non-fatal error for the host to find
    SetWhy(why, len, text);
    return 1;
  }

  fpc::ResultSlot* DeviceSlot(int device, uint32_t slot, std::string* err) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = device_slots_.find(device);
    if (it == device_slots_.end()) {
      void* mem = nullptr;
      cudaError_t e = cudaMalloc(&mem, sizeof(fpc::ResultSlot) * slots_);
      if (e != cudaSuccess) {
        *err = CudaWhy("result slots", e);
        return nullptr;
      }
      it = device_slots_.emplace(device, static_cast<fpc::ResultSlot*>(mem)).first;
    }
    return it->second + slot;
  }

  fpc::Fingerprinter* FingerprinterFor(int device, cudaStream_t stream, std::string* err) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(device, stream);
    auto it = fingerprinters_.find(key);
    if (it == fingerprinters_.end()) {
      cudaError_t e = cudaSuccess;
      auto f = fpc::Fingerprinter::Create(&e, /*max_batch=*/1);
      if (f == nullptr) {
        *err = CudaWhy("fingerprint workspace", e);
        return nullptr;
      }
      it = fingerprinters_.emplace(key, std::move(f)).first;
    }
    return it->second.get();
  }

  // One collector (pinned result + event) per slot, made on first use of the
  // slot (the shim reuses the most recently freed slots first, so only as
  // many exist as were ever in flight at once), remade if the slot moves to
  // another device (an event belongs to one device).
  fpc::ResultCollector* CollectorFor(int device, uint32_t slot, std::string* err) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& entry = collectors_[slot];
    if (entry.second == nullptr || entry.first != device) {
      cudaError_t e = cudaSuccess;
      entry.second = fpc::ResultCollector::Create(&e, 1);
      entry.first = device;
      if (entry.second == nullptr) {
        *err = CudaWhy("pinned result slot", e);
        return nullptr;
      }
    }
    return entry.second.get();
  }

  const uint32_t slots_;
  std::mutex mu_;
  std::map<int, fpc::ResultSlot*> device_slots_;
  std::map<std::pair<int, cudaStream_t>, std::unique_ptr<fpc::Fingerprinter>> fingerprinters_;
  std::map<uint32_t, std::pair<int, std::unique_ptr<fpc::ResultCollector>>> collectors_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int opguard_shim_cuda_open(
    uint32_t slots, opguard_device_ops* ops, char* why, size_t why_len) {
  try {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      SetWhy(why, why_len, e != cudaSuccess ? CudaWhy("no CUDA device", e) : "no CUDA device");
      return 1;
    }
    auto* backend = new Backend(slots);
    *ops = opguard_device_ops{};
    ops->abi = OPGUARD_DEVICE_OPS_ABI;
    ops->slots = slots;
    ops->self = backend;
    ops->launch = [](void* self, uint32_t slot, const opguard_device_tensor* t, void* stream,
                     char* w, size_t n) {
      try {
        return static_cast<Backend*>(self)->Launch(slot, *t, static_cast<cudaStream_t>(stream), w, n);
      } catch (...) {
        SetWhy(w, n, "CUDA backend failure");
        return 1;
      }
    };
    ops->poll = [](void* self, uint32_t slot, opguard_tensor* out, char* w, size_t n) {
      try {
        return static_cast<Backend*>(self)->Poll(slot, out, w, n);
      } catch (...) {
        SetWhy(w, n, "CUDA backend failure");
        return -1;
      }
    };
    ops->close = [](void* self) { delete static_cast<Backend*>(self); };
    return 0;
  } catch (...) {
    SetWhy(why, why_len, "CUDA backend failure");
    return 1;
  }
}
