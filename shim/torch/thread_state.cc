#include "thread_state.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "adapter_state.h"

namespace opguard::torch_adapter {
namespace {

thread_local ThreadState t_state;
std::atomic<uint32_t> g_next_lane{2};

// Callbacks registered so far in the step, per registering lane.
struct CallbackCount {
  uint64_t step = 0;
  uint32_t count = 0;
};
std::mutex g_callback_counts_mu;
std::unordered_map<uint32_t, CallbackCount> g_callback_counts;

}  // namespace

ThreadState& ThisThread() { return t_state; }

uint32_t LaneOf(ThreadState& ts) {
  if (!ts.callback_lanes.empty()) return ts.callback_lanes.back();
  if (ts.lane < 0) {
    if (std::this_thread::get_id() == g_adapter.main_thread) {
      ts.lane = kMainLane;
    } else if (ts.backward_nodes > 0) {
      ts.lane = kBackwardLane;
    } else {
      // Past the thread lanes, late threads share the last one.
      ts.lane = std::min(g_next_lane.fetch_add(1), kFirstCallbackLane - 1);
    }
  }
  return static_cast<uint32_t>(ts.lane);
}

// The k-th callback registered in this step by lane r runs on lane
// 3072 + (512 r + k) mod 1024, so the training thread's and the autograd
// thread's first 512 callbacks of a step each have a lane of their own, reused
// step after step (a step's callbacks have run by the next one). Past that,
// or from other threads, callbacks share lanes, which keeps their order only
// while the sharers do not run at the same time.
uint32_t CallbackLane() {
  uint32_t registering = LaneOf(t_state);
  uint64_t step = CurrentStep();
  uint32_t k;
  {
    std::lock_guard<std::mutex> lock(g_callback_counts_mu);
    CallbackCount& c = g_callback_counts[registering];
    if (c.step != step) c = CallbackCount{step, 0};
    k = c.count++;
  }
  return kFirstCallbackLane + (registering * 512u + k) % kCallbackLanes;
}

}  // namespace opguard::torch_adapter
