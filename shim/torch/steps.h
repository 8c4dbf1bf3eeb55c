// Step boundaries (docs/torch.md, "Steps"). Step k is the k-th iteration of
// the training loop, counted from 0: its forward, backward and update, and
// whatever else the loop does (logging, evaluation, checkpointing) before the
// next iteration's forward. Found without requiring torch.optim:
//  * an update follows the last top-level backward() of an iteration (with
//    gradient accumulation, several backward() calls come first): the end of
//    a torch.optim Optimizer.step, or any op writing a parameter in place
//    (hand-written optimizers, framework wrappers);
//  * the next step starts at the first op after the update that the training
//    thread runs from code before the backward() call in the same frames (the
//    loop went round), or from a new call at the place that ran backward()
//    (a train_step function called once an iteration);
//  * opguard.mark_step(), once called, is the only rule from then on.
// The rule in use is recorded in the run (determinism "steps": optimizer,
// backward or mark_step). Two runs of the same code place every boundary at
// the same op.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "thread_state.h"

namespace opguard::torch_adapter {

// A top-level backward() begins and ends on the calling thread (the opguard
// package wraps torch.autograd.backward). Nested calls are ignored.
void BackwardBegin(ThreadState& ts);
void BackwardEnd(ThreadState& ts);

// torch.optim's Optimizer.step ended on the calling thread.
void OptimizerStepEnded(ThreadState& ts);

// opguard.mark_step() on the calling thread: the next op starts the next step.
void MarkStepExplicitly(ThreadState& ts);

// Whether ops are being watched for a parameter write (an update pending).
bool AwaitingUpdate();
// A leaf tensor that requires grad was an op's input: its storage is a
// parameter's (so that writes through p.data count as updates). Called only
// while the parameters are being learnt (LearningParameters()).
bool LearningParameters();
void SeenParameter(const at::Tensor& t);
// The op `name` on the training thread writes `written` in place (aten's
// trailing '_' convention: its first argument); an update when it is a
// parameter and AwaitingUpdate().
void InPlaceWrite(const c10::IValue& written);

// At process exit: an update after the last boundary ends its step, so that
// a run counts every iteration it completed (as it would with one more).
void EndOfTraining(ThreadState& ts);

// Before the training thread records an op (or a collective): starts the
// next step if the op begins the loop's next iteration.
void BeforeTrainingOp(ThreadState& ts);

}  // namespace opguard::torch_adapter
