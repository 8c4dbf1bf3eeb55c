// The exported C API: a thin, exception-proof layer over Core.
//
// Process-wide state: g_state says whether the shim is uninitialised, on or
// off; the Core is created once by the first call and deliberately never
// destroyed, so a host thread that races with exit or shutdown still calls
// into a live object (it just finds it no longer accepting).
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

#include "config.h"
#include "opguard/common/log.h"
#include "opguard/shim.h"
#include "opguard/common/utf8.h"
#include "shim_core.h"

#ifdef OPGUARD_SHIM_HAVE_FINGERPRINT
#include "opguard/fingerprint/fingerprint.h"
#endif

namespace opguard::shim {
namespace {

enum State : int { kUninit = 0, kOn = 1, kOff = 2 };

std::atomic<int> g_state{kUninit};
std::atomic<Core*> g_core{nullptr};
std::mutex g_init_mu;
std::once_flag g_atfork_once;
std::atomic<bool> g_failure_logged{false};

// fork(): the child must not touch the parent's sockets, threads or locks.
// prepare/parent keep g_init_mu consistent across the fork; the child only
// flips atomics.
void AtForkPrepare() { g_init_mu.lock(); }
void AtForkParent() { g_init_mu.unlock(); }
void AtForkChild() {
  g_init_mu.unlock();
  g_state.store(kOff, std::memory_order_release);
  if (Core* core = g_core.load(std::memory_order_acquire)) core->AbandonAfterFork();
}

// Normal exit: bounded flush. Registered only once the shim is on; a forked
// child finds g_state off and does nothing.
void OnExit() {
  if (g_state.load(std::memory_order_acquire) != kOn) return;
  Core* core = g_core.load(std::memory_order_acquire);
  g_state.store(kOff, std::memory_order_release);
  if (core != nullptr) {
    try {
      (void)core->Shutdown(core->config().flush_timeout_ms);
    } catch (...) {
    }
  }
}

int Init() {
  int state = g_state.load(std::memory_order_acquire);
  if (state != kUninit) return state == kOn ? 1 : 0;
  std::call_once(g_atfork_once, [] { pthread_atfork(AtForkPrepare, AtForkParent, AtForkChild); });
  std::lock_guard<std::mutex> lock(g_init_mu);
  state = g_state.load(std::memory_order_acquire);
  if (state != kUninit) return state == kOn ? 1 : 0;

  LogLevel level = LogLevel::kInfo;
  auto config = ParseConfig(ProcessEnv(), &level);
  if (!config.ok() || config->enabled) {
    SetLogComponent("opguard-shim");
    SetLogLevel(level);
  }
  if (!config.ok()) {
    OPGUARD_LOG(LogLevel::kWarn, config.status().message());
    g_state.store(kOff, std::memory_order_release);
    return 0;
  }
  if (!config->enabled) {
    g_state.store(kOff, std::memory_order_release);
    return 0;
  }
  auto core = Core::Start(*config);
  if (!core.ok()) {
    OPGUARD_LOG(LogLevel::kError, "cannot start: " + core.status().message() +
                                      "; OpGuard is disabled in this process, training continues");
    g_state.store(kOff, std::memory_order_release);
    return 0;
  }
  g_core.store(core->release(), std::memory_order_release);
  if (config->run_generated && config->rank == 0) {
    OPGUARD_LOG(LogLevel::kInfo, "OPGUARD_RUN is not set; recording as run '" + config->run + "'");
  }
  OPGUARD_LOG(LogLevel::kDebug, "recording run '" + config->run + "' as rank " +
                                    std::to_string(config->rank) + " of " +
                                    std::to_string(config->world_size) + " (" +
                                    config->rank_source + ") to " + config->endpoint);
  std::atexit(OnExit);
  g_state.store(kOn, std::memory_order_release);
  return 1;
}

inline Core* Active() {
  int state = g_state.load(std::memory_order_acquire);
  if (state == kUninit) state = Init() != 0 ? kOn : kOff;
  return state == kOn ? g_core.load(std::memory_order_acquire) : nullptr;
}

// Any exception escaping the core ends recording for this process.
void Failed(const char* where, const char* what) {
  g_state.store(kOff, std::memory_order_release);
  if (Core* core = g_core.load(std::memory_order_acquire)) core->AbandonAfterFork();
  if (!g_failure_logged.exchange(true)) {
    try {
      OPGUARD_LOG(LogLevel::kError, std::string("internal failure in ") + where + " (" + what +
                                        "); OpGuard is disabled in this process, training continues");
    } catch (...) {
    }
  }
}

template <typename R, typename F>
R Guard(const char* where, R fallback, F&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    Failed(where, e.what());
  } catch (...) {
    Failed(where, "unknown exception");
  }
  return fallback;
}

const char* EmptyIfNull(const char* s) { return s != nullptr ? s : ""; }

}  // namespace
}  // namespace opguard::shim

