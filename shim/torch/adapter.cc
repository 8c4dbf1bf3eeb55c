// The PyTorch adapter: RecordFunction callbacks that turn aten ops into
// OpGuard op records through the shim's C API.
//
// What is recorded (docs/torch.md):
//  * forward: the top-level aten op of each call from user code (depth 0 of
//    the FUNCTION scope on that thread), or every aten op with
//    OPGUARD_DEPTH=all; inputs fingerprinted at op start, outputs at op end;
//  * backward: the top-level aten ops inside each autograd node, named
//    "aten::mm [AddmmBackward0]", carrying the node's sequence number and the
//    call site of the forward op that created the node;
//  * steps: the end of every Optimizer.step (torch wraps it in a USER_SCOPE
//    RecordFunction "Optimizer.step#<Class>.step"), or opguard.mark_step().
// Tensors that cannot be fingerprinted on the host (device tensors in a
// build without the CUDA path, sparse, quantized) make the op a reported gap,
// never a record with a made-up fingerprint.
//
// Rules of the shim apply: callbacks never throw into torch; any unexpected
// failure logs once and stops recording; training goes on.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "opguard/shim.h"
#include "python_frames.h"
#include "torch_compat.h"

namespace opguard::torch_adapter {
namespace {

constexpr uint32_t kMainLane = 0;
constexpr uint32_t kBackwardLane = 1;  // autograd worker threads (device backward)

std::atomic<bool> g_recording{false};
std::atomic<bool> g_registered{false};
std::atomic<bool> g_all_depths{false};
std::atomic<uint32_t> g_next_lane{2};
std::atomic<uint64_t> g_step{0};
std::thread::id g_main_thread;
at::CallbackHandle g_handle = 0;

void DisableOnce(const char* what) {
  if (g_recording.exchange(false)) {
    std::fprintf(stderr, "opguard-torch warning: %s; recording stopped, training continues\n", what);
  }
}

// Maps autograd sequence numbers to the forward op that created the nodes, so
// backward ops carry the forward op's call site. Entries of old steps are
// dropped to bound memory.
class ForwardSites {
 public:
  struct Entry {
    int64_t end;  // exclusive
    uint64_t site;
    uint64_t step;
  };
  void Add(int64_t begin, int64_t end, uint64_t site) {
    if (end <= begin || site == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    map_[begin] = Entry{end, site, g_step.load(std::memory_order_relaxed)};
    if (map_.size() > 1u << 20) map_.erase(map_.begin(), std::next(map_.begin(), 1 << 19));
  }
  uint64_t Lookup(int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.upper_bound(seq);
    if (it == map_.begin()) return 0;
    --it;
    return seq < it->second.end ? it->second.site : 0;
  }

 private:
  std::mutex mu_;
  std::map<int64_t, Entry> map_;
};
ForwardSites* g_forward_sites = new ForwardSites();

// Fingerprints of tensors seen on this thread, so the output of one op is not
// hashed again as the input of the next. An entry is valid while the storage
// object is alive (weak reference: a freed buffer whose address is reused
// never hits) and the tensor's version counter is unchanged.
class FingerprintCache {
 public:
  struct Key {
    const void* data;
    uint32_t version;
    uint8_t dtype;
    size_t layout_hash;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.data) ^ (k.layout_hash * 31) ^ k.version;
    }
  };
  struct Value {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    uint64_t lo, hi;
    opguard_tensor_stats stats;
    uint8_t has_stats;
  };

  const Value* Find(const Key& key, const c10::StorageImpl* storage) {
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    auto alive = it->second.storage.lock();
    if (!alive || alive.get() != storage) {
      map_.erase(it);
      return nullptr;
    }
    return &it->second;
  }
  void Put(const Key& key, Value value) {
    if (map_.size() >= 8192) map_.clear();
    map_.insert_or_assign(key, std::move(value));
  }
  void Clear() { map_.clear(); }

