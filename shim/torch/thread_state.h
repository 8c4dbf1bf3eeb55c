// The adapter's state of one thread (ThisThread()), grouped by the file that
// owns each part, and the lanes ops are recorded on.
//
// Lanes: the training thread records on lane 0, autograd's device threads on
// lane 1, other threads on 2..3071 in the order they first record, and the
// future callbacks the opguard package wraps on 3072..4095 (CallbackLane).
#pragma once

#include <c10/util/SmallVector.h>

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "op_names.h"
#include "tensor_memory.h"

namespace opguard::torch_adapter {

inline constexpr uint32_t kMainLane = 0;
inline constexpr uint32_t kBackwardLane = 1;  // autograd worker threads (device backward)
// Ops run inside future callbacks the opguard package wrapped (a DDP comm
// hook's `fut.then(decompress)`) run inline on the thread that calls then()
// or later on a backend's thread, and callbacks of different futures finish
// in any order (DDP's buckets on gloo's two threads): neither the running
// thread nor one shared lane is the same from run to run. Where then() is
// called is the same: each callback's lane follows from the lane that
// registered it and how many callbacks that lane registered before it in the
// step (CallbackLane).
inline constexpr uint32_t kFirstCallbackLane = 3072;
inline constexpr uint32_t kCallbackLanes = 1024;  // lanes 3072..4095; threads get 2..3071

// An autograd node being run: its name ("AddmmBackward0") as RecordFunction
// holds it (alive until the node's scope ends), and a hash of it.
struct NodeName {
  std::string_view text;
  size_t hash;
};

struct ThreadState {
  // ---- op_observer.cc: where in torch's call tree this thread is.
  int depth = 0;           // FUNCTION scopes currently open on this thread
  int backward_nodes = 0;  // BACKWARD_FUNCTION scopes currently open
  int64_t node_seq = -1;   // innermost autograd node's sequence number
  c10::SmallVector<NodeName, 4> nodes;  // autograd nodes being run, innermost last
  int8_t backend_thread = -1;  // runs a c10d backend's work loop (see IsBackendThread); -1 unknown
  int optimizer_steps = 0;     // Optimizer.step ranges currently open (the package's calls)
  int replicated_regions = 0;  // opguard.replicated() regions currently open
  // The last recorded op was replicated; the cache mark taken at the first
  // of that run of replicated ops (op_observer.cc, CollectInputs).
  bool in_replicated_run = false;
  uint64_t replicated_since = 0;
  int unrecorded_regions = 0;  // DataLoader work on this thread (opguard/_data.py)
  int subclass_dispatches = 0;  // ops on tensor subclasses open (their __torch_dispatch__ runs)
  int compiled_regions = 0;     // recorded torch.compile regions open (compiled_regions.h)
  int backward_calls = 0;      // torch.autograd.backward calls open (steps.cc)
  uint64_t backward_site = 0;  // the user's call site of the outermost open one
  // Python code autograd runs (a custom Function's backward, saved-tensor and
  // tensor hooks), innermost last: the number of autograd nodes open when
  // each region began, so that ops of nodes run inside it are told apart.
  c10::SmallVector<int, 2> python_regions;
  NameIds names;
  uint64_t nested_calls = 0;  // FUNCTION scopes opened below depth 0, ever
  // Whether ops run other ops inside themselves, by the address of their
  // name: 1 seen without nested ops, 2 seen with (see OnFunctionStart).
  std::unordered_map<const char*, uint8_t> nests;
  // Which arguments an op writes (bit i: argument i), from its schema, by the
  // address of its name (each overload's own); see WrittenArguments.
  std::unordered_map<const char*, uint64_t> written_arguments;
  // Trusted mode (trusted_ops.cc): whether an op is on the allow-list, by the
  // address of its name, for the list of that generation.
  std::unordered_map<const char*, bool> trusted_names;
  uint32_t trusted_generation = 0;

  // ---- lanes (thread_state.cc)
  int64_t lane = -1;
  // Lanes of the future callbacks running on this thread, innermost last (a
  // callback can run inline inside another one's then()).
  c10::SmallVector<uint32_t, 2> callback_lanes;

  // ---- collectives.cc: the communicator the opguard package announced for
  // the next process group this thread uses that OpGuard does not know yet
  // (0: none).
  uint64_t announced_communicator = 0;

  // ---- tensor_fingerprint.cc: what this thread knows about tensor memory.
  uint64_t cache_step = 0;  // the step `cache` holds entries of
  FingerprintCache cache;
  uint64_t collective_writes_seen = 0;  // g_collective_writes applied to `cache`
  // Storages holding freshly allocated, not yet written memory (outputs of
  // aten::empty and friends). Their bytes differ from run to run by
  // definition, and so do views of them (the detach/view an nn.Parameter
  // makes of torch.empty before init.normal_ writes it). A storage leaves the
  // set when an op writes a tensor it was given (in-place or out=: the output
  // is one of the op's input tensors).
  StorageSet uninitialised;
  // Storages with views made inside a tensor subclass's __torch_dispatch__
  // (DTensor's local aten::t, view, ...): made below autograd, such a view
  // has a version counter of its own, starting at 0 whatever was written to
  // the storage before, so no tensor of the storage is fingerprinted through
  // the cache (op_observer.cc: MarkUnversionedMemory).
  StorageSet unversioned_views;
  std::vector<uint8_t> gather;  // strided tensors in logical order (GatherLogical)
};

ThreadState& ThisThread();

// The lane the calling thread's ops go to now.
uint32_t LaneOf(ThreadState& ts);
// The lane of the future callback the calling thread registers now.
uint32_t CallbackLane();

}  // namespace opguard::torch_adapter
