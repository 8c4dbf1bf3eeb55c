#include "kernel_attribution.h"

#include <cupti.h>
#include <dlfcn.h>

#include <array>
#include <cstdlib>

#include "opguard/common/log.h"

namespace opguard::shim::cupti {

// The libcupti entry points, resolved with dlsym.
struct CuptiApi {
  void* handle = nullptr;
  std::string path;
  CUptiResult (*get_version)(uint32_t*) = nullptr;
  CUptiResult (*get_result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*get_next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*get_num_dropped)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*push_external)(CUpti_ExternalCorrelationKind, uint64_t) = nullptr;
  CUptiResult (*pop_external)(CUpti_ExternalCorrelationKind, uint64_t*) = nullptr;

  std::string Describe(CUptiResult r) const {
    const char* text = nullptr;
    if (get_result_string == nullptr || get_result_string(r, &text) != CUPTI_SUCCESS || text == nullptr) {
      return "CUPTI error " + std::to_string(static_cast<int>(r));
    }
    return text;
  }
};

namespace {

// Kernel and external-correlation records, and the API records that CUPTI
// emits external-correlation records alongside (runtime for cudaLaunchKernel
// and libraries on the runtime, driver for launches through cuLaunchKernel:
// Triton, cuBLASLt). CONCURRENT_KERNEL, unlike KERNEL, keeps kernels
// concurrent.
constexpr std::array<CUpti_ActivityKind, 4> kKinds = {
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL};
// CUPTI 13 (CUDA 11.0): kernel records from CUpti_ActivityKernel4 on, whose
// leading fields (up to `name`) every later version keeps.
constexpr uint32_t kMinCuptiVersion = 13;
constexpr size_t kBufferBytes = 1 << 20;
// Buffers handed to CUPTI and not yet returned, at most (64 MiB): beyond that
// CUPTI drops records, which turns attribution off.
constexpr int kMaxBuffers = 64;

const char* KindName(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return "EXTERNAL_CORRELATION";
    case CUPTI_ACTIVITY_KIND_RUNTIME: return "RUNTIME";
    case CUPTI_ACTIVITY_KIND_DRIVER: return "DRIVER";
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return "CONCURRENT_KERNEL";
    default: return "?";
  }
}

std::atomic<KernelAttribution*> g_active{nullptr};
std::atomic<int> g_buffers{0};

template <typename F>
bool Resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

void* OpenCupti(const std::string& configured, std::string* path) {
  if (!configured.empty()) {
    *path = configured;
    return dlopen(configured.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  // The copy already in the process first (pip torch links its wheel's): a
  // second libcupti would fight the first over the device.
  static constexpr const char* kSonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
  for (const char* name : kSonames) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      *path = name;
      return h;
    }
  }
  static constexpr const char* kCandidates[] = {
      "libcupti.so.13", "libcupti.so.12", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so",
      "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"};
  for (const char* name : kCandidates) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      *path = name;
      return h;
    }
  }
  path->clear();
  return nullptr;
}

}  // namespace

// CUPTI's C callbacks, forwarded to the active object. Never throw.
struct BufferCallbacks {
  static void CUPTIAPI Requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = nullptr;
    *size = 0;
    *max_records = 0;
    if (g_buffers.fetch_add(1, std::memory_order_relaxed) >= kMaxBuffers) {
      g_buffers.fetch_sub(1, std::memory_order_relaxed);
      return;  // CUPTI counts the records it cannot store as dropped
    }
    // CUPTI wants 8-byte alignment.
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    if (*buffer == nullptr) {
      g_buffers.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    *size = kBufferBytes;
  }

  static void CUPTIAPI Completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
    if (buffer == nullptr) return;
    if (KernelAttribution* ka = g_active.load(std::memory_order_acquire)) {
      ka->OnBufferCompleted(buffer, valid_bytes);
    }
    std::free(buffer);
    g_buffers.fetch_sub(1, std::memory_order_relaxed);
  }
};