 private:
  std::unordered_map<Key, Value, KeyHash> map_;
};

// Storages holding freshly allocated, not yet written memory (outputs of
// aten::empty and friends), per thread. Their bytes differ from run to run by
// definition, and so do views of them (the detach/view an nn.Parameter makes
// of torch.empty before init.normal_ writes it). A storage leaves the set when
// an op writes a tensor it was given (in-place or out=: the output is one of
// the op's input tensors). The weak reference keeps a reused address from
// matching a new allocation.
class UninitialisedStorages {
 public:
  void Add(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    if (map_.size() >= 4096) map_.clear();
    map_.insert_or_assign(t.storage().unsafeGetStorageImpl(), t.storage().getWeakStorageImpl());
  }
  bool Contains(const at::Tensor& t) {
    if (map_.empty() || !t.defined() || !t.has_storage()) return false;
    auto it = map_.find(t.storage().unsafeGetStorageImpl());
    if (it == map_.end()) return false;
    auto alive = it->second.lock();
    if (!alive || alive.get() != t.storage().unsafeGetStorageImpl()) {
      map_.erase(it);
      return false;
    }
    return true;
  }
  void Remove(const at::Tensor& t) { map_.erase(t.storage().unsafeGetStorageImpl()); }

 private:
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> map_;
};

struct ThreadState {
  int depth = 0;           // FUNCTION scopes currently open on this thread
  int backward_nodes = 0;  // BACKWARD_FUNCTION scopes currently open
  int64_t node_seq = -1;   // innermost autograd node's sequence number
  std::string node_name;   // innermost autograd node's name ("AddmmBackward0")
  int64_t lane = -1;
  uint64_t cache_step = 0;
  FingerprintCache cache;
  UninitialisedStorages uninitialised;
};
thread_local ThreadState t_state;

uint32_t LaneOf(ThreadState& ts) {
  if (ts.lane < 0) {
    if (std::this_thread::get_id() == g_main_thread) {
      ts.lane = kMainLane;
    } else if (ts.backward_nodes > 0) {
      ts.lane = kBackwardLane;
    } else {
      ts.lane = g_next_lane.fetch_add(1);
    }
  }
  return static_cast<uint32_t>(ts.lane);
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Storage for everything an opguard_op points to, kept until the record call.
class OpContext : public at::ObserverContext {
 public:
  bool record = false;
  bool unfingerprintable = false;
  bool backward = false;
  uint64_t name = 0;
  uint64_t site = 0;
  int64_t seq_nr = -1;
  int64_t seq_begin = -1;
  uint64_t start_ns = 0;
  std::vector<opguard_value> inputs;
  std::vector<opguard_tensor> outputs;
  std::deque<std::vector<int64_t>> shapes;        // stable addresses for opguard_tensor::shape
  std::deque<std::vector<opguard_tensor>> lists;  // for TensorList inputs
  std::vector<const c10::TensorImpl*> input_impls;  // to tell writes (in-place, out=) from views
  bool uninitialised_output = false;
};


// Fills `out` with the tensor's fingerprint; false if it has no host bytes
// OpGuard can read.
bool FingerprintTensor(const at::Tensor& t, OpContext& ctx, ThreadState& ts, opguard_tensor* out) {
  std::memset(out, 0, sizeof(*out));
  if (!t.defined() || !t.device().is_cpu() || t.is_sparse() || t.is_quantized() ||
      t.is_mkldnn() || !t.has_storage()) {
    return false;
  }
  uint8_t dtype = ToOpGuardDType(t.scalar_type());
  if (dtype == OPGUARD_DTYPE_UNKNOWN) return false;
  auto& shape = ctx.shapes.emplace_back(t.sizes().begin(), t.sizes().end());
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  const void* data = t.numel() == 0 ? nullptr : t.data_ptr();
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();

  size_t layout_hash = shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    layout_hash = layout_hash * 1000003u ^ static_cast<size_t>(shape[i]);
    layout_hash = layout_hash * 1000003u ^ static_cast<size_t>(strides[i]);
  }
  FingerprintCache::Key key{data, TensorVersion(t), dtype, layout_hash};
  if (data != nullptr) {
    if (const auto* hit = ts.cache.Find(key, storage)) {
      out->fp_lo = hit->lo;
      out->fp_hi = hit->hi;
      out->stats = hit->stats;
      out->has_stats = hit->has_stats;
      out->dtype = dtype;
      out->device = -1;
      out->shape = shape.data();
      out->ndim = static_cast<uint32_t>(shape.size());
      return true;
    }
  }
  if (opguard_fingerprint_host(data, dtype, shape.data(), static_cast<uint32_t>(shape.size()),
                               strides.data(), out) != OPGUARD_OK) {
    return false;
  }
  out->shape = shape.data();
  if (data != nullptr) {
    ts.cache.Put(key, FingerprintCache::Value{t.storage().getWeakStorageImpl(), out->fp_lo,
                                              out->fp_hi, out->stats, out->has_stats});
  }
  return true;
}

// Scalars are recorded as their raw bits (a Python float is a double).
bool ScalarValue(const c10::IValue& v, opguard_value* out) {
  uint64_t bits = 0;
  if (v.isDouble()) {
    double d = v.toDouble();
    std::memcpy(&bits, &d, sizeof(d));
    out->scalar_dtype = OPGUARD_DTYPE_FLOAT64;
  } else if (v.isInt()) {
    int64_t i = v.toInt();
    std::memcpy(&bits, &i, sizeof(i));
    out->scalar_dtype = OPGUARD_DTYPE_INT64;
  } else if (v.isBool()) {
    bits = v.toBool() ? 1 : 0;
    out->scalar_dtype = OPGUARD_DTYPE_BOOL;
  } else {
    return false;
  }
  out->kind = OPGUARD_VALUE_SCALAR;
  out->scalar_bits = bits;
  return true;
}

void CollectInputs(const at::RecordFunction& fn, OpContext& ctx, ThreadState& ts) {
  auto inputs = fn.inputs();
  ctx.inputs.reserve(inputs.size());
  for (const c10::IValue& v : inputs) {
    opguard_value value;
    std::memset(&value, 0, sizeof(value));
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined()) {
        ctx.input_impls.push_back(t.unsafeGetTensorImpl());
        if (!FingerprintTensor(t, ctx, ts, &value.tensor)) ctx.unfingerprintable = true;
        value.kind = OPGUARD_VALUE_TENSOR;
      }
    } else if (v.isTensorList()) {
      auto& list = ctx.lists.emplace_back();
      for (const at::Tensor& t : v.toTensorList().vec()) {
        opguard_tensor tensor;
        if (!FingerprintTensor(t, ctx, ts, &tensor)) ctx.unfingerprintable = true;
        list.push_back(tensor);
      }
      value.kind = OPGUARD_VALUE_TENSOR_LIST;
      value.num_tensors = static_cast<uint32_t>(list.size());
      value.tensors = list.data();
    } else {
      ScalarValue(v, &value);  // others (None, int lists, strings): recorded as None
    }
    ctx.inputs.push_back(value);
  }
}

