/* OpGuard's PyTorch adapter (libopguard_torch.so): the C surface the `opguard`
 * Python package calls through ctypes (python/opguard/_native.py declares
 * every function below exactly once; tests/unit checks it against this file).
 *
 * Why C and ctypes rather than a Python extension module: the library is
 * loaded only when OPGUARD=1, into whatever Python the training job runs, and
 * must not tie the package to one CPython ABI.
 *
 * Contract (the shim's rules apply, shim/include/opguard/shim.h): no function
 * throws, aborts or blocks; any internal failure prints one warning line and
 * stops recording while training goes on. Every function may be called from
 * any thread unless its comment says otherwise.
 */
#ifndef OPGUARD_TORCH_H_
#define OPGUARD_TORCH_H_

#include <stdint.h>

#define OPGUARD_TORCH_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* Registers the RecordFunction callbacks (once) and starts recording.
 * `all_depths`: record every aten op rather than the top-level ones.
 * `skip_prefixes`: ':'-separated path prefixes that are not user code (torch,
 * OpGuard, the standard library). Called from Python on the thread that
 * becomes lane 0. Returns 1 if recording. */
OPGUARD_TORCH_API int opguard_torch_enable(int all_depths, const char* skip_prefixes);

/* Trusted mode (OPGUARD_TRUSTED): the ops named in `names` (comma-separated,
 * "aten::mm,aten::add") are recorded from then on without fingerprints (their
 * records carry OPGUARD_OP_TRUSTED), except in the optimizer's step and
 * replicated regions. "" or NULL: every op fingerprinted. Returns the number
 * of names, -1 on failure. */
OPGUARD_TORCH_API int opguard_torch_set_trusted(const char* names);

/* Online SDC mode (OPGUARD_SDC): with `sdc` set before the first
 * opguard_torch_enable, no op callback is ever registered; what is recorded
 * is the replica state the package hands to the opguard::replica_state
 * dispatcher op after each optimizer step (replicated ops, one per
 * parameter). Returns 1 when the mode is (now) as asked, 0 when recording
 * already started in the other mode. */
OPGUARD_TORCH_API int opguard_torch_set_sdc(int sdc);

/* Stops recording (the callbacks stay registered but return at once). */
OPGUARD_TORCH_API void opguard_torch_disable(void);

/* 1 while the callbacks record (0 once stopped, failed or in a forked child). */
OPGUARD_TORCH_API int opguard_torch_recording(void);

/* opguard.paused(): with `paused` set the callbacks are unregistered, so the
 * ops that run meanwhile cost nothing and are not recorded, on any thread, nor
 * are the collectives the Python wrappers record; cleared, they are registered
 * again. Returns 1 when the state was changed or already so. */
OPGUARD_TORCH_API int opguard_torch_pause(int paused);

/* An explicit step boundary (opguard.mark_step()): the next op starts the next
 * step, and from then on only these calls end steps. Returns the step now
 * current. */
OPGUARD_TORCH_API uint64_t opguard_torch_mark_step(void);

/* Around torch.autograd.backward on the calling thread: a top-level call is
 * what step boundaries are found against (shim/torch/steps.h). Return the
 * thread's open backward calls. */
OPGUARD_TORCH_API int opguard_torch_backward_begin(void);
OPGUARD_TORCH_API int opguard_torch_backward_end(void);

/* Around Python code that autograd runs during backward (a custom Function's
 * backward, saved-tensor and tensor hooks): its ops are recorded with their
 * own call sites, and as recompute when grad is enabled. They nest; return
 * the thread's open regions. */
OPGUARD_TORCH_API int opguard_torch_python_region_begin(void);
OPGUARD_TORCH_API int opguard_torch_python_region_end(void);

/* Around torch.optim's Optimizer.step (the package calls them where
 * record_function opens and closes its "Optimizer.step#" range): the
 * thread's ops in between are replicated, and the end is an update for the
 * step boundaries. They nest; return the thread's open ranges. */
OPGUARD_TORCH_API int opguard_torch_optimizer_step_begin(void);
OPGUARD_TORCH_API int opguard_torch_optimizer_step_end(void);

/* The current step, and the calling thread's lane (collectives recorded from
 * Python use the same lane numbering as the ops around them). */
OPGUARD_TORCH_API uint64_t opguard_torch_step(void);
OPGUARD_TORCH_API uint32_t opguard_torch_lane(void);

/* Per-thread regions; they nest. Begin returns the thread's depth after
 * entering, End (ignored without a Begin) the depth after leaving.
 *  - replicated: ops the calling thread records are flagged
 *    OPGUARD_OP_REPLICATED (every data-parallel replica must agree on them);
 *  - unrecorded: the DataLoader's own work (fetching, collating, pinning) is
 *    left out, collectives excepted. */
OPGUARD_TORCH_API int opguard_torch_replicated_begin(void);
OPGUARD_TORCH_API int opguard_torch_replicated_end(void);
OPGUARD_TORCH_API int opguard_torch_unrecorded_begin(void);
OPGUARD_TORCH_API int opguard_torch_unrecorded_end(void);

/* Callbacks the package wraps on a torch future: one takes its lane when it is
 * registered (callback_lane, on the registering thread) and runs between
 * callback_begin(lane) and callback_end() on whichever thread runs it, its ops
 * going to that lane. */
OPGUARD_TORCH_API uint32_t opguard_torch_callback_lane(void);
OPGUARD_TORCH_API int opguard_torch_callback_begin(uint32_t lane);
OPGUARD_TORCH_API int opguard_torch_callback_end(void);

/* Process groups: the next process group unknown to OpGuard that a c10d op of
 * the calling thread takes is `communicator` (0 clears); forget_groups drops
 * the groups named `communicator` (0: all) before destroy_process_group
 * destroys them, so a group created later at the same address is learnt anew. */
OPGUARD_TORCH_API void opguard_torch_announce_group(uint64_t communicator);
OPGUARD_TORCH_API void opguard_torch_forget_groups(uint64_t communicator);

/* The collectives OpGuard knows, by torch.distributed function name (the one
 * table: shim/torch/collective_kinds.cc). collective_function(i) is the i-th
 * name (NULL past the end); collective_kind(name) its OPGUARD_COLL_* (0 if
 * unknown); collective_op(name) the c10d dispatcher op it calls ("allreduce_",
 * without the namespace), NULL if unknown. */
OPGUARD_TORCH_API const char* opguard_torch_collective_function(uint32_t index);
OPGUARD_TORCH_API int opguard_torch_collective_kind(const char* function);
OPGUARD_TORCH_API const char* opguard_torch_collective_op(const char* function);

#ifdef __cplusplus
}
#endif

#endif /* OPGUARD_TORCH_H_ */