std::unique_ptr<KernelAttribution> KernelAttribution::Start(const KernelsConfig& config,
                                                            std::string* why_not) {
  std::unique_ptr<KernelAttribution> ka = StartOrExplain(config, why_not);
  if (ka == nullptr) {
    try {
      OPGUARD_LOG(LogLevel::kWarn, "kernel names are not recorded: " + *why_not);
    } catch (...) {
    }
  }
  return ka;
}

std::unique_ptr<KernelAttribution> KernelAttribution::StartOrExplain(const KernelsConfig& config,
                                                                     std::string* why_not) {
  why_not->clear();
  try {
    auto api = std::make_unique<CuptiApi>();
    api->handle = OpenCupti(config.library, &api->path);
    if (api->handle == nullptr) {
      const char* error = dlerror();
      *why_not = config.library.empty()
                     ? "no libcupti found (set OPGUARD_CUPTI_LIBRARY to its path)"
                     : "cannot load " + config.library + ": " + (error != nullptr ? error : "unknown error");
      return nullptr;
    }
    // From here the library stays loaded: CUPTI may keep threads of its own.
    bool all = Resolve(api->handle, "cuptiGetVersion", &api->get_version) &&
               Resolve(api->handle, "cuptiGetResultString", &api->get_result_string) &&
               Resolve(api->handle, "cuptiActivityRegisterCallbacks", &api->register_callbacks) &&
               Resolve(api->handle, "cuptiActivityEnable", &api->enable) &&
               Resolve(api->handle, "cuptiActivityDisable", &api->disable) &&
               Resolve(api->handle, "cuptiActivityFlushAll", &api->flush_all) &&
               Resolve(api->handle, "cuptiActivityGetNextRecord", &api->get_next_record) &&
               Resolve(api->handle, "cuptiActivityGetNumDroppedRecords", &api->get_num_dropped) &&
               Resolve(api->handle, "cuptiActivityPushExternalCorrelationId", &api->push_external) &&
               Resolve(api->handle, "cuptiActivityPopExternalCorrelationId", &api->pop_external);
    if (!all) {
      *why_not = api->path + " lacks the CUPTI Activity API functions used";
      return nullptr;
    }
    uint32_t version = 0;
    if (api->get_version(&version) != CUPTI_SUCCESS || version < kMinCuptiVersion) {
      *why_not = api->path + " is CUPTI API version " + std::to_string(version) + "; " +
                 std::to_string(kMinCuptiVersion) + " (CUDA 11) or later is needed";
      return nullptr;
    }
    KernelAttribution* expected = nullptr;
    std::unique_ptr<KernelAttribution> ka(new KernelAttribution(std::move(api)));
    if (!g_active.compare_exchange_strong(expected, ka.get(), std::memory_order_acq_rel)) {
      *why_not = "kernel attribution is already running in this process";
      ka->stopped_ = true;  // the other one owns CUPTI's callbacks
      return nullptr;
    }
    const CuptiApi& a = *ka->api_;
    CUptiResult r = a.register_callbacks(&BufferCallbacks::Requested, &BufferCallbacks::Completed);
    if (r != CUPTI_SUCCESS) {
      *why_not = "CUPTI refused the buffer callbacks (" + a.Describe(r) + ")";
      ka->Stop();
      return nullptr;
    }
    for (CUpti_ActivityKind kind : kKinds) {
      r = a.enable(kind);
      if (r != CUPTI_SUCCESS) {
        *why_not = std::string("CUPTI could not enable ") + KindName(kind) + " records (" + a.Describe(r) +
                   "; no CUDA driver?)";
        ka->Stop();
        return nullptr;
      }
    }
    return ka;
  } catch (...) {
    *why_not = "out of memory while starting CUPTI";
    return nullptr;
  }
}

KernelAttribution::KernelAttribution(std::unique_ptr<CuptiApi> api) : api_(std::move(api)) {}

