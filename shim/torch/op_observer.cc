#include "op_observer.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>  // ElfW, for dladdr1's symbol entry

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "adapter_state.h"
#include "async_fingerprints.h"
#include "collectives.h"
#include "op_record.h"
#include "opguard/shim.h"
#include "python_frames.h"
#include "steps.h"
#include "tensor_fingerprint.h"
#include "torch_compat.h"
#include "trusted_ops.h"

namespace opguard::torch_adapter {
namespace {

// Maps autograd sequence numbers to the forward op that created the nodes, so
// backward ops carry the forward op's call site. Ranges are kept sorted by
// their first sequence number in a flat vector (a thread's sequence numbers
// only grow, so Add appends); the oldest half is dropped to bound memory.
class ForwardSites {
 public:
  struct Entry {
    int64_t begin;
    int64_t end;  // exclusive
    uint64_t site;
  };
  void Add(int64_t begin, int64_t end, uint64_t site) {
    if (end <= begin || site == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.empty() || begin > entries_.back().begin) {
      entries_.push_back(Entry{begin, end, site});
    } else {
      auto it = std::lower_bound(entries_.begin(), entries_.end(), begin,
                                 [](const Entry& e, int64_t b) { return e.begin < b; });
      if (it != entries_.end() && it->begin == begin) {
        *it = Entry{begin, end, site};
      } else {
        entries_.insert(it, Entry{begin, end, site});
      }
    }
    if (entries_.size() > 1u << 20) entries_.erase(entries_.begin(), entries_.begin() + (1 << 19));
  }
  uint64_t Lookup(int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::upper_bound(entries_.begin(), entries_.end(), seq,
                               [](int64_t s, const Entry& e) { return s < e.begin; });
    if (it == entries_.begin()) return 0;
    --it;
    return seq < it->end ? it->site : 0;
  }

 private:
  std::mutex mu_;
  std::vector<Entry> entries_;
};
ForwardSites* g_forward_sites = new ForwardSites();

// Blocks of OpContext size kept per thread, so that recording an op does not
// go to malloc for its context (a few KiB of inline storage). A context freed
// on another thread, or after its thread's pool is gone, goes to that
// thread's pool or back to the heap.
struct ContextPool {
  static constexpr int kMax = 32;
  void* blocks[kMax];
  int count = 0;
  ~ContextPool();
};
thread_local bool t_pool_gone = false;  // trivially destructible: safe after ~ContextPool
thread_local ContextPool t_pool;
ContextPool::~ContextPool() {
  t_pool_gone = true;
  while (count > 0) ::operator delete(blocks[--count]);
}

}  // namespace

void* OpContext::operator new(size_t size) {
  if (size == sizeof(OpContext) && !t_pool_gone && t_pool.count > 0) {
    return t_pool.blocks[--t_pool.count];
  }
  return ::operator new(size);
}

void OpContext::operator delete(void* p, size_t size) {
  if (size == sizeof(OpContext) && !t_pool_gone && t_pool.count < ContextPool::kMax) {
    t_pool.blocks[t_pool.count++] = p;
    return;
  }
  ::operator delete(p);
}

namespace {

// A tensor of the op's record: fingerprinted, or only described when the op
// is trusted (trusted_ops.h).
bool RecordTensor(const at::Tensor& t, OpContext& ctx, ThreadState& ts, opguard_tensor* out,
                  Shapes::At* shape, uint64_t cached_since, bool may_defer = false) {
  if (ctx.trusted) return DescribeTensor(t, ctx.shapes, out, shape);
  return FingerprintTensor(t, ts, ctx.shapes, out, shape, cached_since, may_defer);
}

// Inputs of replicated ops are hashed from their bytes, never taken from a
// fingerprint cached before their region (the optimizer's step) began: what
// replicas compare must show memory that changed behind torch's back (a bit
// flipped in one replica's reduced gradient between the all-reduce and the
// optimizer, or in its parameters or optimizer state between steps: the op
// read corrupted inputs, it did not compute wrongly). The cache assumes bytes
// change only with the version. Within the region, a tensor an earlier op of
// it read or wrote is taken from the cache: its bytes were hashed there, and
// Adam's step reads each of its state tensors several times.
// `Values`: what RecordFunction::inputs() returns (an ArrayRef of const
// IValues in torch 1.13, of IValues in 2.x), or a region's IValues.
template <typename Values>
void CollectInputs(const Values& inputs, OpContext& ctx, ThreadState& ts) {
  const uint64_t since = ctx.replicated ? ts.replicated_since : 0;
  ctx.inputs.reserve(inputs.size());
  for (const c10::IValue& v : inputs) {
    opguard_value value;
    std::memset(&value, 0, sizeof(value));
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined()) {
        ctx.input_impls.push_back(t.unsafeGetTensorImpl());
        if (LearningParameters() && !ctx.backward && t.requires_grad() && t.is_leaf()) {
          SeenParameter(t);
        }
        Shapes::At shape;
        if (!RecordTensor(t, ctx, ts, &value.tensor, &shape, since)) {
          ctx.unfingerprintable = true;
        }
        value.kind = OPGUARD_VALUE_TENSOR;
        ctx.AddTensorInput(value, shape);
        continue;
      }
    } else if (v.isTensorList()) {
      const c10::List<at::Tensor> list = v.toTensorList();
      const uint32_t first = ctx.list_tensors.size();
      for (size_t i = 0; i < list.size(); ++i) {
        const at::Tensor t = list.get(i);
        opguard_tensor tensor;
        Shapes::At shape;
        if (!RecordTensor(t, ctx, ts, &tensor, &shape, since)) {
          ctx.unfingerprintable = true;
        }
        ctx.list_tensors.Add(tensor, shape);
      }
      value.kind = OPGUARD_VALUE_TENSOR_LIST;
      value.num_tensors = static_cast<uint32_t>(list.size());
      ctx.AddListInput(value, first);
      continue;
    }
    ScalarValue(v, &value);  // others (None, int lists, strings): recorded as None
    ctx.AddOtherInput(value);
  }
}