using opguard::shim::Active;
using opguard::shim::Core;
using opguard::shim::Guard;

extern "C" {

OPGUARD_API int opguard_api_version(void) { return OPGUARD_SHIM_API_VERSION; }

OPGUARD_API int opguard_init(void) { return Guard("opguard_init", 0, [] { return opguard::shim::Init(); }); }

OPGUARD_API int opguard_enabled(void) {
  return Guard("opguard_enabled", 0, [] {
    Core* core = Active();
    return core != nullptr && core->accepting() ? 1 : 0;
  });
}

OPGUARD_API const char* opguard_run_name(void) {
  return Guard("opguard_run_name", "", [] {
    Core* core = Active();
    return core != nullptr ? core->config().run.c_str() : "";
  });
}

OPGUARD_API uint32_t opguard_rank(void) {
  return Guard("opguard_rank", 0u, [] {
    Core* core = Active();
    return core != nullptr ? core->config().rank : 0u;
  });
}

OPGUARD_API uint32_t opguard_world_size(void) {
  return Guard("opguard_world_size", 0u, [] {
    Core* core = Active();
    return core != nullptr ? core->config().world_size : 0u;
  });
}

OPGUARD_API int opguard_flush(uint32_t timeout_ms) {
  return Guard("opguard_flush", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    return core != nullptr ? core->Flush(timeout_ms) : OPGUARD_ERR_DISABLED;
  });
}

OPGUARD_API int opguard_shutdown(uint32_t timeout_ms) {
  return Guard("opguard_shutdown", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    opguard::shim::g_state.store(opguard::shim::kOff, std::memory_order_release);
    return core->Shutdown(timeout_ms);
  });
}

OPGUARD_API int opguard_set_run_info(int kind, const char* key, const char* value) {
  return Guard("opguard_set_run_info", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    return core->SetRunInfo(kind, opguard::shim::EmptyIfNull(key), opguard::shim::EmptyIfNull(value));
  });
}

OPGUARD_API uint64_t opguard_intern(const char* text, size_t len) {
  return Guard("opguard_intern", uint64_t{0}, [&]() -> uint64_t {
    if (text == nullptr) return 0;
    std::string repaired;
    std::string_view s = opguard::RepairedUtf8(std::string_view(text, len), &repaired);
    Core* core = Active();
    return core != nullptr ? core->Intern(s) : opguard::shim::StringId(s);
  });
}

OPGUARD_API uint64_t opguard_site(const char* file, uint32_t line, const char* function) {
  return Guard("opguard_site", uint64_t{0}, [&]() -> uint64_t {
    std::string file_repaired, function_repaired;
    std::string_view f = opguard::RepairedUtf8(opguard::shim::EmptyIfNull(file), &file_repaired);
    std::string_view fn = opguard::RepairedUtf8(opguard::shim::EmptyIfNull(function), &function_repaired);
    Core* core = Active();
    return core != nullptr ? core->Site(f, line, fn) : opguard::shim::SiteId(f, line, fn);
  });
}

OPGUARD_API uint64_t opguard_source_file(const char* path, const void* content, size_t len) {
  return Guard("opguard_source_file", uint64_t{0}, [&]() -> uint64_t {
    if (path == nullptr) return 0;
    Core* core = Active();
    // The file is read under its own bytes; its name is sent repaired.
    std::string repaired;
    return core != nullptr ? core->SourceFile(path, content, len)
                           : opguard::shim::StringId(opguard::RepairedUtf8(path, &repaired));
  });
}

