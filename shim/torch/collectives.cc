#include "collectives.h"

#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "adapter_state.h"
#include "collective_kinds.h"
#include "device_fingerprint.h"
#include "opguard/shim.h"
#include "python_frames.h"
#include "tensor_fingerprint.h"
#include "torch_compat.h"

namespace opguard::torch_adapter {

// What a collective's Completed record repeats of its Entered one (the
// launch inputs, seq, lane position).
struct PendingCollective {
  opguard_collective rec;
  Shapes shapes;
  TensorRecords<4> inputs;
};

// A collective between its Entered and Completed records.
struct NativeCollective {
  PendingCollective entered;
  std::vector<at::Tensor> outputs;  // fingerprinted once the work completes
  c10::intrusive_ptr<c10::ivalue::Future> future;  // the work's, set at the op's end
  std::mutex mu;      // held while the Completed record is taken
  bool done = false;  // the Completed record was taken (or is not to be)
};

namespace {

// One phase of a collective in one call: the op boundary in the calling
// thread's lane ("c10d::<kind> [enter]" holding the inputs, or
// "c10d::<kind>" with the launch inputs and the outputs), then the collective
// record. `rec->lane` is set here; for Entered, `rec->op_index` is set to the
// lane position after the boundary (where the collective was issued), for
// Completed the caller repeats it. Collective boundaries are never flagged
// replicated: their inputs are each rank's own.
int RecordCollective(opguard_collective* rec, uint64_t op_name, uint64_t* seq,
                     uint32_t op_flags = 0) {
  const uint32_t lane = LaneOf(ThisThread());
  c10::SmallVector<opguard_value, 8> values(rec->num_inputs);
  for (uint32_t i = 0; i < rec->num_inputs; ++i) {
    std::memset(&values[i], 0, sizeof(opguard_value));
    values[i].kind = OPGUARD_VALUE_TENSOR;
    values[i].tensor = rec->inputs[i];
  }
  const bool entered = rec->phase == OPGUARD_PHASE_ENTERED;
  opguard_op op;
  std::memset(&op, 0, sizeof(op));
  op.struct_size = sizeof(op);
  op.lane = lane;
  op.op_index = OPGUARD_AUTO;
  op.name = op_name;
  op.site = rec->site;
  op.flags = op_flags;
  op.num_inputs = rec->num_inputs;
  op.inputs = values.data();
  op.num_outputs = entered ? rec->num_inputs : rec->num_outputs;
  op.outputs = entered ? rec->inputs : rec->outputs;
  opguard_record_op(&op, nullptr);
  rec->lane = lane;
  if (entered) rec->op_index = opguard_lane_position(lane);
  return opguard_record_collective(rec, seq);
}

// Collectives launched from Python and not yet completed, by token.
// Completion may come on another thread (work.wait() there). Bounded: a
// collective whose work is never waited for is forgotten after enough others.
std::mutex g_pending_mu;
std::unordered_map<int64_t, PendingCollective>* g_pending =
    new std::unordered_map<int64_t, PendingCollective>();
int64_t g_next_token = 1;

// Records the Entered phase of a collective whose inputs are fingerprinted
// into ctx.outputs: its op boundary `name` and its
// collective record. `first` (may be null) gives the dtype and count. True
// with `pending` filled with what the Completed record repeats.
bool RecordEntered(OpContext& ctx, const at::Tensor* first, uint8_t kind, uint64_t communicator,
                   int32_t root, uint8_t reduce_op, uint64_t name, PendingCollective* pending) {
  opguard_collective rec;
  std::memset(&rec, 0, sizeof(rec));
  rec.struct_size = sizeof(rec);
  rec.phase = OPGUARD_PHASE_ENTERED;
  rec.kind = kind;
  rec.dtype = first != nullptr ? ToOpGuardDType(first->scalar_type()) : 0;
  rec.reduce_op = reduce_op;
  rec.communicator = communicator;
  rec.seq = OPGUARD_AUTO;
  rec.count = first != nullptr ? static_cast<uint64_t>(first->numel()) : 0;
  rec.root = root;
  rec.op_index = OPGUARD_AUTO;
  rec.step = OPGUARD_AUTO;
  rec.site = FindUserSite().site;
  rec.num_inputs = ctx.outputs.size();
  rec.inputs = ctx.outputs.Resolve(ctx.shapes);
  const uint64_t step = CurrentStep();
  uint64_t seq = 0;
  // Inputs from uninitialised memory (a broadcast's receiving buffer) make
  // the boundary no evidence of a divergence, as for aten::empty's output.
  if (RecordCollective(&rec, name, &seq,
                       ctx.uninitialised_output ? OPGUARD_OP_NONDETERMINISTIC : 0) != OPGUARD_OK) {
    return false;
  }
  rec.seq = seq;
  rec.step = step;
  pending->rec = rec;
  pending->shapes = ctx.shapes;
  pending->inputs = ctx.outputs;
  return true;
}

// Turns `pending` into its Completed record, with the outputs fingerprinted
// into `outputs`.outputs. Returns the record.
opguard_collective& CompletedRecord(PendingCollective& pending, OpContext& outputs) {
  opguard_collective& rec = pending.rec;
  rec.phase = OPGUARD_PHASE_COMPLETED;
  rec.num_inputs = pending.inputs.size();
  rec.inputs = pending.inputs.Resolve(pending.shapes);
  rec.num_outputs = outputs.outputs.size();
  rec.outputs = outputs.outputs.Resolve(outputs.shapes);
  return rec;
}

// opguard::collective_enter: records the Entered phase of a collective about
// to be launched from Python (python/opguard/_collectives.py: the
// torch.distributed functions that do not go through c10d's dispatcher) and
// returns the token its completion passes back, or 0 when nothing was
// recorded (not recording, a tensor without host bytes, any failure).
// `outputs` only give the dtype and count when there are no inputs (recv).
// `communicator` and `name` are the uint64 ids as int64.
int64_t CollectiveEnter(at::TensorList inputs, at::TensorList outputs, int64_t kind,
                        int64_t communicator, int64_t root, int64_t reduce_op, int64_t name) {
  try {
    // Paused: neither phase is recorded, like the dispatcher's collectives.
    if (!Recording() || g_adapter.paused.load()) return 0;
    ThreadState& ts = ThisThread();
    BeginCacheStep(ts);
    OpContext ctx;
    if (!FingerprintAll(inputs, ctx, ts)) return 0;
    const at::Tensor* first =
        !inputs.empty() ? &inputs[0] : (!outputs.empty() ? &outputs[0] : nullptr);
    PendingCollective pending;
    if (!RecordEntered(ctx, first, static_cast<uint8_t>(kind), static_cast<uint64_t>(communicator),
                       static_cast<int32_t>(root), static_cast<uint8_t>(reduce_op),
                       static_cast<uint64_t>(name), &pending)) {
      return 0;
    }
    std::lock_guard<std::mutex> lock(g_pending_mu);
    if (g_pending->size() >= 4096) g_pending->clear();
    const int64_t token = g_next_token++;
    g_pending->emplace(token, std::move(pending));
    return token;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error recording a collective");
  }
  return 0;
}

// opguard::collective_complete: the Completed phase of the collective
// `token` names, once its work has completed; outputs fingerprinted now.
// 1 if recorded.
int64_t CollectiveComplete(int64_t token, at::TensorList outputs, int64_t name) {
  try {
    PendingCollective pending;
    {
      std::lock_guard<std::mutex> lock(g_pending_mu);
      auto it = g_pending->find(token);
      if (it == g_pending->end()) return 0;
      pending = std::move(it->second);
      g_pending->erase(it);
    }
    for (const at::Tensor& t : outputs) {
      if (t.defined() && t.has_storage()) {
        g_collective_writes->Add(t.storage().unsafeGetStorageImpl());
      }
    }
    if (!Recording()) return 0;
    ThreadState& ts = ThisThread();
    BeginCacheStep(ts);
    OpContext ctx;
    if (!FingerprintAll(outputs, ctx, ts)) return 0;
    uint64_t seq = 0;
    return RecordCollective(&CompletedRecord(pending, ctx), static_cast<uint64_t>(name), &seq) ==
                   OPGUARD_OK
               ? 1
               : 0;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error recording a collective");
  }
  return 0;
}

// ---- Collectives at c10d's dispatcher -------------------------------------
// torch.distributed's collectives reach c10d's dispatcher ops
// (c10d::allreduce_, ...): those called from Python, and those DDP's reducer
// issues from C++ during backward. They are recorded here, from the op's
// own arguments: the Entered phase when the op starts (inputs hashed from
// memory, op boundary "c10d::<kind> [enter]" in the issuing thread's lane),
// the Completed phase once the work's future has completed: in the future's
// callback on the backend's thread, or, when a thread gets to its next op
// first, by that thread before the op runs (RecordCompletedNatives). Either
// way the outputs are final and no op has run on them since. Completed adds
// no op boundary: it happens at no fixed point of the issuing thread's op
// order.


// The tensors of a Tensor, Tensor[] or Tensor[][] argument, in order.
void AppendTensors(const c10::IValue& v, std::vector<at::Tensor>* out) {
  if (v.isTensor()) {
    out->push_back(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) AppendTensors(e, out);
  }
}

// Communicator ids of c10d process groups, by the group's address. No
// reference to the group is kept, not even a weak one: c10 deletes an object
// only once its last weak reference is gone too, and a process group's
// destructor is what joins its backend's threads and frees its
// communicators. A group outliving torch.distributed.destroy_process_group
// kept those threads running into interpreter shutdown, where a late future
// callback taking the GIL aborted the process. The opguard package forgets
// a group before destroy_process_group destroys it (opguard_torch_forget_
// groups), so a new group at the same address is learnt afresh; the size
// check catches a reused address otherwise.
struct KnownGroup {
  uint64_t communicator;
  int size;
};
std::mutex g_groups_mu;
std::unordered_map<const void*, KnownGroup>* g_groups =
    new std::unordered_map<const void*, KnownGroup>();

// The communicator of a process group argument, 0 if OpGuard cannot name it.
// A group seen for the first time is the one the opguard package announced
// on this thread (subgroups: see _collectives.py), else, if it has as many
// members as the job has ranks, the world ("world", ranks 0..n-1, the id the
// package gives torch's default group).
uint64_t CommunicatorOf(const c10::IValue& arg, ThreadState& ts) {
  auto group = CustomClassOf(arg, "ProcessGroup");
  if (!group) return 0;
  std::lock_guard<std::mutex> lock(g_groups_mu);
  const int size = ProcessGroupSize(arg);
  auto it = g_groups->find(group.get());
  if (it != g_groups->end()) {
    if (it->second.size == size) return it->second.communicator;
    g_groups->erase(it);
  }
  uint64_t id = std::exchange(ts.announced_communicator, 0);
  const char* world = std::getenv("WORLD_SIZE");
  if (id == 0 && size > 0 && world != nullptr && std::atoi(world) == size) {
    std::vector<uint32_t> ranks(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = static_cast<uint32_t>(r);
    opguard_communicator comm;
    std::memset(&comm, 0, sizeof(comm));
    comm.struct_size = sizeof(comm);
    comm.size = static_cast<uint32_t>(size);
    comm.name = "world";
    comm.ranks = ranks.data();
    id = opguard_communicator_define(&comm);
  }
  if (id == 0) {
    static std::atomic<bool> warned{false};
    WarnOnce(warned, "collectives on a process group the opguard package did not see created "
                     "are not recorded");
    return 0;
  }
  if (g_groups->size() >= 4096) g_groups->clear();
  g_groups->insert_or_assign(group.get(), KnownGroup{id, size});
  return id;
}

// Interned "c10d::<function> [enter]" of a table row, on first use.
uint64_t EnteredName(const CollectiveKind* kind) {
  static std::atomic<uint64_t> ids[64];
  size_t count = 0;
  const size_t i = static_cast<size_t>(kind - CollectiveKinds(&count));
  uint64_t id = i < std::size(ids) ? ids[i].load(std::memory_order_relaxed) : 0;
  if (id == 0) {
    std::string text = std::string("c10d::") + kind->function + " [enter]";
    id = opguard_intern(text.data(), text.size());
    if (i < std::size(ids)) ids[i].store(id, std::memory_order_relaxed);
  }
  return id;
}

// Collectives launched whose Completed record is not taken yet (bounded: a
// work that never completes is forgotten after enough others).
std::mutex g_natives_mu;
std::vector<std::shared_ptr<NativeCollective>>* g_natives =
    new std::vector<std::shared_ptr<NativeCollective>>();
std::atomic<size_t> g_natives_size{0};
// Collectives whose work has no future: completed when the program waits for
// their output through wait_tensor (RecordWaitedCollectives); bounded, under
// g_natives_mu.
std::vector<std::shared_ptr<NativeCollective>>* g_unfutured =
    new std::vector<std::shared_ptr<NativeCollective>>();

// Device collectives whose outputs' fingerprints may still be pending on
// OpGuard's stream: their outputs' storages and the fence behind the
// fingerprints. Bounded (a fence is dropped once passed, or after enough
// newer ones: a program that never runs another op leaves nothing to order).
struct FencedOutputs {
  c10::SmallVector<const c10::StorageImpl*, 4> storages;
  std::shared_ptr<FingerprintFence> fence;
};
std::mutex g_fenced_mu;
std::vector<FencedOutputs>* g_fenced = new std::vector<FencedOutputs>();
std::atomic<size_t> g_fenced_size{0};

void FenceOutputs(const std::vector<at::Tensor>& outputs, std::shared_ptr<FingerprintFence> fence) {
  if (fence == nullptr) return;
  FencedOutputs fenced;
  for (const at::Tensor& t : outputs) {
    if (t.defined() && t.has_storage())
      fenced.storages.push_back(t.storage().unsafeGetStorageImpl());
  }
  fenced.fence = std::move(fence);
  std::lock_guard<std::mutex> lock(g_fenced_mu);
  if (g_fenced->size() >= 4096) g_fenced->erase(g_fenced->begin());
  g_fenced->push_back(std::move(fenced));
  g_fenced_size.store(g_fenced->size(), std::memory_order_relaxed);
}

// Takes the Completed record of a collective whose work's future has
// completed, once, on whichever thread gets there first; a second thread
// waits until the first is done.
void RecordNativeCompleted(NativeCollective& native) {
  try {
    std::lock_guard<std::mutex> lock(native.mu);
    if (std::exchange(native.done, true)) return;
    for (const at::Tensor& t : native.outputs) {
      if (t.defined() && t.has_storage()) {
        g_collective_writes->Add(t.storage().unsafeGetStorageImpl());
      }
    }
    if ((native.future && native.future->hasError()) || !Recording()) return;
    // Device outputs (NCCL's, gloo's on CUDA tensors): fingerprinted on a
    // stream ordered after the work; the future is complete as soon as the
    // work is enqueued, its events say when its kernels are done.
    StreamAfterWork after_work(native.future.get(), native.outputs);
    OpContext ctx;
    if (!FingerprintAll(native.outputs, ctx, ThisThread())) return;
    if (after_work.active()) FenceOutputs(native.outputs, after_work.Fence());
    // The issuing lane and position of the Entered record, not this thread's.
    opguard_record_collective(&CompletedRecord(native.entered, ctx), nullptr);
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error recording a collective");
  }
}

void ForgetNative(const NativeCollective* native) {
  std::lock_guard<std::mutex> lock(g_natives_mu);
  auto it = std::find_if(g_natives->begin(), g_natives->end(),
                         [native](const auto& n) { return n.get() == native; });
  if (it != g_natives->end()) g_natives->erase(it);
  g_natives_size.store(g_natives->size(), std::memory_order_relaxed);
}

}  // namespace

std::unique_ptr<at::ObserverContext> NativeCollectiveStart(const at::RecordFunction& fn,
                                                           ThreadState& ts) {
  const CollectiveKind* kind = CollectiveKindOfOp(fn.name());
  if (kind == nullptr) return nullptr;
  auto args = fn.inputs();
  auto arg = [&](int i) -> const c10::IValue* {
    return i >= 0 && static_cast<size_t>(i) < args.size() ? &args[static_cast<size_t>(i)]
                                                          : nullptr;
  };
  const c10::IValue* group = nullptr;
  for (const c10::IValue& a : args) {
    if (CustomClassOf(a, "ProcessGroup")) {
      group = &a;
      break;
    }
  }
  if (group == nullptr) return nullptr;
  const uint64_t communicator = CommunicatorOf(*group, ts);
  if (communicator == 0) return nullptr;
  auto native = std::make_shared<NativeCollective>();
  std::vector<at::Tensor> inputs;
  if (arg(kind->inputs) != nullptr) AppendTensors(*arg(kind->inputs), &inputs);
  if (arg(kind->outputs) != nullptr) AppendTensors(*arg(kind->outputs), &native->outputs);
  BeginCacheStep(ts);
  auto ctx = std::make_unique<OpContext>();
  if (!FingerprintAll(inputs, *ctx, ts)) return nullptr;
  const at::Tensor* first = !inputs.empty()            ? &inputs[0]
                            : !native->outputs.empty() ? &native->outputs[0]
                                                       : nullptr;
  const c10::IValue* root = arg(kind->root);
  const c10::IValue* reduce_op = arg(kind->reduce_op);
  if (!RecordEntered(*ctx, first, kind->kind, communicator,
                     root != nullptr && root->isInt() ? static_cast<int32_t>(root->toInt()) : -1,
                     reduce_op != nullptr ? ReduceOpCode(*reduce_op) : 255, EnteredName(kind),
                     &native->entered)) {
    return nullptr;
  }
  ctx->native = std::move(native);
  return ctx;
}


// Before any op starts, on any thread: the Completed records of collectives
// whose work has completed. torch wakes the threads waiting on a future
// before it runs the future's callbacks, so a waiter (DDP's reducer, a
// future's wait() in Python) could otherwise write the outputs, or hand
// them to an op that does, while the callback fingerprints them. Every such
// write is an op, and this runs before it. One load when none is pending.
void RecordCompletedNatives() {
  if (g_natives_size.load(std::memory_order_relaxed) == 0) return;
  c10::SmallVector<std::shared_ptr<NativeCollective>, 4> completed;
  {
    std::lock_guard<std::mutex> lock(g_natives_mu);
    size_t kept = 0;  // the rest keep their launch order
    for (size_t i = 0; i < g_natives->size(); ++i) {
      auto& native = (*g_natives)[i];
      if (native->future->completed()) {
        completed.push_back(std::move(native));
      } else if (kept++ != i) {
        (*g_natives)[kept - 1] = std::move(native);
      }
    }
    g_natives->resize(kept);
    g_natives_size.store(kept, std::memory_order_relaxed);
  }
  for (const auto& native : completed) RecordNativeCompleted(*native);
}

void OrderAfterOutputFingerprints(const at::RecordFunction& fn) {
  if (g_fenced_size.load(std::memory_order_relaxed) == 0) return;
  c10::SmallVector<const c10::StorageImpl*, 8> touched;
  auto add = [&touched](const at::Tensor& t) {
    if (t.defined() && t.is_cuda() && t.has_storage())
      touched.push_back(t.storage().unsafeGetStorageImpl());
  };
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) add(v.toTensor());
    if (v.isTensorList()) {
      for (const c10::IValue& t : v.toListRef()) add(t.toTensor());
    }
  }
  std::lock_guard<std::mutex> lock(g_fenced_mu);
  auto passed = std::remove_if(g_fenced->begin(), g_fenced->end(), [&](const FencedOutputs& f) {
    if (f.fence->Passed()) return true;
    const bool taken =
        std::any_of(f.storages.begin(), f.storages.end(), [&](const c10::StorageImpl* s) {
          return std::find(touched.begin(), touched.end(), s) != touched.end();
        });
    // Once this op's stream waits for the fence, the ops after it on that
    // stream do too; other streams' ops still check.
    if (taken) f.fence->OrderCurrentStreamAfter();
    return false;
  });
  g_fenced->erase(passed, g_fenced->end());
  g_fenced_size.store(g_fenced->size(), std::memory_order_relaxed);
}