// Whether an op opening now is replicated (in the optimizer's step or an
// opguard.replicated() region); the first op of a run of replicated ones
// marks the cache, so that CollectInputs knows what was cached inside it.
bool OpensReplicated(ThreadState& ts) {
  const bool replicated = ts.optimizer_steps > 0 || ts.replicated_regions > 0;
  if (replicated && !ts.in_replicated_run) ts.replicated_since = ts.cache.Mark();
  ts.in_replicated_run = replicated;
  return replicated;
}

// Tracks uninitialised memory through one output: allocations add it, writes
// (the output is one of the op's own input tensors) clear it, anything else
// that returns a view of it is itself uninitialised.
void TrackUninitialised(bool allocates, const at::Tensor& t, OpContext& ctx, ThreadState& ts) {
  if (allocates) {
    ts.uninitialised.Add(t);
    ctx.uninitialised_output = true;
  } else if (ts.uninitialised.Contains(t)) {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    bool written = std::find(ctx.input_impls.begin(), ctx.input_impls.end(), impl) !=
                   ctx.input_impls.end();
    if (written) {
      ts.uninitialised.Remove(t);
    } else {
      ctx.uninitialised_output = true;
    }
  }
}

bool CollectOutput(const at::Tensor& t, OpContext& ctx, ThreadState& ts) {
  opguard_tensor out;
  Shapes::At shape;
  if (!RecordTensor(t, ctx, ts, &out, &shape, /*cached_since=*/0, /*may_defer=*/true)) {
    return false;
  }
  ctx.outputs.Add(out, shape);
  return true;
}

// An op run inside a tensor subclass's __torch_dispatch__ (AsyncCollectiveTensor,
// DTensor) runs below autograd:
//  - its writes do not bump the version counter (the outer call bumps the
//    outer tensor's after the op has returned, a wrapper's inner tensor's
//    never), so the cache would give its output the fingerprint the target
//    had before the write. An input it returns is marked written here, the
//    arguments its schema marks written by CollectOutputs, as for every op;
//  - a view it returns (aten::t of a weight, in every Linear) gets a version
//    counter of its own, at 0 whatever was written to the storage before: a
//    later view of the same bytes and layout, made after the base was
//    written, would match the first one's entry. Its storage is no longer
//    fingerprinted through the cache (ThreadState::unversioned_views).
// Both before the outputs are fingerprinted.
void MarkUnversionedMemory(const at::RecordFunction& fn, const OpContext& ctx, ThreadState& ts) {
  for (const c10::IValue& v : fn.outputs()) {
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().has_storage()) continue;
    const at::Tensor& t = v.toTensor();
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (std::find(ctx.input_impls.begin(), ctx.input_impls.end(), t.unsafeGetTensorImpl()) !=
        ctx.input_impls.end()) {
      ts.cache.StorageWritten(storage);
    } else if (std::find(ctx.input_storages.begin(), ctx.input_storages.end(), storage) !=
               ctx.input_storages.end()) {
      // Emptied when full: entries taken while a storage was in it go too.
      if (ts.unversioned_views.Add(t)) ts.cache.Clear();
    }
  }
}

// Whether the op works on tensors that hold no data (HoldsNoData: meta,
// FakeTensors, functionalization wrappers): DTensor computes its outputs'
// shapes so, under FakeTensorMode, the first time it meets an op, and
// torch.compile traces its graphs so. Nothing is computed: it is not an op
// (nor a gap).
bool ComputesNothing(const at::RecordFunction& fn) {
  auto no_data = [](const c10::IValue& v) { return v.isTensor() && HoldsNoData(v.toTensor()); };
  return std::any_of(fn.outputs().begin(), fn.outputs().end(), no_data) ||
         std::any_of(fn.inputs().begin(), fn.inputs().end(), no_data);
}

