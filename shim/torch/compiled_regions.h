// torch.compile regions (docs/torch.md, "Compiled regions"). A compiled
// graph runs its fused kernels outside torch's dispatcher, so no
// RecordFunction shows what it computes; the opguard package
// (python/opguard/_compiled.py) brackets each call of a compiled module or
// function with two dispatcher ops of OpGuard's own, and the region is
// recorded as one op: named for what was compiled ("compiled::Block"), at the
// user's call site, with the call's tensors (and the module's parameters and
// buffers) as inputs and the tensors it returned as outputs.
//   opguard::compiled_region_enter(str name, Tensor[] inputs) -> int
//   opguard::compiled_region_exit(int token, Tensor[] outputs, bool completed) -> int
// Both are called on the thread that runs the region, enter before it and
// exit after it (completed false when it raised); regions nest.
#pragma once

namespace opguard::torch_adapter {

// Defines the two ops (once per process).
void RegisterCompiledRegionOps();

}  // namespace opguard::torch_adapter