OPGUARD_API int opguard_record_op(const opguard_op* op, uint64_t* op_index_out) {
  return Guard("opguard_record_op", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (op == nullptr) return OPGUARD_ERR_INVALID;
    return core->RecordOp(*op, op_index_out);
  });
}

OPGUARD_API uint64_t opguard_lane_position(uint32_t lane) {
  return Guard("opguard_lane_position", uint64_t{0}, [&]() -> uint64_t {
    Core* core = Active();
    return core != nullptr ? core->LanePosition(lane) : 0;
  });
}

OPGUARD_API int opguard_mark_step(uint32_t lane, uint64_t step) {
  return Guard("opguard_mark_step", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    return core != nullptr ? core->MarkStep(lane, step) : OPGUARD_ERR_DISABLED;
  });
}

OPGUARD_API int opguard_report_gap(uint32_t lane, uint64_t count, const char* reason,
                                   uint64_t* first_op_out) {
  return Guard("opguard_report_gap", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    std::string repaired;
    return core->ReportGap(lane, count, opguard::RepairedUtf8(opguard::shim::EmptyIfNull(reason), &repaired),
                           first_op_out);
  });
}

OPGUARD_API uint64_t opguard_communicator_define(const opguard_communicator* comm) {
  return Guard("opguard_communicator_define", uint64_t{0}, [&]() -> uint64_t {
    if (comm == nullptr) return 0;
    Core* core = Active();
    if (core == nullptr) return 0;
    return core->DefineCommunicator(*comm);
  });
}

OPGUARD_API int opguard_record_collective(const opguard_collective* coll, uint64_t* seq_out) {
  return Guard("opguard_record_collective", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (coll == nullptr) return OPGUARD_ERR_INVALID;
    return core->RecordCollective(*coll, seq_out);
  });
}

OPGUARD_API int opguard_get_counters(opguard_counters* out) {
  return Guard("opguard_get_counters", OPGUARD_ERR_INVALID, [&] {
    if (out == nullptr || out->struct_size < sizeof(uint32_t)) return OPGUARD_ERR_INVALID;
    Core* core = Active();
    if (core == nullptr) {
      uint32_t size = out->struct_size;
      std::memset(out, 0, std::min<size_t>(size, sizeof(opguard_counters)));
      out->struct_size = size;
      return OPGUARD_ERR_DISABLED;
    }
    core->GetCounters(out);
    return OPGUARD_OK;
  });
}

OPGUARD_API int opguard_fingerprint_host(const void* data, uint8_t dtype, const int64_t* shape,
                                         uint32_t ndim, const int64_t* strides, opguard_tensor* out) {
  return opguard_fingerprint_host_sums(data, dtype, shape, ndim, strides, out, nullptr);
}

namespace {
bool ValidFingerprintArgs(uint8_t dtype, const int64_t* shape, uint32_t ndim) {
  return (ndim == 0 || shape != nullptr) && ndim <= 64 && dtype != 0 &&
         dtype <= OPGUARD_DTYPE_COMPLEX128;
}

// Shape checks shared by the async calls: dims >= 0, data present unless
// empty. Elements in *elements.
bool ValidTensorArgs(const void* data, uint8_t dtype, const int64_t* shape, uint32_t ndim) {
  if (!ValidFingerprintArgs(dtype, shape, ndim)) return false;
  int64_t elements = 1;
  for (uint32_t i = 0; i < ndim; ++i) {
    if (shape[i] < 0) return false;
    elements *= shape[i];
  }
  return elements == 0 || data != nullptr;
}

bool IsCContiguous(const int64_t* shape, const int64_t* strides, uint32_t ndim) {
  if (strides == nullptr) return true;
  int64_t expected = 1;
  for (uint32_t i = ndim; i > 0; --i) {
    if (shape[i - 1] != 1 && strides[i - 1] != expected) return false;
    expected *= shape[i - 1];
  }
  return true;
}

void FillPendingOut(opguard_tensor* out, uint64_t handle, uint8_t dtype, const int64_t* shape,
                    uint32_t ndim, int16_t device) {
  *out = opguard_tensor{};
  opguard_tensor_set_pending(out, handle);
  out->shape = shape;
  out->ndim = ndim;
  out->dtype = dtype;
  out->device = device;
}
}  // namespace