// Which arguments the op writes (bit i: argument i), from its schema's alias
// annotations (`Tensor(a!)`, `Tensor(a!)[]`): in-place and out= ops, the
// foreach and fused optimizer ops, custom ops writing into their out
// arguments (FSDP2's fsdp::split_with_sizes_copy). Looked up once per op
// and thread: copying the schema out of the dispatcher costs more than
// observing the op. Ops without a schema (no dispatcher op) write nothing
// OpGuard can name, and are not kept (their names may not stay put).
uint64_t WrittenArguments(const at::RecordFunction& fn, ThreadState& ts) {
  auto it = ts.written_arguments.find(fn.name());
  if (it != ts.written_arguments.end()) return it->second;
  const auto schema = fn.operator_schema();
  if (!schema.has_value()) return 0;
  uint64_t mask = 0;
  const auto& args = schema->arguments();
  for (size_t i = 0; i < args.size() && i < 64; ++i) {
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) {
      mask |= uint64_t{1} << i;
    }
  }
  if (ts.written_arguments.size() >= 4096) ts.written_arguments.clear();
  ts.written_arguments.emplace(fn.name(), mask);
  return mask;
}

// Holds the tensors `fn` will write, for its end.
void RememberWrittenTensors(const at::RecordFunction& fn, OpContext& ctx, ThreadState& ts) {
  const uint64_t mask = WrittenArguments(fn, ts);
  if (mask == 0) return;
  auto remember = [&ctx](const at::Tensor& t) {
    if (t.defined()) ctx.written.push_back(t);
  };
  const auto& inputs = fn.inputs();
  for (size_t i = 0; i < inputs.size() && i < 64; ++i) {
    if ((mask >> i & 1) == 0) continue;
    const c10::IValue& v = inputs[i];
    if (v.isTensor()) {
      remember(v.toTensor());
    } else if (v.isTensorList()) {
      for (const c10::IValue& t : v.toListRef()) remember(t.toTensor());
    }
  }
}

bool Returned(const c10::SmallVectorImpl<const c10::TensorImpl*>& returned, const at::Tensor& t) {
  return std::find(returned.begin(), returned.end(), t.unsafeGetTensorImpl()) != returned.end();
}

// The op's outputs: the tensors it returns, then those it wrote through its
// arguments and did not return (an in-place op returning its target has it
// once), each after the op. The written storages are marked written first:
// every fingerprint cached for them before is stale, whichever tensor it
// was taken through. The cache's version check alone misses writes through
// another tensor of the storage with a version counter of its own (`p.data`,
// a view made below autograd) and writes that bump none (a custom op's
// kernel, a write inside a tensor subclass's dispatch), and it took a
// fingerprint cached through one counter for a tensor of another counter at
// the same count: reading `p.data` (its counter at 0) after `p.mul_(2)` gave
// the bytes p had before.
//
// A written tensor that is not returned stays in the uninitialised-memory set
// if it was there (only a returned one leaves it, TrackUninitialised): FSDP2
// frees and reallocates its unsharded parameters' storages between forward
// and backward with UntypedStorage.resize_, no op, and its backward reads
// them (views) before fsdp::split_with_sizes_copy writes them again. Taken
// out at the forward's copy, those reads showed each run's garbage as
// evidence.
bool CollectOutputs(c10::ArrayRef<c10::IValue> outputs, bool allocates, OpContext& ctx,
                    ThreadState& ts) {
  for (const at::Tensor& t : ctx.written) {
    if (t.has_storage()) ts.cache.StorageWritten(t.storage().unsafeGetStorageImpl());
  }
  c10::SmallVector<const c10::TensorImpl*, 8> returned;
  for (const c10::IValue& v : outputs) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      TrackUninitialised(allocates, t, ctx, ts);
      if (!CollectOutput(t, ctx, ts)) return false;
      returned.push_back(t.unsafeGetTensorImpl());
    } else if (v.isTensorList()) {
      const c10::List<at::Tensor> list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        const at::Tensor t = list.get(i);
        TrackUninitialised(allocates, t, ctx, ts);
        if (!CollectOutput(t, ctx, ts)) return false;
        returned.push_back(t.unsafeGetTensorImpl());
      }
    }
  }
  for (const at::Tensor& t : ctx.written) {
    if (Returned(returned, t)) continue;
    returned.push_back(t.unsafeGetTensorImpl());  // a tensor written through two arguments: once
    if (!CollectOutput(t, ctx, ts)) return false;
  }
  return true;
}

NodeName NodeNameOf(const char* name) {
  static constexpr std::string_view kPrefix = "autograd::engine::evaluate_function: ";
  std::string_view view(name);
  if (view.substr(0, kPrefix.size()) == kPrefix) view.remove_prefix(kPrefix.size());
  return NodeName{view, std::hash<std::string_view>()(view)};
}


// The autograd engine wraps each node it runs in a FUNCTION-scope range
// "autograd::engine::evaluate_function: <Node>" (the node itself follows as a
// BACKWARD_FUNCTION range). It is not an op: it is transparent for depth, so
// the aten ops the node runs are top-level backward ops.
bool IsEngineWrapper(const at::RecordFunction& fn) {
  return std::strncmp(fn.name(), "autograd::engine::evaluate_function: ", 37) == 0;
}

