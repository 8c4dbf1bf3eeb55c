// The exported C surface of libopguard_torch.so (opguard/torch.h): thin
// entry points over the op observer, the collectives and the per-thread
// regions. None lets an exception out.
#include "opguard/torch.h"

#include <pthread.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "adapter_state.h"
#include "collective_kinds.h"
#include "collectives.h"
#include "compiled_regions.h"
#include "op_observer.h"
#include "opguard/shim.h"
#include "python_frames.h"
#include "replica_state.h"
#include "steps.h"
#include "thread_state.h"
#include "trusted_ops.h"

using namespace opguard::torch_adapter;

namespace {

// The registered callbacks (see AddObserverCallbacks); zero while paused.
std::array<at::CallbackHandle, 2> g_handles{};
// Serialises registering and unregistering them (opguard.paused() may be
// used from several threads).
std::mutex g_callback_mu;

// Registered once recording starts, after the shim's own exit flush (exit
// handlers run in reverse): the last step's end is sent with the rest.
void AtExit() {
  try {
    if (g_adapter.recording.load()) EndOfTraining(ThisThread());
  } catch (...) {
  }
}

// A per-thread region counter (replicated, unrecorded).
int EnterRegion(int ThreadState::*depth) { return ++(ThisThread().*depth); }
int LeaveRegion(int ThreadState::*depth) {
  int& n = ThisThread().*depth;
  if (n > 0) --n;
  return n;
}

// The non-empty items of `text` (may be null) separated by `separator`.
std::vector<std::string> SplitList(const char* text, char separator) {
  std::vector<std::string> items;
  std::stringstream stream(text ? text : "");
  for (std::string item; std::getline(stream, item, separator);) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

}  // namespace

extern "C" {

int opguard_torch_enable(int all_depths, const char* skip_prefixes) {
  try {
    if (opguard_init() != 1) return 0;
    SetSkippedPathPrefixes(SplitList(skip_prefixes, ':'));
    g_adapter.all_depths.store(all_depths != 0);
    if (!g_adapter.registered.load()) {
      RegisterCollectiveOps();
      RegisterCompiledRegionOps();
      RegisterReplicaStateOp();
      // A forked child (a DataLoader worker) records nothing: the shim turns
      // itself off there, and the callbacks must not go on hashing every op
      // for records that go nowhere.
      pthread_atfork(nullptr, nullptr, [] { g_adapter.recording.store(false); });
      g_adapter.registered.store(true);
      g_adapter.main_thread = std::this_thread::get_id();
      g_adapter.foreign_global_observer = at::hasGlobalCallbacks();
      std::atexit(&AtExit);
      // Online SDC mode observes no op: torch's RecordFunction machinery
      // stays off, and so does its cost on every op.
      if (!g_adapter.sdc.load()) {
        std::lock_guard<std::mutex> lock(g_callback_mu);
        g_handles = AddObserverCallbacks();
      }
    }
    g_adapter.skip_nested.store(all_depths == 0 && !g_adapter.foreign_global_observer &&
                                !KeepNestedOps());
    g_adapter.recording.store(true);
    return 1;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
    return 0;
  }
}

int opguard_torch_set_trusted(const char* names) {
  try {
    std::vector<std::string> list = SplitList(names, ',');
    const int count = static_cast<int>(list.size());
    SetTrustedOps(std::move(list));
    return count;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
    return -1;
  }
}

int opguard_torch_set_sdc(int sdc) {
  if (g_adapter.registered.load()) return g_adapter.sdc.load() == (sdc != 0) ? 1 : 0;
  g_adapter.sdc.store(sdc != 0);
  return 1;
}

int opguard_torch_pause(int paused) {
  try {
    std::lock_guard<std::mutex> lock(g_callback_mu);
    if (!g_adapter.registered.load()) return 0;
    if (paused != 0 && g_handles[0] != 0) {
      for (at::CallbackHandle& handle : g_handles) at::removeCallback(std::exchange(handle, 0));
    } else if (paused == 0 && g_handles[0] == 0 && !g_adapter.sdc.load()) {
      g_handles = AddObserverCallbacks();
    }
    g_adapter.paused.store(paused != 0);
    return 1;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
    return 0;
  }
}

int opguard_torch_recording(void) { return g_adapter.recording.load() ? 1 : 0; }

void opguard_torch_disable(void) { g_adapter.recording.store(false); }

uint64_t opguard_torch_mark_step(void) {
  try {
    if (g_adapter.recording.load()) MarkStepExplicitly(ThisThread());
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  }
  return g_adapter.step.load();
}

int opguard_torch_backward_begin(void) {
  try {
    BackwardBegin(ThisThread());
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  }
  return ThisThread().backward_calls;
}

int opguard_torch_backward_end(void) {
  BackwardEnd(ThisThread());
  return ThisThread().backward_calls;
}

int opguard_torch_python_region_begin(void) {
  ThreadState& ts = ThisThread();
  ts.python_regions.push_back(static_cast<int>(ts.nodes.size()));
  return static_cast<int>(ts.python_regions.size());
}

int opguard_torch_python_region_end(void) {
  ThreadState& ts = ThisThread();
  if (!ts.python_regions.empty()) ts.python_regions.pop_back();
  return static_cast<int>(ts.python_regions.size());
}

int opguard_torch_optimizer_step_begin(void) { return EnterRegion(&ThreadState::optimizer_steps); }

int opguard_torch_optimizer_step_end(void) {
  const int open = LeaveRegion(&ThreadState::optimizer_steps);
  try {
    if (Recording()) OptimizerStepEnded(ThisThread());
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  }
  return open;
}

int opguard_torch_replicated_begin(void) { return EnterRegion(&ThreadState::replicated_regions); }
int opguard_torch_replicated_end(void) { return LeaveRegion(&ThreadState::replicated_regions); }
int opguard_torch_unrecorded_begin(void) { return EnterRegion(&ThreadState::unrecorded_regions); }
int opguard_torch_unrecorded_end(void) { return LeaveRegion(&ThreadState::unrecorded_regions); }

uint32_t opguard_torch_callback_lane(void) { return CallbackLane(); }
int opguard_torch_callback_begin(uint32_t lane) {
  ThisThread().callback_lanes.push_back(lane);
  return static_cast<int>(ThisThread().callback_lanes.size());
}
int opguard_torch_callback_end(void) {
  auto& lanes = ThisThread().callback_lanes;
  if (!lanes.empty()) lanes.pop_back();
  return static_cast<int>(lanes.size());
}

void opguard_torch_announce_group(uint64_t communicator) {
  ThisThread().announced_communicator = communicator;
}

void opguard_torch_forget_groups(uint64_t communicator) { ForgetGroups(communicator); }

uint64_t opguard_torch_step(void) { return g_adapter.step.load(); }
uint32_t opguard_torch_lane(void) { return LaneOf(ThisThread()); }

const char* opguard_torch_collective_function(uint32_t index) {
  size_t count = 0;
  const CollectiveKind* kinds = CollectiveKinds(&count);
  return index < count ? kinds[index].function : nullptr;
}

int opguard_torch_collective_kind(const char* function) {
  const CollectiveKind* kind = function != nullptr ? CollectiveKindOfFunction(function) : nullptr;
  return kind != nullptr ? kind->kind : 0;
}

const char* opguard_torch_collective_op(const char* function) {
  const CollectiveKind* kind = function != nullptr ? CollectiveKindOfFunction(function) : nullptr;
  return kind != nullptr ? kind->op : nullptr;
}

}  // extern "C"