OPGUARD_API int opguard_pending_begin(uint64_t* handle_out) {
  return Guard("opguard_pending_begin", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (handle_out == nullptr) return OPGUARD_ERR_INVALID;
    return core->PendingBegin(handle_out);
  });
}

OPGUARD_API int opguard_pending_resolve(uint64_t handle, const opguard_tensor* result) {
  return Guard("opguard_pending_resolve", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (result == nullptr) return OPGUARD_ERR_INVALID;
    opguard::shim::FpResult r;
    r.lo = result->fp_lo;
    r.hi = result->fp_hi;
    r.has_stats = result->has_stats == 1 ? 1 : 0;
    r.stats = result->stats;
    return core->PendingResolve(handle, r);
  });
}

OPGUARD_API int opguard_pending_fail(uint64_t handle, const char* reason) {
  return Guard("opguard_pending_fail", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    std::string repaired;
    return core->PendingFail(handle, opguard::RepairedUtf8(opguard::shim::EmptyIfNull(reason), &repaired));
  });
}

OPGUARD_API int opguard_fingerprint_host_async(const void* data, uint8_t dtype,
                                               const int64_t* shape, uint32_t ndim,
                                               const int64_t* strides,
                                               opguard_release_fn release,
                                               void* release_context, opguard_tensor* out) {
  return Guard("opguard_fingerprint_host_async", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (out == nullptr || !ValidTensorArgs(data, dtype, shape, ndim)) return OPGUARD_ERR_INVALID;
    opguard::shim::HostFingerprinter::Job job;
    job.data = data;
    job.dtype = dtype;
    job.shape.assign(shape, shape + ndim);
    if (strides != nullptr) job.strides.assign(strides, strides + ndim);
    job.release = release;
    job.release_context = release_context;
    uint64_t handle = 0;
    int rc = core->FingerprintHostAsync(std::move(job), &handle);
    if (rc == OPGUARD_OK) FillPendingOut(out, handle, dtype, shape, ndim, -1);
    return rc;
  });
}

OPGUARD_API int opguard_kernels_begin(uint64_t* key_out) {
  return Guard("opguard_kernels_begin", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (key_out == nullptr) return OPGUARD_ERR_INVALID;
    return core->KernelsBegin(key_out);
  });
}

OPGUARD_API int opguard_kernels_end(uint64_t key) {
  // Also after shutdown: a key pushed must be popped.
  return Guard("opguard_kernels_end", OPGUARD_ERR_DISABLED, [&] {
    Core* core = opguard::shim::g_core.load(std::memory_order_acquire);
    if (core == nullptr || key == 0) return OPGUARD_ERR_INVALID;
    core->KernelsEnd(key);
    return OPGUARD_OK;
  });
}

OPGUARD_API int opguard_kernels_discard(uint64_t key) {
  return Guard("opguard_kernels_discard", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (key == 0) return OPGUARD_ERR_INVALID;
    core->KernelsDiscard(key);
    return OPGUARD_OK;
  });
}

OPGUARD_API int opguard_fingerprint_device_async(const void* data, uint8_t dtype,
                                                 const int64_t* shape, uint32_t ndim,
                                                 const int64_t* strides, int device,
                                                 void* stream, opguard_tensor* out) {
  return Guard("opguard_fingerprint_device_async", OPGUARD_ERR_DISABLED, [&] {
    Core* core = Active();
    if (core == nullptr) return OPGUARD_ERR_DISABLED;
    if (out == nullptr || device < 0 || device > INT16_MAX || !ValidTensorArgs(data, dtype, shape, ndim)) {
      return OPGUARD_ERR_INVALID;
    }
    opguard_device_tensor t{data, shape, ndim, dtype, device};
    uint64_t handle = 0;
    int rc = core->FingerprintDeviceAsync(t, IsCContiguous(shape, strides, ndim), stream, &handle);
    if (rc == OPGUARD_OK) FillPendingOut(out, handle, dtype, shape, ndim, static_cast<int16_t>(device));
    return rc;
  });
}

