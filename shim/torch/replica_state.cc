#include "replica_state.h"

#include <torch/library.h>

#include <string>
#include <vector>

#include "adapter_state.h"
#include "op_observer.h"
#include "python_frames.h"
#include "thread_state.h"

namespace opguard::torch_adapter {
namespace {

// One call per optimizer step for all its parameters: a dispatcher call from
// Python per parameter would cost more than hashing a small one.
int64_t ReplicaState(const std::vector<std::string>& names, at::TensorList state,
                     c10::IntArrayRef counts) {
  try {
    if (!Recording() || names.size() != counts.size()) return 0;
    ThreadState& ts = ThisThread();
    const uint64_t site = FindUserSite().site;  // the optimizer.step() call
    int64_t recorded = 0;
    size_t next = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const auto count = static_cast<size_t>(counts[i]);
      if (counts[i] < 0 || next + count > state.size()) return recorded;
      if (RecordReplicaState(names[i], state.slice(next, count), site, ts)) ++recorded;
      next += count;
    }
    return recorded;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error recording replica state");
  }
  return 0;
}

}  // namespace

void RegisterReplicaStateOp() {
  // A fragment: the opguard namespace is defined with the collective ops.
  static torch::Library* library = [] {
    auto* lib = new torch::Library(torch::Library::FRAGMENT, "opguard", c10::nullopt, __FILE__,
                                   __LINE__);
    lib->def("replica_state(str[] names, Tensor[] state, int[] counts) -> int", &ReplicaState);
    return lib;
  }();
  (void)library;
}

}  // namespace opguard::torch_adapter