bool HasUninitialisedOutput(const char* name);

// Tracks uninitialised memory through one output: allocations add it, writes
// (the output is one of the op's own input tensors) clear it, anything else
// that returns a view of it is itself uninitialised.
void TrackUninitialised(const at::RecordFunction& fn, const at::Tensor& t, OpContext& ctx,
                        ThreadState& ts) {
  if (HasUninitialisedOutput(fn.name())) {
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

bool CollectOutputs(const at::RecordFunction& fn, OpContext& ctx, ThreadState& ts) {
  for (const c10::IValue& v : fn.outputs()) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      TrackUninitialised(fn, t, ctx, ts);
      opguard_tensor out;
      if (!FingerprintTensor(t, ctx, ts, &out)) return false;
      ctx.outputs.push_back(out);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        TrackUninitialised(fn, t, ctx, ts);
        opguard_tensor out;
        if (!FingerprintTensor(t, ctx, ts, &out)) return false;
        ctx.outputs.push_back(out);
      }
    }
  }
  return true;
}

std::string NodeName(const char* name) {
  static constexpr std::string_view kPrefix = "autograd::engine::evaluate_function: ";
  std::string_view view(name);
  if (view.substr(0, kPrefix.size()) == kPrefix) view.remove_prefix(kPrefix.size());
  return std::string(view);
}