namespace {

// opguard_fingerprint_host_sums, on `pool` when one is given.
int FingerprintHostSums(const void* data, uint8_t dtype, const int64_t* shape, uint32_t ndim,
                        const int64_t* strides, int tasks, opguard_parallel_for pool,
                        void* pool_ctx, opguard_tensor* out, opguard_byte_sums* sums) {
  return Guard("opguard_fingerprint_host", OPGUARD_ERR_INVALID, [&] {
    if (out == nullptr || !ValidFingerprintArgs(dtype, shape, ndim)) return OPGUARD_ERR_INVALID;
#ifdef OPGUARD_SHIM_HAVE_FINGERPRINT
    namespace fp = opguard::fingerprint;
    int64_t elements = 1;
    for (uint32_t i = 0; i < ndim; ++i) {
      if (shape[i] < 0) return OPGUARD_ERR_INVALID;
      elements *= shape[i];
    }
    if (elements != 0 && data == nullptr) return OPGUARD_ERR_INVALID;
    fp::TensorView view;
    view.data = data;
    view.dtype = static_cast<fp::DType>(dtype);
    view.shape = std::span<const int64_t>(shape, ndim);
    if (strides != nullptr) view.strides = std::span<const int64_t>(strides, ndim);
    fp::ByteSums byte_sums;
    fp::Fingerprint f;
    if (pool != nullptr && tasks > 1) {
      const fp::ParallelFor run = [pool, pool_ctx](int n, const std::function<void(int)>& task) {
        pool(
            pool_ctx, n,
            [](void* ctx, int index) { (*static_cast<const std::function<void(int)>*>(ctx))(index); },
            const_cast<std::function<void(int)>*>(&task));
      };
      f = fp::FingerprintHostOn(view, tasks, run, &byte_sums);
    } else {
      f = fp::FingerprintHost(view, 1, &byte_sums);
    }
    *out = opguard_tensor{};
    out->fp_lo = f.digest.lo;
    out->fp_hi = f.digest.hi;
    out->shape = shape;
    out->ndim = ndim;
    out->dtype = dtype;
    out->has_stats = 1;
    out->device = -1;
    out->stats = {f.stats.nan_count, f.stats.inf_count, f.stats.min, f.stats.max, f.stats.sum, f.stats.l2};
    if (sums != nullptr) *sums = opguard_byte_sums{byte_sums.a0, byte_sums.a1};
    return OPGUARD_OK;
#else
    (void)data;
    (void)strides;
    (void)tasks;
    (void)pool;
    (void)pool_ctx;
    (void)sums;
    return OPGUARD_ERR_UNSUPPORTED;
#endif
  });
}

}  // namespace

OPGUARD_API int opguard_fingerprint_host_sums(const void* data, uint8_t dtype,
                                              const int64_t* shape, uint32_t ndim,
                                              const int64_t* strides, opguard_tensor* out,
                                              opguard_byte_sums* sums) {
  return FingerprintHostSums(data, dtype, shape, ndim, strides, 1, nullptr, nullptr, out, sums);
}

OPGUARD_API int opguard_fingerprint_host_parallel(const void* data, uint8_t dtype,
                                                  const int64_t* shape, uint32_t ndim,
                                                  const int64_t* strides, int tasks,
                                                  opguard_parallel_for pool, void* pool_ctx,
                                                  opguard_tensor* out, opguard_byte_sums* sums) {
  return FingerprintHostSums(data, dtype, shape, ndim, strides, tasks, pool, pool_ctx, out, sums);
}

OPGUARD_API int opguard_fingerprint_reshape(const opguard_byte_sums* sums, uint8_t dtype,
                                            const int64_t* shape, uint32_t ndim,
                                            opguard_tensor* out) {
  return Guard("opguard_fingerprint_reshape", OPGUARD_ERR_INVALID, [&] {
    if (sums == nullptr || out == nullptr || !ValidFingerprintArgs(dtype, shape, ndim)) {
      return OPGUARD_ERR_INVALID;
    }
#ifdef OPGUARD_SHIM_HAVE_FINGERPRINT
    namespace fp = opguard::fingerprint;
    const fp::Digest d = fp::Refinalize(fp::ByteSums{sums->a0, sums->a1},
                                        static_cast<fp::DType>(dtype),
                                        std::span<const int64_t>(shape, ndim));
    out->fp_lo = d.lo;
    out->fp_hi = d.hi;
    out->shape = shape;
    out->ndim = ndim;
    out->dtype = dtype;
    return OPGUARD_OK;
#else
    return OPGUARD_ERR_UNSUPPORTED;
#endif
  });
}

}  // extern "C"
