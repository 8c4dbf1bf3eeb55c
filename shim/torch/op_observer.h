// The op observer: torch's RecordFunction callbacks that turn aten ops into
// OpGuard op records (docs/torch.md, "What is recorded").
//  * forward: the top-level aten op of each call from user code (depth 0 of
//    the FUNCTION scope on that thread), or every aten op with
//    OPGUARD_DEPTH=all; inputs fingerprinted at op start, outputs at op end;
//  * backward: the top-level aten ops inside each autograd node, named
//    "aten::mm [AddmmBackward0]", carrying the node's sequence number and the
//    call site of the forward op that created the node;
//  * custom autograd Functions: user code, not ops (IsAutogradFunction): the
//    ops their forward and backward run are recorded with their own sites;
//  * steps: steps.h, fed from here (Optimizer.step ends, parameter writes,
//    the training thread's ops);
//  * replicated ops: every op recorded while its thread is inside an
//    Optimizer.step or an opguard.replicated() region is flagged
//    OPGUARD_OP_REPLICATED (data-parallel replicas must agree on its bits);
//  * c10d's collectives are handed to collectives.cc.
// The callbacks never throw into torch: any unexpected failure stops
// recording (DisableOnce).
#pragma once

#include <ATen/record_function.h>

#include <array>
#include <memory>
#include <string>

#include "op_record.h"
#include "thread_state.h"

namespace opguard::torch_adapter {

// Registers the observer's callbacks globally; returns their handles.
std::array<at::CallbackHandle, 2> AddObserverCallbacks();

// A torch.compile region (compiled_regions.cc) as one op at the depth of its
// call: `name` ("compiled::Block"), its call site, `inputs` fingerprinted
// now; the ops it runs are nested in it (recorded only with
// OPGUARD_DEPTH=all). Called from inside the opguard:: op that carries the
// call (counted in ts.depth). nullptr when not recorded. The end takes the
// outputs, or `completed` false when the region raised (nothing recorded).
std::unique_ptr<OpContext> CompiledRegionStart(const std::string& name,
                                               c10::ArrayRef<c10::IValue> inputs,
                                               ThreadState& ts);
void CompiledRegionEnd(std::unique_ptr<OpContext> ctx, c10::ArrayRef<c10::IValue> outputs,
                       bool completed, ThreadState& ts);

// Online SDC mode's record (replica_state.cc): one replicated op named `name`
// without inputs whose outputs are `state` (a parameter and its optimizer
// state) as they are now, at call site `site` (FindUserSite). False when not
// recorded.
bool RecordReplicaState(const std::string& name, at::TensorList state, uint64_t site,
                        ThreadState& ts);

// OPGUARD_NESTED_OPS=1: leave RecordFunction on inside recorded ops.
bool KeepNestedOps();

}  // namespace opguard::torch_adapter
