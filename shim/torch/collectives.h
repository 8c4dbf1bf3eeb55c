// Collectives as OpGuard records them from PyTorch, on two paths:
//  * c10d's dispatcher ops (c10d::allreduce_, ...): those called from Python,
//    and those DDP's reducer issues from C++ during backward, seen by the op
//    observer (NativeCollectiveStart/End);
//  * opguard::collective_enter/complete, dispatcher ops of our own that the
//    Python package calls around the torch.distributed functions that do not
//    reach c10d's dispatcher in the installed torch (RegisterCollectiveOps).
// Each collective gives an Entered record (inputs hashed from memory at
// launch, op boundary "c10d::<function> [enter]" in the issuing thread's lane)
// and, once its work has completed, a Completed record with the outputs.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <memory>

#include "op_record.h"
#include "thread_state.h"

namespace opguard::torch_adapter {

// At the start of a c10d dispatcher op: records its Entered phase and
// returns the context its end needs (null: not a collective OpGuard records).
std::unique_ptr<at::ObserverContext> NativeCollectiveStart(const at::RecordFunction& fn,
                                                           ThreadState& ts);
// At its end: arranges for the Completed record once the work completes.
void NativeCollectiveEnd(const at::RecordFunction& fn, OpContext& ctx);
// Before any op starts, on any thread: the Completed records of collectives
// whose work has completed. One load when none is pending.
void RecordCompletedNatives();

// Before any op starts, after RecordCompletedNatives: an op that takes a
// device collective's output while OpGuard's fingerprints of it may still be
// pending on OpGuard's stream waits for them, on the device (its stream is
// ordered after the collective, not after OpGuard's stream). One load when
// none is pending.
void OrderAfterOutputFingerprints(const at::RecordFunction& fn);

// At the end of a functional collective's wait (_c10d_functional::
// wait_tensor), on the waiting thread: the Completed records of collectives
// that have completed, those whose work has no future (gloo's
// reduce_scatter_tensor in torch 2.x) among them when they wrote `waited`.
void RecordWaitedCollectives(const at::Tensor& waited);

// Registers opguard::collective_enter and opguard::collective_complete with
// the dispatcher (once). Throws if the namespace is taken.
void RegisterCollectiveOps();

// Forgets the process groups named `communicator` (0: all).
void ForgetGroups(uint64_t communicator);

}  // namespace opguard::torch_adapter