// The address ranges of the c10d backends' work loops (gloo's worker
// threads, MPI's), from the exported symbols of the torch in the process.
struct CodeRange {
  uintptr_t begin = 0, end = 0;
};
const std::vector<CodeRange>& BackendLoops() {
  static const std::vector<CodeRange> ranges = [] {
    std::vector<CodeRange> found;
    for (const char* name : {"_ZN4c10d16ProcessGroupGloo7runLoopEi",
                             "_ZN4c10d15ProcessGroupMPI7runLoopEv"}) {
      void* start = dlsym(RTLD_DEFAULT, name);
      Dl_info info;
      void* entry = nullptr;  // the symbol's ElfW(Sym)
      if (start == nullptr || dladdr1(start, &info, &entry, RTLD_DL_SYMENT) == 0) continue;
      const auto* sym = static_cast<const ElfW(Sym)*>(entry);
      if (sym != nullptr && sym->st_size > 0) {
        const auto begin = reinterpret_cast<uintptr_t>(start);
        found.push_back(CodeRange{begin, begin + sym->st_size});
      }
    }
    return found;
  }();
  return ranges;
}

// Whether this thread is a c10d backend's worker (a frame of its stack lies
// in a work loop): gloo's two workers take collectives in turn, so the lanes
// their ops would get, and what each lane holds, change from run to run.
// Decided once per thread, from its stack at its first op.
bool IsBackendThread(ThreadState& ts) {
  if (ts.backend_thread < 0) {
    ts.backend_thread = 0;
    if (std::this_thread::get_id() != g_adapter.main_thread && !BackendLoops().empty()) {
      void* frames[96];
      const int n = backtrace(frames, 96);
      for (int i = 0; i < n && ts.backend_thread == 0; ++i) {
        const auto pc = reinterpret_cast<uintptr_t>(frames[i]);
        for (const CodeRange& r : BackendLoops()) {
          if (pc > r.begin && pc <= r.end) ts.backend_thread = 1;
        }
      }
    }
  }
  return ts.backend_thread == 1;
}

// An op on a tensor subclass that redispatches to Python (the
// AsyncCollectiveTensor functional collectives return, DTensor) is not an
// op: the subclass's __torch_dispatch__ runs the real ones (the wait for the
// collective, the op on plain tensors). It is transparent for depth, so those
// are the top-level ops, with the user's call site.
bool HasPythonKey(const at::Tensor& t) {
  return t.defined() && t.key_set().has(c10::DispatchKey::Python);
}
bool RedispatchesToPython(const at::RecordFunction& fn) {
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor() && HasPythonKey(v.toTensor())) return true;
    if (v.isTensorList()) {
      // The list's IValues in place: no vector of tensors copied per op.
      for (const c10::IValue& t : v.toListRef()) {
        if (HasPythonKey(t.toTensor())) return true;
      }
    }
  }
  return false;
}

// Functional collectives (_c10d_functional::all_reduce, all_gather_into_tensor,
// reduce_scatter_tensor, ...: what DTensor, FSDP2 and compiled code issue)
// return their output while the collective still writes it, and
// _c10d_functional::wait_tensor is where the program waits for it. Neither
// is an op: the c10d op a functional collective runs (c10d::allreduce_, ...)
// is recorded as the collective, and its Completed record is taken by the
// end of the wait at the latest.
bool IsFunctionalCollective(const char* name) {
  return std::strncmp(name, "_c10d_functional", 16) == 0;
}
bool IsWaitTensor(const char* name) {
  const char* ns_end = std::strstr(name, "::");
  return ns_end != nullptr && std::strcmp(ns_end, "::wait_tensor") == 0;
}

// AOTAutograd runs a compiled graph's backward in one autograd node.
constexpr std::string_view kCompiledBackward = "CompiledFunctionBackward";

// Whether this thread runs code torch.compile made: inside a compiled region
// (compiled_regions.h) or the compiled backward's node. Its fused kernels
// run outside the dispatcher and write memory without bumping version
// counters, so fingerprints cached before or inside it may be stale.
bool InCompiledCode(const ThreadState& ts) {
  return ts.compiled_regions > 0 ||
         (ts.backward_nodes > 0 && !ts.nodes.empty() && ts.nodes.back().text == kCompiledBackward);
}