// The shim's current step is process-wide, so one mark (on the lane that ran
// the optimizer) moves every lane to the next step.
void MarkStep(ThreadState& ts) {
  uint64_t step = g_step.fetch_add(1) + 1;
  opguard_mark_step(LaneOf(ts), step);
}

// Ops whose outputs are freshly allocated, uninitialised memory: their bytes
// differ from run to run by definition. They are recorded (shapes and order
// still anchor the alignment's structure) but flagged so that their
// fingerprints are never used as evidence of a divergence.
bool HasUninitialisedOutput(const char* name) {
  static constexpr std::string_view kNames[] = {
      "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
      "aten::new_empty_strided", "aten::resize_", "aten::resize_as_"};
  for (std::string_view candidate : kNames) {
    if (candidate == name) return true;
  }
  return false;
}

// The autograd engine wraps each node it runs in a FUNCTION-scope range
// "autograd::engine::evaluate_function: <Node>" (the node itself follows as a
// BACKWARD_FUNCTION range). It is not an op: it is transparent for depth, so
// the aten ops the node runs are top-level backward ops.
bool IsEngineWrapper(const at::RecordFunction& fn) {
  return std::strncmp(fn.name(), "autograd::engine::evaluate_function: ", 37) == 0;
}

std::unique_ptr<at::ObserverContext> OnFunctionStart(const at::RecordFunction& fn, ThreadState& ts) {
  if (IsEngineWrapper(fn)) return nullptr;
  int depth = ts.depth++;
  if (!g_recording.load(std::memory_order_relaxed)) return nullptr;
  bool in_backward = ts.backward_nodes > 0;
  if (depth != 0 && !g_all_depths.load(std::memory_order_relaxed)) return nullptr;
  // c10d's dispatcher ops (c10d::allreduce_, ...) return as soon as the work
  // is queued: their outputs are not final at op end, so fingerprinting them
  // here would record a racy, half-reduced buffer. The opguard package
  // records collectives instead, with outputs taken after completion.
  if (std::strncmp(fn.name(), "c10d::", 6) == 0) return nullptr;
  if (ts.cache_step != g_step.load(std::memory_order_relaxed)) {
    ts.cache.Clear();  // bound the cache to one step's tensors
    ts.cache_step = g_step.load(std::memory_order_relaxed);
  }
  auto ctx = std::make_unique<OpContext>();
  ctx->record = true;
  ctx->start_ns = NowNs();
  ctx->backward = in_backward;
  if (in_backward) {
    std::string name = std::string(fn.name()) + " [" + ts.node_name + "]";
    ctx->name = opguard_intern(name.data(), name.size());
    ctx->seq_nr = ts.node_seq;
    ctx->site = ts.node_seq >= 0 ? g_forward_sites->Lookup(ts.node_seq) : 0;
  } else {
    const char* name = fn.name();
    ctx->name = opguard_intern(name, std::strlen(name));
    ctx->site = FindUserSite().site;
    ctx->seq_begin = PeekSequenceNumber();
  }
  CollectInputs(fn, *ctx, ts);
  return ctx;
}

