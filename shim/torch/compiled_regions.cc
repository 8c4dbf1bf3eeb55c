#include "compiled_regions.h"

#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

#include "adapter_state.h"
#include "op_observer.h"
#include "op_record.h"
#include "thread_state.h"

namespace opguard::torch_adapter {
namespace {

// The regions open on this thread, innermost last; nullptr for one that is
// not recorded (nested at the default depth, not recording).
thread_local std::vector<std::unique_ptr<OpContext>> t_regions;

std::vector<c10::IValue> Values(at::TensorList tensors) {
  return std::vector<c10::IValue>(tensors.begin(), tensors.end());
}

// Returns the region's token: its depth on this thread's stack.
int64_t CompiledRegionEnter(const std::string& name, at::TensorList inputs) {
  try {
    ThreadState& ts = ThisThread();
    const std::vector<c10::IValue> values = Values(inputs);
    t_regions.push_back(CompiledRegionStart(name, values, ts));
    return static_cast<int64_t>(t_regions.size());
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error entering a compiled region");
  }
  return 0;
}

// 1 if the region was recorded.
int64_t CompiledRegionExit(int64_t token, at::TensorList outputs, bool completed) {
  try {
    // A token that is not the innermost region's (a failed enter): nothing to end.
    if (token <= 0 || static_cast<size_t>(token) != t_regions.size()) return 0;
    std::unique_ptr<OpContext> ctx = std::move(t_regions.back());
    t_regions.pop_back();
    if (ctx == nullptr) return 0;
    const std::vector<c10::IValue> values = Values(outputs);
    CompiledRegionEnd(std::move(ctx), values, completed, ThisThread());
    return completed ? 1 : 0;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error leaving a compiled region");
  }
  return 0;
}

}  // namespace

void RegisterCompiledRegionOps() {
  // A fragment: the opguard namespace is defined with the collective ops.
  static torch::Library* library = [] {
    auto* lib = new torch::Library(torch::Library::FRAGMENT, "opguard", c10::nullopt, __FILE__,
                                   __LINE__);
    lib->def("compiled_region_enter(str name, Tensor[] inputs) -> int", &CompiledRegionEnter);
    lib->def("compiled_region_exit(int token, Tensor[] outputs, bool completed) -> int",
             &CompiledRegionExit);
    return lib;
  }();
  (void)library;
}

}  // namespace opguard::torch_adapter