// Names and sites an op run inside an autograd node. Ops of the engine's own
// nodes carry the node ("aten::mm [AddmmBackward0]") and the call site of
// the forward op that created it. Ops run by Python code during backward (a
// custom Function's backward, a saved-tensor or tensor hook: the opguard
// package marks these regions) have their own call site, the backward line;
// run with grad enabled they are recompute ("aten::linear [recompute]":
// torch.utils.checkpoint, hand-written recompute), whose own autograd nodes
// map back to them. An op that has no site otherwise takes the user's frame
// on the training thread (the backward() call), never none.
void NameBackwardOp(const char* name, OpContext& ctx, ThreadState& ts) {
  const NodeName& node = ts.nodes.back();
  const bool python = !ts.python_regions.empty() &&
                      static_cast<int>(ts.nodes.size()) == ts.python_regions.back();
  const bool recompute = python && at::GradMode::is_enabled();
  static const NodeName kRecompute{"recompute", std::hash<std::string_view>()("recompute")};
  const NodeName& tag = recompute ? kRecompute : node;
  ctx.name = ts.names.GetBackward(name, tag.text, tag.hash);
  ctx.seq_nr = ts.node_seq;
  const uint64_t forward_site = ts.node_seq >= 0 ? g_forward_sites->Lookup(ts.node_seq) : 0;
  if (python) {
    ctx.site = FindUserSite().site;
    if (forward_site != ctx.site) ctx.forward_site = forward_site;
  } else {
    ctx.site = forward_site;
  }
  if (recompute) ctx.seq_begin = PeekSequenceNumber();
  if (ctx.site == 0 && std::this_thread::get_id() == g_adapter.main_thread) {
    ctx.site = ts.backward_calls > 0 ? ts.backward_site : FindUserSite().site;
  }
}

// Switching RecordFunction off and on again (torch rebuilds its thread-local
// callback lists both times) costs about as much as observing three or four
// nested ops: ops running fewer are left alone (callgrind on a small
// training loop: 2.080 M instructions per iteration with 4, 2.097 M with 1,
// 2.096 M never switching; 1.382 M without OpGuard).
constexpr uint64_t kNestedOpsWorthTheSwitch = 4;

// A Python torch.autograd.Function's apply(): torch wraps it in a
// FUNCTION-scope range named after the class (no "ns::" as dispatcher ops
// have). It is user code, not an op: transparent for depth, so the aten ops
// its forward runs are top-level ops with their own call sites, and its
// output is compared where those ops produce it. Its call site is kept as the
// forward site of the autograd node it creates.
bool IsAutogradFunction(const at::RecordFunction& fn) {
  return std::strstr(fn.name(), "::") == nullptr;
}

std::unique_ptr<at::ObserverContext> AutogradFunctionStart(ThreadState& ts) {
  if (!Recording() || ts.depth != 0 || ts.backward_nodes > 0 || ts.unrecorded_regions > 0) {
    return nullptr;
  }
  auto ctx = std::make_unique<OpContext>();
  ctx->site = FindUserSite().site;
  ctx->seq_begin = PeekSequenceNumber();
  return ctx;
}

// Whether this thread is the training thread, outside every region whose ops
// are not the training loop's own.
bool TrainingLoopOp(const ThreadState& ts) {
  return ts.backward_nodes == 0 && ts.callback_lanes.empty() && ts.unrecorded_regions == 0 &&
         std::this_thread::get_id() == g_adapter.main_thread;
}

// aten's in-place ops end in '_' and write their first argument.
bool IsInPlace(const char* name) {
  const size_t n = std::strlen(name);
  return n > 1 && name[n - 1] == '_' && name[n - 2] != '_';
}

// Kernel names (OPGUARD_KERNELS=1, docs/kernels.md): the kernels launched
// between the op's inputs being fingerprinted and its outputs being
// fingerprinted are the op's, so the fingerprint kernels are nobody's.
void BeginKernels(OpContext& ctx) {
  uint64_t key = 0;
  if (opguard_kernels_begin(&key) == OPGUARD_OK) ctx.kernels_key = key;
}

void EndKernels(const OpContext* ctx) {
  if (ctx != nullptr && ctx->kernels_key != 0) opguard_kernels_end(ctx->kernels_key);
}

// The op is not recorded (a gap, or nothing): its kernels are nobody's.
void DiscardKernels(const OpContext* ctx) {
  if (ctx != nullptr && ctx->kernels_key != 0) opguard_kernels_discard(ctx->kernels_key);
}

// Records the op `ctx` holds (its inputs and outputs collected) in `lane`;
// its autograd nodes map back to its call site.
void RecordOp(OpContext& ctx, uint32_t lane) {
  if (ctx.seq_begin >= 0) g_forward_sites->Add(ctx.seq_begin, PeekSequenceNumber(), ctx.site);
  ctx.Resolve();
  opguard_op op;
  std::memset(&op, 0, sizeof(op));
  op.struct_size = sizeof(op);
  op.lane = lane;
  op.op_index = OPGUARD_AUTO;
  op.name = ctx.name;
  op.site = ctx.site;
  op.forward_site = ctx.forward_site;
  op.flags = ctx.backward ? OPGUARD_OP_BACKWARD : 0;
  if (ctx.uninitialised_output) op.flags |= OPGUARD_OP_NONDETERMINISTIC;
  if (ctx.replicated) op.flags |= OPGUARD_OP_REPLICATED;
  if (ctx.trusted) op.flags |= OPGUARD_OP_TRUSTED;
  if (ctx.seq_nr >= 0) {
    op.seq_nr = ctx.seq_nr;
    op.flags |= OPGUARD_OP_HAS_SEQ_NR;
  }
  op.num_inputs = static_cast<uint32_t>(ctx.inputs.size());
  op.inputs = ctx.inputs.data();
  op.num_outputs = static_cast<uint32_t>(ctx.outputs.size());
  op.outputs = ctx.outputs.data();
  op.start_ns = ctx.start_ns;
  op.duration_ns = NowNs() - ctx.start_ns;
  op.kernels_key = ctx.kernels_key;
  opguard_record_op(&op, nullptr);
}