// At the c10d op's end: its outputs hold the work; its future's callback
// records Completed. An op that returns nothing (monitored_barrier_) has
// completed when it returns. A work without a future (some backends) leaves
// the Entered record alone.
void NativeCollectiveEnd(const at::RecordFunction& fn, OpContext& ctx) {
  std::shared_ptr<NativeCollective> native = std::move(ctx.native);
  c10::intrusive_ptr<c10::ivalue::Future> future;
  for (const c10::IValue& v : fn.outputs()) {
    if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) {
        if (!future) future = WorkFuture(e);
      }
    } else if (!future) {
      future = WorkFuture(v);
    }
  }
  if (!future && fn.outputs().empty()) {
    RecordNativeCompleted(*native);  // returns nothing: done when it returns
    return;
  }
  if (!future) {
    std::lock_guard<std::mutex> lock(g_natives_mu);
    if (g_unfutured->size() >= 64) {
      g_unfutured->erase(g_unfutured->begin());
      static std::atomic<bool> warned{false};
      WarnOnce(warned, "a collective's work has no future and its output was not waited for "
                       "with wait_tensor: its Completed record is not taken");
    }
    g_unfutured->push_back(std::move(native));
    return;
  }
  native->future = future;
  {
    std::lock_guard<std::mutex> lock(g_natives_mu);
    if (g_natives->size() >= 4096) g_natives->erase(g_natives->begin());
    g_natives->push_back(native);
    g_natives_size.store(g_natives->size(), std::memory_order_relaxed);
  }
  future->addCallback([native](c10::ivalue::Future&) {
    RecordNativeCompleted(*native);
    ForgetNative(native.get());
  });
}

