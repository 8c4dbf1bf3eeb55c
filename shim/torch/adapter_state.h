// Process-wide state of the PyTorch adapter: the switches the C surface sets
// (c_api.cc) and every callback reads, the current step, and the one way the
// adapter reports its own failure. Per-thread state is in thread_state.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace opguard::torch_adapter {

struct AdapterState {
  std::atomic<bool> recording{false};   // callbacks record (off: they return at once)
  std::atomic<bool> registered{false};  // callbacks were registered once
  std::atomic<bool> all_depths{false};  // OPGUARD_DEPTH=all: nested aten ops too
  std::atomic<bool> paused{false};      // opguard.paused(): callbacks unregistered
  // Online SDC mode (OPGUARD_SDC): the op callbacks are never registered; only
  // replica state is recorded (replica_state.cc). Set before the first enable.
  std::atomic<bool> sdc{false};
  // Nested ops are switched off inside recorded top-level ops (op_observer.cc):
  // only with the default depth and no foreign global observer.
  std::atomic<bool> skip_nested{false};
  std::atomic<uint64_t> step{0};  // the shim's current step, process-wide
  std::thread::id main_thread;    // the thread that enabled recording: lane 0
  bool foreign_global_observer = false;  // a global RecordFunction observer before ours
};

inline AdapterState g_adapter;

inline bool Recording() { return g_adapter.recording.load(std::memory_order_relaxed); }
inline uint64_t CurrentStep() { return g_adapter.step.load(std::memory_order_relaxed); }

// Stops recording and prints one warning line (the first time only): what the
// adapter does on any unexpected failure. Training goes on.
void DisableOnce(const char* what);
// Prints `what` as a warning the first time `warned` is passed.
void WarnOnce(std::atomic<bool>& warned, const char* what);
// Wall-clock nanoseconds since the epoch, as op records carry them.
uint64_t NowNs();
// The byte count in environment variable `name`, `fallback` when it is unset
// or empty; a value that is not a byte count warns once and gives `fallback`.
uint64_t EnvByteCount(const char* name, uint64_t fallback);

}  // namespace opguard::torch_adapter