std::unique_ptr<at::ObserverContext> OnFunctionStart(const at::RecordFunction& fn, ThreadState& ts) {
  if (IsEngineWrapper(fn)) return nullptr;
  if (IsAutogradFunction(fn)) return AutogradFunctionStart(ts);
  // Whether recorded or not, an op must not write bytes whose fingerprint is
  // still being taken off this thread.
  AwaitPendingWrites(fn);
  // Only while recording: otherwise the op is depth-counted as any other
  // (balanced at its end), and unrecorded ops pay no scan of their inputs.
  if (Recording() && RedispatchesToPython(fn)) {
    // Remembered for the end, where the inputs are gone.
    auto ctx = std::make_unique<OpContext>();
    ctx->transparent = true;
    ++ts.subclass_dispatches;
    return ctx;
  }
  int depth = ts.depth++;
  if (depth > 0) ++ts.nested_calls;
  if (!Recording()) return nullptr;
  if (depth == 0 && TrainingLoopOp(ts)) BeforeTrainingOp(ts);
  // c10d's dispatcher ops (c10d::allreduce_, ...) return as soon as the work
  // is queued: their outputs are not final at op end, so they are not
  // recorded as ops but as collectives, with the outputs taken once the work
  // has completed (NativeCollectiveStart).
  //
  // Their in-place writes do not bump the tensors' version counters (torch
  // 1.13), so cached fingerprints of the tensors they were given are dropped
  // here: the next op that reads them hashes what the collective wrote.
  if (std::strncmp(fn.name(), "c10d::", 6) == 0) {
    for (const c10::IValue& v : fn.inputs()) ForgetTensors(v, ts);
    return NativeCollectiveStart(fn, ts);
  }
  // OpGuard's own collective ops (RegisterCollectiveOps) record themselves.
  if (std::strncmp(fn.name(), "opguard::", 9) == 0 || IsFunctionalCollective(fn.name())) {
    return nullptr;
  }
  // A backend's own ops while it runs a collective (gloo's all_gather copies
  // its flat buffer into the outputs on its worker thread) are the
  // collective's internals, shown by its Completed record.
  if (ts.callback_lanes.empty() && IsBackendThread(ts)) return nullptr;
  bool in_backward = ts.backward_nodes > 0 && !ts.nodes.empty();
  const bool all_depths = g_adapter.all_depths.load(std::memory_order_relaxed);
  if (depth != 0 && !all_depths) return nullptr;
  if (ts.unrecorded_regions > 0) return nullptr;
  if (InCompiledCode(ts)) {
    // The compiled backward is nested in its node as a region's graph is in
    // the region; at any depth, the fused kernels may have written this op's
    // inputs without a version bump: none comes from the cache.
    if (!all_depths) return nullptr;
    ts.cache.Clear();
  }
  if (AwaitingUpdate() && IsInPlace(fn.name()) && !fn.inputs().empty()) {
    InPlaceWrite(fn.inputs()[0]);
  }
  BeginCacheStep(ts);
  auto ctx = std::make_unique<OpContext>();
  ctx->start_ns = NowNs();
  ctx->backward = in_backward;
  ctx->replicated = OpensReplicated(ts);
  ctx->trusted = !ctx->replicated && IsTrustedOp(fn.name(), ts);
  if (in_backward) {
    NameBackwardOp(fn.name(), *ctx, ts);
  } else {
    ctx->name = ts.names.Get(fn.name());
    ctx->site = FindUserSite().site;
    ctx->seq_begin = PeekSequenceNumber();
  }
  CollectInputs(fn.inputs(), *ctx, ts);
  RememberWrittenTensors(fn, *ctx, ts);
  if (ts.subclass_dispatches > 0) {
    ctx->in_subclass_dispatch = true;
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().has_storage()) {
        ctx->input_storages.push_back(v.toTensor().storage().unsafeGetStorageImpl());
      }
    }
  }
  // The ops this one runs inside itself are not recorded (only depth 0 is):
  // switching RecordFunction off on this thread until the op ends spares
  // them the boxing of their inputs and outputs and both callbacks. Not
  // while another observer (torch.profiler) is registered on this thread,
  // or was registered globally before us: it still sees every op. The
  // switch costs more than it saves for ops that run few others (add_, mm),
  // so an op is switched only once its name has been seen running at least
  // kNestedOpsWorthTheSwitch nested ops (learnt while it runs with
  // RecordFunction on). A wrong guess costs time, never a record: nested ops
  // are not recorded either way.
  if (g_adapter.skip_nested.load(std::memory_order_relaxed) && !at::hasThreadLocalCallbacks()) {
    auto it = ts.nests.find(fn.name());
    if (it != ts.nests.end() && it->second == 2) {
      at::enableRecordFunction(false);
      ctx->reenable_record_function = true;
    } else {
      ctx->learn_nesting = true;
      ctx->nested_calls_at_start = ts.nested_calls;
    }
  }
  BeginKernels(*ctx);
  return ctx;
}