KernelAttribution::~KernelAttribution() { Stop(); }

bool KernelAttribution::BeginOp(uint64_t key) noexcept {
  if (!on()) return false;
  CUptiResult r = api_->push_external(kOpCorrelationKind, key);
  if (r == CUPTI_SUCCESS) return true;
  try {
    Fail("CUPTI refused an external correlation id (" + api_->Describe(r) + ")");
  } catch (...) {
    on_.store(false, std::memory_order_release);
  }
  return false;
}

void KernelAttribution::EndOp(uint64_t key) noexcept {
  uint64_t popped = 0;
  CUptiResult r = api_->pop_external(kOpCorrelationKind, &popped);
  if (r == CUPTI_SUCCESS && popped == key) return;
  try {
    Fail(r != CUPTI_SUCCESS ? "CUPTI could not pop an external correlation id (" + api_->Describe(r) + ")"
                            : std::string("another tool pushes CUPTI external correlation ids of kind CUSTOM2"));
  } catch (...) {
    on_.store(false, std::memory_order_release);
  }
}

void KernelAttribution::GpuWorkDone(uint64_t key) noexcept {
  if (!on()) return;
  try {
    ledger_.GpuWorkDone(key);
  } catch (...) {
    Fail("out of memory");
  }
}

void KernelAttribution::Flush() noexcept {
  try {
    std::lock_guard<std::mutex> lock(flush_mu_);
    if (stopped_ || !on()) return;
    ledger_.FlushStarted();
    CUptiResult r = api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    size_t dropped = 0;
    if (r == CUPTI_SUCCESS) r = api_->get_num_dropped(nullptr, 0, &dropped);
    ledger_.FlushDelivered(dropped);
    if (r != CUPTI_SUCCESS) {
      Fail("CUPTI could not flush its activity buffers (" + api_->Describe(r) + ")");
    } else if (ledger_.off()) {
      Fail(ledger_.off_reason());
    }
  } catch (...) {
    Fail("out of memory");
  }
}

KernelList KernelAttribution::KernelsFor(uint64_t key) noexcept {
  try {
    return ledger_.KernelsFor(key);
  } catch (...) {
    Fail("out of memory");
    return KernelList{KernelsState::kUnavailable, {}};
  }
}

void KernelAttribution::Forget(uint64_t key) noexcept {
  try {
    ledger_.Forget(key);
  } catch (...) {
    Fail("out of memory");
  }
}

bool KernelAttribution::waiting_for_flush() const noexcept {
  try {
    return on() && ledger_.waiting_for_flush();
  } catch (...) {
    return false;
  }
}

void KernelAttribution::OnBufferCompleted(uint8_t* buffer, size_t valid_bytes) noexcept {
  try {
    CUpti_Activity* record = nullptr;
    while (api_->get_next_record(buffer, valid_bytes, &record) == CUPTI_SUCCESS) ledger_.OnRecord(record);
  } catch (...) {
    Fail("out of memory");
  }
}

void KernelAttribution::Fail(const std::string& why) noexcept {
  on_.store(false, std::memory_order_release);
  if (failure_logged_.exchange(true)) return;
  try {
    ledger_.TurnOff(why);
    OPGUARD_LOG(LogLevel::kWarn, "kernel names are no longer recorded: " + why);
  } catch (...) {
  }
}

void KernelAttribution::Stop() noexcept {
  std::lock_guard<std::mutex> lock(flush_mu_);
  if (stopped_) return;
  stopped_ = true;
  on_.store(false, std::memory_order_release);
  for (CUpti_ActivityKind kind : kKinds) (void)api_->disable(kind);
  // What CUPTI still holds is delivered (and freed) while this object is
  // still the callbacks' target; later buffers are only freed.
  (void)api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  KernelAttribution* self = this;
  g_active.compare_exchange_strong(self, nullptr, std::memory_order_acq_rel);
}

}  // namespace opguard::shim::cupti