void RecordWaitedCollectives(const at::Tensor& waited) {
  RecordCompletedNatives();
  if (!waited.defined() || !waited.has_storage()) return;
  const c10::StorageImpl* storage = waited.storage().unsafeGetStorageImpl();
  c10::SmallVector<std::shared_ptr<NativeCollective>, 2> done;
  {
    std::lock_guard<std::mutex> lock(g_natives_mu);
    auto writes = [storage](const std::shared_ptr<NativeCollective>& n) {
      return std::any_of(n->outputs.begin(), n->outputs.end(), [storage](const at::Tensor& t) {
        return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == storage;
      });
    };
    auto it = std::stable_partition(g_unfutured->begin(), g_unfutured->end(),
                                    [&](const auto& n) { return !writes(n); });
    done.append(std::make_move_iterator(it), std::make_move_iterator(g_unfutured->end()));
    g_unfutured->erase(it, g_unfutured->end());
  }
  for (const auto& native : done) RecordNativeCompleted(*native);
}

// Python hands the tensors themselves to the adapter through these ops:
// torch.ops.opguard.collective_enter(...).
void RegisterCollectiveOps() {
  static torch::Library* library = [] {
    auto* lib = new torch::Library(torch::Library::DEF, "opguard", c10::nullopt, __FILE__,
                                   __LINE__);
    lib->def("collective_enter(Tensor[] inputs, Tensor[] outputs, int kind, int communicator, "
             "int root, int reduce_op, int name) -> int",
             &CollectiveEnter);
    lib->def("collective_complete(int token, Tensor[] outputs, int name) -> int",
             &CollectiveComplete);
    return lib;
  }();
  (void)library;
}

void ForgetGroups(uint64_t communicator) {
  std::lock_guard<std::mutex> lock(g_groups_mu);
  if (communicator == 0) {
    g_groups->clear();
    return;
  }
  for (auto it = g_groups->begin(); it != g_groups->end();) {
    it = it->second.communicator == communicator ? g_groups->erase(it) : std::next(it);
  }
}

}  // namespace opguard::torch_adapter