void OnFunctionEnd(const at::RecordFunction& fn, OpContext* ctx, ThreadState& ts) {
  if (IsAutogradFunction(fn)) {
    if (ctx != nullptr) g_forward_sites->Add(ctx->seq_begin, PeekSequenceNumber(), ctx->site);
    return;
  }
  if (ctx != nullptr && ctx->reenable_record_function) {
    at::enableRecordFunction(true);
    ctx->reenable_record_function = false;
  } else if (ctx != nullptr && ctx->learn_nesting) {
    if (ts.nests.size() >= 4096) ts.nests.clear();
    const uint64_t nested = ts.nested_calls - ctx->nested_calls_at_start;
    ts.nests.insert_or_assign(fn.name(), nested >= kNestedOpsWorthTheSwitch ? 2 : 1);
  }
  if (ctx != nullptr && ctx->transparent) --ts.subclass_dispatches;
  if (IsEngineWrapper(fn) || (ctx != nullptr && ctx->transparent)) return;
  EndKernels(ctx);
  --ts.depth;
  if (ctx == nullptr && IsFunctionalCollective(fn.name())) {
    // Until its wait returns, a functional collective's output is being
    // written: ops reading it before (views: AsyncCollectiveTensor waits only
    // for other ops) see bytes no two runs agree on, as with aten::empty's.
    const auto& out = fn.outputs();
    const at::Tensor first = !out.empty() && out[0].isTensor() ? out[0].toTensor() : at::Tensor();
    if (!IsWaitTensor(fn.name())) {
      for (const c10::IValue& v : out) {
        if (v.isTensor() && v.toTensor().defined()) ts.uninitialised.Add(v.toTensor());
      }
    } else if (first.defined()) {
      ts.uninitialised.Remove(first);
      RecordWaitedCollectives(first);
    }
    return;
  }
  if (ctx != nullptr && ctx->native != nullptr) {
    NativeCollectiveEnd(fn, *ctx);
    return;
  }
  if (ctx == nullptr || !Recording()) {
    DiscardKernels(ctx);
    return;
  }
  uint32_t lane = LaneOf(ts);
  if (ctx->in_subclass_dispatch) MarkUnversionedMemory(fn, *ctx, ts);
  if (ctx->unfingerprintable ||
      !CollectOutputs(fn.outputs(), HasUninitialisedOutput(fn.name()), *ctx, ts)) {
    DiscardKernels(ctx);
    if (ComputesNothing(fn)) return;  // not an op, nor a gap
    opguard_report_gap(lane, 1, "tensor without host bytes (device, sparse or quantized)", nullptr);
    return;
  }
  RecordOp(*ctx, lane);
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  ThreadState& ts = ThisThread();
  try {
    RecordCompletedNatives();
    if (fn.scope() == at::RecordScope::FUNCTION) OrderAfterOutputFingerprints(fn);
    switch (fn.scope()) {
      case at::RecordScope::FUNCTION:
        return OnFunctionStart(fn, ts);
      case at::RecordScope::BACKWARD_FUNCTION:
        ++ts.backward_nodes;
        ts.node_seq = fn.seqNr();
        ts.nodes.push_back(NodeNameOf(fn.name()));
        return nullptr;
      default:
        return nullptr;
    }
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error in the op start callback");
  }
  return nullptr;
}

void OnEnd(const at::RecordFunction& fn, at::ObserverContext* raw) {
  ThreadState& ts = ThisThread();
  try {
    switch (fn.scope()) {
      case at::RecordScope::FUNCTION:
        OnFunctionEnd(fn, static_cast<OpContext*>(raw), ts);
        break;
      case at::RecordScope::BACKWARD_FUNCTION:
        if (ts.backward_nodes > 0) --ts.backward_nodes;
        if (ts.backward_nodes == 0) ts.node_seq = -1;
        // What the compiled backward wrote (gradients) is read afresh.
        if (!ts.nodes.empty() && ts.nodes.back().text == kCompiledBackward) ts.cache.Clear();
        if (!ts.nodes.empty()) ts.nodes.pop_back();
        break;
      default:
        break;
    }
  } catch (const std::exception& e) {
    DisableOnce(e.what());
  } catch (...) {
    DisableOnce("unknown error in the op end callback");
  }
}

}  // namespace

