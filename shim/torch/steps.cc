#include "steps.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "adapter_state.h"
#include "opguard/shim.h"
#include "python_frames.h"

namespace opguard::torch_adapter {
namespace {

enum class Phase : int {
  kLoop,          // forward (and backward, while it runs) of the current step
  kBackwardDone,  // a top-level backward() ended: the next parameter write is the update
  kUpdated,       // the update ran: the next op from earlier code starts the next step
};
enum class Rule : int { kNone, kOptimizer, kBackward, kExplicit };

struct Steps {
  std::atomic<Phase> phase{Phase::kLoop};
  std::atomic<Rule> rule{Rule::kNone};
  std::atomic<bool> learning{true};  // parameters are still being learnt (step 0)
  // Where the last top-level backward() of the training thread was called;
  // read and written on that thread only (so no lock is held while its
  // frames are read under the GIL).
  UserStack backward_stack;
  std::mutex mu;  // guards `parameters`
  std::unordered_set<const c10::StorageImpl*> parameters;
};
// Never destroyed: ops may be recorded during exit.
Steps& S() {
  static Steps* steps = new Steps();
  return *steps;
}

void UseRule(Rule rule) {
  if (S().rule.exchange(rule) == rule) return;
  static constexpr const char* kNames[] = {"", "optimizer", "backward", "mark_step"};
  opguard_set_run_info(OPGUARD_INFO_DETERMINISM, "steps", kNames[static_cast<int>(rule)]);
}

// The shim's current step is process-wide, so one mark (on the lane that ran
// the loop) moves every lane to the next step.
void StartNextStep(ThreadState& ts) {
  const uint64_t step = g_adapter.step.fetch_add(1) + 1;
  opguard_mark_step(LaneOf(ts), step);
  S().phase.store(Phase::kLoop);
  S().learning.store(false);
}

bool OnTrainingThread() { return std::this_thread::get_id() == g_adapter.main_thread; }

bool Explicit() { return S().rule.load(std::memory_order_relaxed) == Rule::kExplicit; }

void Updated(Rule rule) {
  S().phase.store(Phase::kUpdated);
  if (S().rule.load() != Rule::kOptimizer) UseRule(rule);
}

}  // namespace

void BackwardBegin(ThreadState& ts) {
  // Only the top-level call: not one made inside a backward pass
  // (hand-written recompute) or inside another backward() call.
  if (ts.backward_calls++ > 0 || ts.backward_nodes > 0) return;
  // Ops of the backward pass that no forward op maps to take this site: one
  // lookup per backward() call, not one per op.
  ts.backward_site = FindUserSite().site;
  if (Explicit() || !OnTrainingThread()) return;
  // An update ran but no op began the next iteration before this backward:
  // the step boundary is here at the latest.
  if (S().phase.load() == Phase::kUpdated) StartNextStep(ts);
  S().backward_stack.Capture();
}

void BackwardEnd(ThreadState& ts) {
  if (ts.backward_calls > 0 && --ts.backward_calls == 0 && ts.backward_nodes == 0 &&
      !Explicit() && OnTrainingThread()) {
    S().phase.store(Phase::kBackwardDone);
  }
}

void OptimizerStepEnded(ThreadState& ts) {
  if (Explicit()) return;
  const bool has_stack = OnTrainingThread() && !S().backward_stack.empty();
  UseRule(Rule::kOptimizer);
  // Without a backward() call to place the boundary against (the package
  // could not wrap it), the step ends with the optimizer's step.
  if (!has_stack) {
    StartNextStep(ts);
    return;
  }
  S().phase.store(Phase::kUpdated);
}

void MarkStepExplicitly(ThreadState& ts) {
  UseRule(Rule::kExplicit);
  StartNextStep(ts);
}

bool AwaitingUpdate() {
  return S().phase.load(std::memory_order_relaxed) == Phase::kBackwardDone;
}

bool LearningParameters() { return S().learning.load(std::memory_order_relaxed); }

void SeenParameter(const at::Tensor& t) {
  if (!t.has_storage()) return;
  std::lock_guard<std::mutex> lock(S().mu);
  if (S().parameters.size() < (1u << 20)) {
    S().parameters.insert(t.storage().unsafeGetStorageImpl());
  }
}

void InPlaceWrite(const c10::IValue& written) {
  const at::Tensor* t = nullptr;
  at::Tensor first;
  if (written.isTensor()) {
    t = &written.toTensor();
  } else if (written.isTensorList() && !written.toTensorList().empty()) {
    first = written.toTensorList().get(0);  // _foreach_*_ over the parameters
    t = &first;
  }
  if (t == nullptr || !t->defined()) return;
  bool parameter = t->requires_grad() && t->is_leaf();
  if (!parameter && t->has_storage()) {  // a write through p.data
    std::lock_guard<std::mutex> lock(S().mu);
    parameter = S().parameters.count(t->storage().unsafeGetStorageImpl()) != 0;
  }
  if (parameter && AwaitingUpdate()) Updated(Rule::kBackward);
}

void EndOfTraining(ThreadState& ts) {
  if (S().phase.load() == Phase::kUpdated && !Explicit()) StartNextStep(ts);
}

void BeforeTrainingOp(ThreadState& ts) {
  if (S().phase.load(std::memory_order_relaxed) != Phase::kUpdated || Explicit() ||
      !OnTrainingThread()) {
    return;
  }
  if (S().backward_stack.IsBehind()) StartNextStep(ts);
}

}  // namespace opguard::torch_adapter