void OnFunctionEnd(const at::RecordFunction& fn, OpContext* ctx, ThreadState& ts) {
  if (IsEngineWrapper(fn)) return;
  --ts.depth;
  if (ctx == nullptr || !ctx->record || !g_recording.load(std::memory_order_relaxed)) return;
  uint32_t lane = LaneOf(ts);
  if (ctx->unfingerprintable || !CollectOutputs(fn, *ctx, ts)) {
    opguard_report_gap(lane, 1, "tensor without host bytes (device, sparse or quantized)", nullptr);
    return;
  }
  if (!ctx->backward) g_forward_sites->Add(ctx->seq_begin, PeekSequenceNumber(), ctx->site);
  opguard_op op;
  std::memset(&op, 0, sizeof(op));
  op.struct_size = sizeof(op);
  op.lane = lane;
  op.op_index = OPGUARD_AUTO;
  op.name = ctx->name;
  op.site = ctx->site;
  op.flags = ctx->backward ? OPGUARD_OP_BACKWARD : 0;
  if (ctx->uninitialised_output) op.flags |= OPGUARD_OP_NONDETERMINISTIC;
  if (ctx->seq_nr >= 0) {
    op.seq_nr = ctx->seq_nr;
    op.flags |= OPGUARD_OP_HAS_SEQ_NR;
  }
  op.num_inputs = static_cast<uint32_t>(ctx->inputs.size());
  op.inputs = ctx->inputs.data();
  op.num_outputs = static_cast<uint32_t>(ctx->outputs.size());
  op.outputs = ctx->outputs.data();
  op.start_ns = ctx->start_ns;
  op.duration_ns = NowNs() - ctx->start_ns;
  opguard_record_op(&op, nullptr);
}

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  ThreadState& ts = t_state;
  try {
    switch (fn.scope()) {
      case at::RecordScope::FUNCTION:
        return OnFunctionStart(fn, ts);
      case at::RecordScope::BACKWARD_FUNCTION:
        ++ts.backward_nodes;
        ts.node_seq = fn.seqNr();
        ts.node_name = NodeName(fn.name());
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
  ThreadState& ts = t_state;
  try {
    switch (fn.scope()) {
      case at::RecordScope::FUNCTION:
        OnFunctionEnd(fn, static_cast<OpContext*>(raw), ts);
        break;
      case at::RecordScope::BACKWARD_FUNCTION:
        if (ts.backward_nodes > 0) --ts.backward_nodes;
        if (ts.backward_nodes == 0) ts.node_seq = -1;
        break;
      case at::RecordScope::USER_SCOPE:
        if (g_recording.load(std::memory_order_relaxed) &&
            std::strncmp(fn.name(), "Optimizer.step#", 15) == 0) {
          MarkStep(ts);
        }
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
}  // namespace opguard::torch_adapter

using namespace opguard::torch_adapter;

extern "C" {

// Registers the callbacks (once) and starts recording. `all_depths`: record
// every aten op rather than the top-level ones. `skip_prefixes`: ':'-separated
// path prefixes that are not user code (torch, OpGuard, the stdlib). Called
// from Python on the thread that will be lane 0. Returns 1 if recording.
__attribute__((visibility("default"))) int opguard_torch_enable(int all_depths,
                                                                const char* skip_prefixes) {
  try {
    if (opguard_init() != 1) return 0;
    std::vector<std::string> prefixes;
    std::stringstream stream(skip_prefixes ? skip_prefixes : "");
    for (std::string item; std::getline(stream, item, ':');) {
      if (!item.empty()) prefixes.push_back(item);
    }
    SetSkippedPathPrefixes(std::move(prefixes));
    g_all_depths.store(all_depths != 0);
    if (!g_registered.exchange(true)) {
      g_main_thread = std::this_thread::get_id();
      g_handle = at::addGlobalCallback(
          at::RecordFunctionCallback(&OnStart, &OnEnd)
              .needsInputs(true)
              .needsOutputs(true)
              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                       at::RecordScope::USER_SCOPE}));
    }
    g_recording.store(true);
    return 1;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
    return 0;
  }
}

// Stops recording (the callbacks stay registered but return at once).
__attribute__((visibility("default"))) void opguard_torch_disable(void) {
  g_recording.store(false);
}

// Explicit step boundary, for loops without a torch.optim optimizer.
__attribute__((visibility("default"))) uint64_t opguard_torch_mark_step(void) {
  if (g_recording.load()) MarkStep(t_state);
  return g_step.load();
}

// The current step and the calling thread's lane (collectives recorded from
// Python use the same lane numbering as the ops around them).
__attribute__((visibility("default"))) uint64_t opguard_torch_step(void) { return g_step.load(); }
__attribute__((visibility("default"))) uint32_t opguard_torch_lane(void) {
  return LaneOf(t_state);
}

}  // extern "C"