// Two callbacks, so that torch boxes arguments only where they are read:
// ops (FUNCTION) with their inputs and outputs; autograd nodes
// (BACKWARD_FUNCTION: only their names and sequence numbers are read)
// without, which spares every backward node a vector of its input
// gradients. No USER_SCOPE: an observer of it makes every c10d work object
// capture the thread's state and open a profiling range of its own on the
// backend's thread, which each collective waits for; torch.optim's
// Optimizer.step range is told by the package instead
// (opguard_torch_optimizer_step_begin).
std::array<at::CallbackHandle, 2> AddObserverCallbacks() {
  return {at::addGlobalCallback(at::RecordFunctionCallback(&OnStart, &OnEnd)
                                    .needsInputs(true)
                                    .needsOutputs(true)
                                    .scopes({at::RecordScope::FUNCTION})),
          at::addGlobalCallback(
              at::RecordFunctionCallback(&OnStart, &OnEnd)
                  .scopes({at::RecordScope::BACKWARD_FUNCTION}))};
}

std::unique_ptr<OpContext> CompiledRegionStart(const std::string& name,
                                               c10::ArrayRef<c10::IValue> inputs,
                                               ThreadState& ts) {
  // ts.depth counts the opguard:: op that carries the call.
  const int depth = ts.depth - 1;
  if (!Recording() || ts.unrecorded_regions > 0) return nullptr;
  if (ts.callback_lanes.empty() && IsBackendThread(ts)) return nullptr;
  if (depth != 0 && !g_adapter.all_depths.load(std::memory_order_relaxed)) return nullptr;
  if (depth == 0 && TrainingLoopOp(ts)) BeforeTrainingOp(ts);
  BeginCacheStep(ts);
  auto ctx = std::make_unique<OpContext>();
  ctx->start_ns = NowNs();
  ctx->backward = ts.backward_nodes > 0 && !ts.nodes.empty();
  ctx->replicated = OpensReplicated(ts);
  if (ctx->backward) {
    NameBackwardOp(name.c_str(), *ctx, ts);
  } else {
    ctx->name = opguard_intern(name.data(), name.size());
    ctx->site = FindUserSite().site;
  }
  // Its autograd node (CompiledFunctionBackward) maps back to the call site.
  ctx->seq_begin = PeekSequenceNumber();
  CollectInputs(inputs, *ctx, ts);
  BeginKernels(*ctx);
  ++ts.depth;  // what the region runs is nested in it
  ++ts.compiled_regions;
  return ctx;
}

void CompiledRegionEnd(std::unique_ptr<OpContext> ctx, c10::ArrayRef<c10::IValue> outputs,
                       bool completed, ThreadState& ts) {
  --ts.depth;
  --ts.compiled_regions;
  // Its fused kernels wrote its outputs (and whatever of its inputs it
  // mutates) without version bumps: nothing cached before holds.
  ts.cache.Clear();
  EndKernels(ctx.get());
  if (!completed || !Recording()) {
    DiscardKernels(ctx.get());
    return;
  }
  const uint32_t lane = LaneOf(ts);
  if (ctx->unfingerprintable || !CollectOutputs(outputs, /*allocates=*/false, *ctx, ts)) {
    DiscardKernels(ctx.get());
    opguard_report_gap(lane, 1, "tensor without host bytes (device, sparse or quantized)", nullptr);
    return;
  }
  RecordOp(*ctx, lane);
}

bool RecordReplicaState(const std::string& name, at::TensorList state, uint64_t site,
                        ThreadState& ts) {
  if (!Recording() || g_adapter.paused.load() || ts.unrecorded_regions > 0) return false;
  BeginCacheStep(ts);
  auto ctx = std::make_unique<OpContext>();
  ctx->start_ns = NowNs();
  // Replica state is what replicas compare, whether or not the thread is in
  // the optimizer's step; outside a replicated region nothing cached before
  // counts, so every tensor is read from its bytes.
  if (!OpensReplicated(ts)) ts.replicated_since = ts.cache.Mark();
  ctx->replicated = true;
  ctx->name = opguard_intern(name.data(), name.size());
  ctx->site = site;
  const uint32_t lane = LaneOf(ts);
  // The state is the op's output: what the aligner compares. Hashed here,
  // never deferred to the shim's thread: in online SDC mode no op is
  // observed, so nothing would wait for the hash before the next step
  // writes the parameter.
  for (const at::Tensor& t : state) {
    opguard_tensor out;
    Shapes::At shape;
    if (!RecordTensor(t, *ctx, ts, &out, &shape, ts.replicated_since, /*may_defer=*/false)) {
      opguard_report_gap(lane, 1, "tensor without host bytes (device, sparse or quantized)",
                         nullptr);
      return false;
    }
    ctx->outputs.Add(out, shape);
  }
  RecordOp(*ctx, lane);
  return true;
}

// OPGUARD_NESTED_OPS: unset, empty or 0 = off, 1 = on; anything else warns
// once and keeps nested ops observed (the behaviour that cannot hide an op
// from another observer).
bool KeepNestedOps() {
  const char* value = std::getenv("OPGUARD_NESTED_OPS");
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") != 0) {
    std::fprintf(stderr,
                 "opguard-torch warning: OPGUARD_NESTED_OPS='%s' is not 0 or 1; treating it as 1\n",
                 value);
  }
  return true;
}


}  // namespace opguard::torch_adapter
