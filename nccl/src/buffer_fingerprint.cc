#include "buffer_fingerprint.h"

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "log.h"
#include "shim_api.h"

namespace opguard::nccl {
namespace {

// The CUDA driver, loaded lazily and never linked: a process without a
// driver (or without a GPU) has no device memory, so every buffer is host
// memory. The driver API is used rather than libcudart because the driver is
// the one library every CUDA process shares (applications often link the
// runtime statically).
class Driver {
 public:
  static Driver& Get() {
    static Driver driver;
    return driver;
  }

  // CU_MEMORYTYPE_DEVICE for device and managed memory, CU_MEMORYTYPE_HOST
  // for everything the host can read now. `device` (may be NULL) receives
  // the ordinal of device memory.
  CUmemorytype PlaceOf(const void* p, int* device = nullptr) {
    if (get_attribute_ == nullptr) return CU_MEMORYTYPE_HOST;
    auto ptr = reinterpret_cast<CUdeviceptr>(p);
    unsigned int type = 0;
    CUresult r = get_attribute_(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
    if (r == CUDA_ERROR_NOT_INITIALIZED && init_ != nullptr && init_(0) == CUDA_SUCCESS) {
      r = get_attribute_(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
    }
    // Not known to the driver (plain malloc'ed memory), or no device at all.
    if (r != CUDA_SUCCESS) return CU_MEMORYTYPE_HOST;
    int ordinal = -1;
    if (device != nullptr && get_attribute_(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) == CUDA_SUCCESS) {
      *device = ordinal;
    }
    int managed = 0;
    if (get_attribute_(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr) == CUDA_SUCCESS && managed) {
      return CU_MEMORYTYPE_DEVICE;
    }
    return type == CU_MEMORYTYPE_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  }

 private:
  Driver() {
    // RTLD_NOLOAD first: the process's own driver when it has one.
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) return;
    init_ = reinterpret_cast<decltype(init_)>(dlsym(lib, "cuInit"));
    get_attribute_ =
        reinterpret_cast<decltype(get_attribute_)>(dlsym(lib, "cuPointerGetAttribute"));
  }

  CUresult (*init_)(unsigned int) = nullptr;
  CUresult (*get_attribute_)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
};

std::atomic<uint64_t> device_buffers{0};

}  // namespace

BufferFingerprint FingerprintBuffer(const void* data, uint8_t dtype, uint64_t elements,
                                    cudaStream_t stream, int64_t* shape, opguard_tensor* out) {
  if (dtype == OPGUARD_DTYPE_UNKNOWN || (data == nullptr && elements != 0)) {
    return BufferFingerprint::kNotTaken;
  }
  *shape = static_cast<int64_t>(elements);
  int device = -1;
  if (elements != 0 && Driver::Get().PlaceOf(data, &device) == CU_MEMORYTYPE_DEVICE) {
    // Enqueued on the collective's stream: stream order makes the kernel read
    // the buffer before (inputs) or after (outputs) the collective, and the
    // shim holds the record until the result lands. Failures from here on
    // (capture, no device) become a gap with the reason, never an error here.
    if (Shim()->fingerprint_device_async != nullptr &&
        Shim()->fingerprint_device_async(data, dtype, shape, 1, nullptr, device, stream, out) == OPGUARD_OK) {
      return BufferFingerprint::kTaken;
    }
    uint64_t n = device_buffers.fetch_add(1, std::memory_order_relaxed) + 1;
    static std::once_flag once;
    std::call_once(once, [n] {
      Log("collective buffers in device memory are recorded without fingerprints: the loaded "
          "libopguard_shim takes no device fingerprints (first of them: buffer %llu); kinds, "
          "counts and sequence numbers are recorded",
          static_cast<unsigned long long>(n));
    });
    return BufferFingerprint::kDeviceMemory;
  }
  if (Shim()->fingerprint_host(data, dtype, shape, 1, nullptr, out) != OPGUARD_OK) {
    return BufferFingerprint::kNotTaken;
  }
  out->device = -1;
  return BufferFingerprint::kTaken;
}

uint64_t DeviceBuffersNotFingerprinted() { return device_buffers.load(std::memory_order_relaxed); }

}  // namespace opguard::nccl
