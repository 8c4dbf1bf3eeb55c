// Kernel attribution: the names of the device kernels each recorded op
// launched, from CUPTI's Activity API (docs/kernels.md).
//
// libcupti is loaded at run time (dlopen), so nothing links against it and a
// host without it only loses kernel names. Lives in the training process, so
// the shim's rules hold: no call throws or blocks the training thread; any
// failure logs one line and turns attribution off (records then carry no
// kernels); training carries on.
//
// Use (one object per process: CUPTI's buffer callbacks are process-wide):
//   training thread, around each op:
//       bool pushed = ka->BeginOp(key);  ... op launches kernels ...
//       if (pushed) ka->EndOp(key);
//   shim's sender thread, for each held op record:
//       ka->GpuWorkDone(key)   once an event recorded after the op completed
//       ka->Flush()            when waiting_for_flush(), at the sender's pace
//       ka->KernelsFor(key)    kReady: the final list, in launch order
//                              kPending: ask again after the next Flush()
//                              kUnavailable: send the record without kernels
//       ka->Forget(key)        a record that will not be sent
//   at shutdown (sender thread): ka->Stop().
// `key` names one op of the process: OpKey(lane, op_index) (kernel_ledger.h)
// for callers that know the index when the op starts, or any other unique
// 64-bit value the record carries to the sender.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kernel_ledger.h"

namespace opguard::shim::cupti {

// From the shim's configuration (shim/src/config.h).
struct KernelsConfig {
  bool enabled = false;  // OPGUARD_KERNELS=1
  // OPGUARD_CUPTI_LIBRARY: the libcupti to load; empty: the one already in
  // the process (torch from pip loads its wheel's), else the default search
  // path, else the CUDA toolkit's under /usr/local/cuda.
  std::string library;
};

struct CuptiApi;  // the libcupti entry points used (kernel_attribution.cc)

class KernelAttribution {
 public:
  // Any thread, once per process: loads libcupti, registers the buffer
  // callbacks, enables kernel, external-correlation and API records. nullptr
  // when CUPTI is missing or refuses (no driver, say): then it has logged one
  // warning line, `why_not` says the same, and records carry no kernels.
  static std::unique_ptr<KernelAttribution> Start(const KernelsConfig& config, std::string* why_not);
  ~KernelAttribution();  // Stop()
  KernelAttribution(const KernelAttribution&) = delete;
  KernelAttribution& operator=(const KernelAttribution&) = delete;

  // ---- training thread: two CUPTI calls, no lock, never throws ------------
  // Pushes `key` as the calling thread's external correlation id. False when
  // attribution is off (then do not call EndOp).
  bool BeginOp(uint64_t key) noexcept;
  // Pops it. A popped id other than `key` (someone else pushed under our
  // kind) turns attribution off.
  void EndOp(uint64_t key) noexcept;

  // ---- sender thread -------------------------------------------------------
  void GpuWorkDone(uint64_t key) noexcept;
  // Forced cuptiActivityFlushAll: CUPTI hands over every buffer (on this
  // thread); then CUPTI's dropped-record count. Blocks for the copy-out only
  // (no device synchronisation); one at a time.
  void Flush() noexcept;
  KernelList KernelsFor(uint64_t key) noexcept;
  void Forget(uint64_t key) noexcept;
  bool waiting_for_flush() const noexcept;
  // Disables the activity kinds and delivers what is left. Idempotent.
  void Stop() noexcept;

  bool on() const noexcept { return on_.load(std::memory_order_acquire); }
  LedgerCounters counters() const { return ledger_.counters(); }

 private:
  explicit KernelAttribution(std::unique_ptr<CuptiApi> api);
  static std::unique_ptr<KernelAttribution> StartOrExplain(const KernelsConfig& config,
                                                           std::string* why_not);
  // Logs `why` once and turns attribution off (keeps CUPTI's push/pop
  // balanced: EndOp still pops what BeginOp pushed).
  void Fail(const std::string& why) noexcept;

  // CUPTI's buffer callbacks (any thread CUPTI chooses).
  friend struct BufferCallbacks;
  void OnBufferCompleted(uint8_t* buffer, size_t valid_bytes) noexcept;

  std::unique_ptr<CuptiApi> api_;
  KernelLedger ledger_;
  std::atomic<bool> on_{true};
  std::atomic<bool> failure_logged_{false};
  std::mutex flush_mu_;  // one flush at a time; Stop
  bool stopped_ = false;
};

}  // namespace opguard::shim::cupti
