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
//    RecordFunction "Optimizer.step#<Class>.step"), or opguard.mark_step();
//  * replicated ops: every op recorded while its thread is inside an
//    Optimizer.step or an opguard.replicated() region is flagged
//    OPGUARD_OP_REPLICATED (data-parallel replicas must agree on its bits).
// Tensors that cannot be fingerprinted on the host (device tensors in a
// build without the CUDA path, sparse, quantized) make the op a reported gap,
// never a record with a made-up fingerprint.
//
// Rules of the shim apply: callbacks never throw into torch; any unexpected
// failure logs once and stops recording; training goes on.
#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>  // ElfW, for dladdr1's symbol entry
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "opguard/shim.h"
#include "python_frames.h"
#include "torch_compat.h"

namespace opguard::torch_adapter {
namespace {

constexpr uint32_t kMainLane = 0;
constexpr uint32_t kBackwardLane = 1;  // autograd worker threads (device backward)
// Ops run inside future callbacks the opguard package wrapped (a DDP comm
// hook's `fut.then(decompress)`) run inline on the thread that calls then()
// or later on a backend's thread, and callbacks of different futures finish
// in any order (DDP's buckets on gloo's two threads): neither the running
// thread nor one shared lane is the same from run to run. Where then() is
// called is the same: each callback's lane follows from the lane that
// registered it and how many callbacks that lane registered before it in the
// step (CallbackLane).
constexpr uint32_t kFirstCallbackLane = 3072;
constexpr uint32_t kCallbackLanes = 1024;  // lanes 3072..4095; threads get 2..3071

std::atomic<bool> g_recording{false};
std::atomic<bool> g_registered{false};
std::atomic<bool> g_all_depths{false};
std::atomic<bool> g_paused{false};  // opguard.paused(): callbacks unregistered
// Nested ops are switched off inside recorded top-level ops (see
// OnFunctionStart): only with the default depth and no foreign global observer.
std::atomic<bool> g_skip_nested{false};
std::atomic<uint32_t> g_next_lane{2};
std::atomic<uint64_t> g_step{0};
std::thread::id g_main_thread;
// The registered callbacks (see AddCallbacks); zero while paused.
std::array<at::CallbackHandle, 2> g_handles{};
bool g_foreign_global_observer = false;  // a global RecordFunction observer before ours

void DisableOnce(const char* what) {
  if (g_recording.exchange(false)) {
    std::fprintf(stderr, "opguard-torch warning: %s; recording stopped, training continues\n", what);
  }
}

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

// Fingerprints of tensors seen on this thread, so the output of one op is not
// hashed again as the input of the next. An entry is valid while its weak
// reference still points at the tensor's storage object (a weak reference
// keeps the object's memory, so its address cannot be taken by a new
// storage) and the tensor's version counter is unchanged.
//
// A fixed table indexed by a hash of the key, one entry per slot: a new entry
// replaces whatever held its slot, which only costs a later miss. Nothing is
// allocated per entry, and a whole step's entries are dropped by moving to
// the next epoch.
class FingerprintCache {
 public:
  // Contiguous tensors are keyed by their bytes (`extent` = byte length),
  // whatever their shape; strided ones by their layout (`extent` = a hash of
  // sizes and strides).
  struct Key {
    const void* data;
    uint32_t version;
    uint8_t dtype;
    bool contiguous;
    size_t extent;
    bool operator==(const Key&) const = default;
  };
  struct Value {
    // (weak references have no default constructor: an empty one is made
    // from an empty strong reference)
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    uint64_t lo = 0, hi = 0;  // the fingerprint under the layout hashed in `layout_hash`
    opguard_tensor_stats stats{};
    uint8_t has_stats = 0;
    opguard_byte_sums sums{};  // contiguous entries: other shapes are finalized from these
    size_t layout_hash = 0;
  };

  const Value* Find(const Key& key, const c10::StorageImpl* storage) {
    Slot& slot = slots_[SlotOf(key)];
    if (slot.epoch != epoch_ || !(slot.key == key) ||
        slot.value.storage._unsafe_get_target() != storage) {
      return nullptr;
    }
    if (!written_.empty()) {
      auto w = written_.find(storage);
      if (w != written_.end() && slot.generation < w->second) {
        slot.epoch = 0;
        return nullptr;
      }
    }
    return &slot.value;
  }
  void Put(const Key& key, Value value) {
    if (written_.size() >= 4096) Clear();
    Slot& slot = slots_[SlotOf(key)];
    slot.key = key;
    slot.value = std::move(value);
    slot.generation = generation_;
    slot.epoch = epoch_;
  }
  // Drops every entry (their weak references go when their slots are reused).
  void Clear() {
    ++epoch_;
    written_.clear();
  }
  // The storage's bytes changed without a version bump: entries of it (any
  // view) put before now are stale. O(1); Find drops them lazily.
  void StorageWritten(const c10::StorageImpl* storage) { written_[storage] = ++generation_; }

 private:
  static constexpr size_t kSlots = 4096;  // a power of two
  struct Slot {
    Key key{};
    Value value{};
    uint64_t generation = 0;
    uint64_t epoch = 0;  // valid only when equal to the cache's
  };
  static size_t SlotOf(const Key& k) {
    uint64_t h = reinterpret_cast<uintptr_t>(k.data) ^ (k.extent * 0x9E3779B97F4A7C15ull) ^
                 (uint64_t{k.version} << 32) ^ k.dtype;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return (h ^ (h >> 32)) & (kSlots - 1);
  }
  std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
  uint64_t epoch_ = 1;
  // Storages written behind the version counter, by the generation of their
  // last such write; entries put before it are stale.
  std::unordered_map<const c10::StorageImpl*, uint64_t> written_;
  uint64_t generation_ = 0;
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
    if (map_.size() >= 4096) Clear();
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    map_.insert_or_assign(storage, t.storage().getWeakStorageImpl());
    filter_[FilterBit(storage) / 64] |= uint64_t{1} << (FilterBit(storage) % 64);
  }
  // Most outputs are fresh storages: a bit filter in front of the map
  // answers them without a hash lookup. A storage found in the map is the
  // one it was added as (its weak reference keeps the address from reuse).
  bool Contains(const at::Tensor& t) {
    if (map_.empty() || !t.defined() || !t.has_storage()) return false;
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if ((filter_[FilterBit(storage) / 64] >> (FilterBit(storage) % 64) & 1) == 0) return false;
    return map_.count(storage) != 0;
  }
  void Remove(const at::Tensor& t) { Remove(t.storage().unsafeGetStorageImpl()); }
  void Remove(const c10::StorageImpl* storage) {
    if (!map_.empty()) map_.erase(storage);
  }

 private:
  static constexpr size_t kFilterBits = 1u << 15;
  static size_t FilterBit(const c10::StorageImpl* storage) {
    return (reinterpret_cast<uintptr_t>(storage) * 0x9E3779B97F4A7C15ull >> 40) % kFilterBits;
  }
  void Clear() {
    map_.clear();
    filter_.fill(0);
  }
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> map_;
  std::array<uint64_t, kFilterBits / 64> filter_{};
};

// Storages that completed collectives wrote, in completion order. A
// collective writes its outputs after its op has returned, on the backend's
// thread and behind the version counter, so an entry a thread cached for
// them earlier (the inputs hashed at launch) would hide what it wrote. Every
// thread's cache drops its entries of these storages before it next
// fingerprints a tensor (FingerprintTensor), whichever thread took the
// Completed record: with the entry dropped only on that thread, an op
// reading an all-reduced DDP bucket showed the launch bytes or the reduced
// ones from run to run.
class CollectiveWrites {
 public:
  void Add(const c10::StorageImpl* storage) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t count = count_.load(std::memory_order_relaxed);
    ring_[count % kKept] = storage;
    count_.store(count + 1, std::memory_order_release);
  }
  uint64_t Count() const { return count_.load(std::memory_order_acquire); }
  // Marks the writes after `seen` in `cache` (clears a cache that fell more
  // than the ring behind) and takes the storages out of `uninitialised` (a
  // buffer torch.empty made for a broadcast to fill holds data now); moves
  // `seen` to the end.
  void Apply(uint64_t& seen, FingerprintCache& cache, UninitialisedStorages& uninitialised) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t count = count_.load(std::memory_order_relaxed);
    if (count - seen > kKept) {
      cache.Clear();
    } else {
      for (uint64_t i = seen; i < count; ++i) {
        cache.StorageWritten(ring_[i % kKept]);
        uninitialised.Remove(ring_[i % kKept]);
      }
    }
    seen = count;
  }

 private:
  static constexpr uint64_t kKept = 4096;
  std::mutex mu_;
  std::array<const c10::StorageImpl*, kKept> ring_{};
  std::atomic<uint64_t> count_{0};
};
// Never destroyed: backend threads may complete collectives during exit.
CollectiveWrites* g_collective_writes = new CollectiveWrites();

// Interned names by the address of the name RecordFunction hands out. Names
// of dispatcher ops are the operator's schema name, which lives as long as the
// process; other names may live in the RecordFunction itself, so a hit is
// only taken when the text is still the same (the address may be reused).
class NameIds {
 public:
  uint64_t Get(const char* name) {
    auto it = by_ptr_.find(name);
    if (it != by_ptr_.end() && it->second.text == name) return it->second.id;
    uint64_t id = opguard_intern(name, std::strlen(name));
    if (by_ptr_.size() >= 4096) by_ptr_.clear();
    by_ptr_.insert_or_assign(name, Entry{name, id});
    return id;
  }
  // "aten::mm [AddmmBackward0]" for op `name` inside autograd node `node`
  // (its text and a hash of it). A hit compares texts, builds no string.
  uint64_t GetBackward(const char* name, std::string_view node, size_t node_hash) {
    const BackwardKey key{name, node_hash};
    auto it = by_node_.find(key);
    if (it != by_node_.end() && it->second.node == node && it->second.text == name) {
      return it->second.id;
    }
    std::string text = std::string(name) + " [" + std::string(node) + "]";
    uint64_t id = opguard_intern(text.data(), text.size());
    if (by_node_.size() >= 4096) by_node_.clear();
    by_node_.insert_or_assign(key, BackwardEntry{name, std::string(node), id});
    return id;
  }

 private:
  struct Entry {
    std::string text;
    uint64_t id;
  };
  struct BackwardKey {
    const char* name;
    size_t node_hash;
    bool operator==(const BackwardKey&) const = default;
  };
  struct BackwardKeyHash {
    size_t operator()(const BackwardKey& k) const {
      return std::hash<const char*>()(k.name) ^ (k.node_hash * 0x9E3779B97F4A7C15ull);
    }
  };
  struct BackwardEntry {
    std::string text;  // the op's name
    std::string node;
    uint64_t id;
  };
  std::unordered_map<const char*, Entry> by_ptr_;
  std::unordered_map<BackwardKey, BackwardEntry, BackwardKeyHash> by_node_;
};

// An autograd node being run: its name ("AddmmBackward0") as RecordFunction
// holds it (alive until the node's scope ends), and a hash of it.
struct NodeName {
  std::string_view text;
  size_t hash;
};

struct ThreadState {
  int depth = 0;           // FUNCTION scopes currently open on this thread
  int backward_nodes = 0;  // BACKWARD_FUNCTION scopes currently open
  int64_t node_seq = -1;   // innermost autograd node's sequence number
  c10::SmallVector<NodeName, 4> nodes;  // autograd nodes being run, innermost last
  int64_t lane = -1;
  int8_t backend_thread = -1;  // runs a c10d backend's work loop (see IsBackendThread); -1 unknown
  int optimizer_steps = 0;     // Optimizer.step scopes currently open
  int replicated_regions = 0;  // opguard.replicated() regions currently open
  int unrecorded_regions = 0;  // DataLoader work on this thread (opguard/_data.py)
  // Lanes of the future callbacks running on this thread, innermost last (a
  // callback can run inline inside another one's then()).
  c10::SmallVector<uint32_t, 2> callback_lanes;
  // Communicator the opguard package announced for the next process group
  // this thread uses that OpGuard does not know yet (0: none).
  uint64_t announced_communicator = 0;
  uint64_t cache_step = 0;
  FingerprintCache cache;
  uint64_t collective_writes_seen = 0;  // g_collective_writes applied to `cache`
  UninitialisedStorages uninitialised;
  NameIds names;
  std::vector<uint8_t> gather;  // strided tensors in logical order (GatherLogical)
  uint64_t nested_calls = 0;    // FUNCTION scopes opened below depth 0, ever
  // Whether ops run other ops inside themselves, by the address of their
  // name: 1 seen without nested ops, 2 seen with (see OnFunctionStart).
  std::unordered_map<const char*, uint8_t> nests;
};
thread_local ThreadState t_state;

uint32_t LaneOf(ThreadState& ts) {
  if (!ts.callback_lanes.empty()) return ts.callback_lanes.back();
  if (ts.lane < 0) {
    if (std::this_thread::get_id() == g_main_thread) {
      ts.lane = kMainLane;
    } else if (ts.backward_nodes > 0) {
      ts.lane = kBackwardLane;
    } else {
      // Past the thread lanes, late threads share the last one.
      ts.lane = std::min(g_next_lane.fetch_add(1), kFirstCallbackLane - 1);
    }
  }
  return static_cast<uint32_t>(ts.lane);
}

// Callbacks registered so far in the step, per registering lane.
struct CallbackCount {
  uint64_t step = 0;
  uint32_t count = 0;
};
std::mutex g_callback_counts_mu;
std::unordered_map<uint32_t, CallbackCount> g_callback_counts;

// The lane of the callback the calling thread registers now: the k-th
// registered in this step by lane r runs on lane 3072 + (512 r + k) mod 1024,
// so the training thread's and the autograd thread's first 512 callbacks of
// a step each have a lane of their own, reused step after step (a step's
// callbacks have run by the next one). Past that, or from other threads,
// callbacks share lanes, which keeps their order only while the sharers do
// not run at the same time.
uint32_t CallbackLane() {
  uint32_t registering = LaneOf(t_state);
  uint64_t step = g_step.load(std::memory_order_relaxed);
  uint32_t k;
  {
    std::lock_guard<std::mutex> lock(g_callback_counts_mu);
    CallbackCount& c = g_callback_counts[registering];
    if (c.step != step) c = CallbackCount{step, 0};
    k = c.count++;
  }
  return kFirstCallbackLane + (registering * 512u + k) % kCallbackLanes;
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

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

struct NativeCollective;  // a collective seen at c10d's dispatcher (see below)

// Storage for everything an opguard_op points to, kept until the record call.
// Shapes and tensor lists live in flat arrays that may grow while the op is
// collected, so opguard_tensor::shape and opguard_value::tensors hold offsets
// into them (see AsOffset) until Resolve() turns them into pointers.
class OpContext final : public at::ObserverContext {
 public:
  static void* operator new(size_t size) {
    if (size == sizeof(OpContext) && !t_pool_gone && t_pool.count > 0) {
      return t_pool.blocks[--t_pool.count];
    }
    return ::operator new(size);
  }
  static void operator delete(void* p, size_t size) {
    if (size == sizeof(OpContext) && !t_pool_gone && t_pool.count < ContextPool::kMax) {
      t_pool.blocks[t_pool.count++] = p;
      return;
    }
    ::operator delete(p);
  }

  bool unfingerprintable = false;
  bool backward = false;
  bool uninitialised_output = false;
  bool reenable_record_function = false;  // nested ops were switched off at start
  bool learn_nesting = false;  // RecordFunction left on: see whether nested ops run
  uint64_t nested_calls_at_start = 0;
  bool replicated = false;  // in Optimizer.step or opguard.replicated() at start
  std::shared_ptr<NativeCollective> native;  // set for c10d ops: see NativeCollectiveStart
  uint64_t name = 0;
  uint64_t site = 0;
  int64_t seq_nr = -1;
  int64_t seq_begin = -1;
  uint64_t start_ns = 0;
  c10::SmallVector<opguard_value, 8> inputs;
  c10::SmallVector<opguard_tensor, 4> outputs;
  c10::SmallVector<int64_t, 48> dims;              // every tensor's shape, back to back
  c10::SmallVector<opguard_tensor, 8> list_tensors;  // TensorList inputs, back to back
  c10::SmallVector<const c10::TensorImpl*, 8> input_impls;  // to tell writes from views

  static const int64_t* AsOffset(size_t offset) {
    return reinterpret_cast<const int64_t*>(static_cast<uintptr_t>(offset));
  }
  void ResolveTensor(opguard_tensor& t) const {
    t.shape = dims.data() + reinterpret_cast<uintptr_t>(t.shape);
  }
  void Resolve() {
    for (opguard_tensor& t : list_tensors) ResolveTensor(t);
    for (opguard_value& v : inputs) {
      if (v.kind == OPGUARD_VALUE_TENSOR) {
        ResolveTensor(v.tensor);
      } else if (v.kind == OPGUARD_VALUE_TENSOR_LIST) {
        v.tensors = list_tensors.data() + reinterpret_cast<uintptr_t>(v.tensors);
      }
    }
    for (opguard_tensor& t : outputs) ResolveTensor(t);
  }
};

// Copies `count` elements of `T` that lie `stride` elements apart.
template <typename T>
inline void CopyStrided(uint8_t* out, const uint8_t* src, int64_t count, int64_t stride) {
  for (int64_t i = 0; i < count; ++i, src += stride * static_cast<int64_t>(sizeof(T))) {
    T v;
    std::memcpy(&v, src, sizeof(T));
    std::memcpy(out + i * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
  }
}

// Copies the elements of a strided tensor into `buf` in logical (row-major)
// order. False (nothing copied) above kMaxGatherBytes: the fingerprint then
// reads the strided tensor itself.
//
// Dimensions of size 1 are dropped and neighbours that are contiguous with
// each other merged first, so that a transposed view walks as few rows as
// its layout allows; rows whose elements lie apart are copied by element
// size (views of weights and attention heads: most strided tensors here).
constexpr size_t kMaxGatherBytes = 1u << 20;
bool GatherLogical(const void* data, size_t element_size, at::IntArrayRef sizes,
                   at::IntArrayRef strides, std::vector<uint8_t>& buf) {
  size_t numel = 1;
  for (int64_t d : sizes) numel *= static_cast<size_t>(d);
  if (sizes.empty() || numel == 0 || numel * element_size > kMaxGatherBytes) return false;
  c10::SmallVector<int64_t, 8> size, stride;  // collapsed, outermost first
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (!size.empty() && stride.back() == strides[d] * sizes[d]) {
      size.back() *= sizes[d];
      stride.back() = strides[d];
    } else {
      size.push_back(sizes[d]);
      stride.push_back(strides[d]);
    }
  }
  if (size.empty()) {  // a single element
    size.push_back(1);
    stride.push_back(1);
  }
  buf.resize(numel * element_size);
  const size_t ndim = size.size();
  const auto* base = static_cast<const uint8_t*>(data);
  uint8_t* out = buf.data();
  const int64_t inner = size[ndim - 1];
  const int64_t inner_stride = stride[ndim - 1];
  const size_t row_bytes = static_cast<size_t>(inner) * element_size;
  c10::SmallVector<int64_t, 8> index(ndim, 0);
  int64_t row_offset = 0;  // in elements, of index[0 .. ndim-2]
  for (size_t done = 0; done < numel; done += static_cast<size_t>(inner), out += row_bytes) {
    const uint8_t* src = base + row_offset * static_cast<int64_t>(element_size);
    if (inner_stride == 1) {
      std::memcpy(out, src, row_bytes);
    } else {
      switch (element_size) {
        case 1: CopyStrided<uint8_t>(out, src, inner, inner_stride); break;
        case 2: CopyStrided<uint16_t>(out, src, inner, inner_stride); break;
        case 4: CopyStrided<uint32_t>(out, src, inner, inner_stride); break;
        case 8: CopyStrided<uint64_t>(out, src, inner, inner_stride); break;
        default:
          for (int64_t i = 0; i < inner; ++i) {
            std::memcpy(out + i * static_cast<int64_t>(element_size),
                        src + i * inner_stride * static_cast<int64_t>(element_size), element_size);
          }
      }
    }
    for (size_t d = ndim - 1; d-- > 0;) {
      row_offset += stride[d];
      if (++index[d] < size[d]) break;
      row_offset -= stride[d] * size[d];
      index[d] = 0;
    }
  }
  return true;
}

// Fills `out` with the tensor's fingerprint (its shape as an offset into
// ctx.dims); false if it has no host bytes OpGuard can read. `cached`: a
// fingerprint cached for the same bytes may be used.
bool FingerprintTensor(const at::Tensor& t, OpContext& ctx, ThreadState& ts, opguard_tensor* out,
                       bool cached = true) {
  std::memset(out, 0, sizeof(*out));
  if (!t.defined() || !t.device().is_cpu() || t.is_sparse() || t.is_quantized() ||
      t.is_mkldnn() || !t.has_storage()) {
    return false;
  }
  uint8_t dtype = ToOpGuardDType(t.scalar_type());
  if (dtype == OPGUARD_DTYPE_UNKNOWN) return false;
  at::IntArrayRef sizes = t.sizes();
  at::IntArrayRef strides = t.strides();
  const size_t offset = ctx.dims.size();
  ctx.dims.append(sizes.begin(), sizes.end());
  const void* data = t.numel() == 0 ? nullptr : t.data_ptr();
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();

  size_t layout_hash = sizes.size();
  for (size_t i = 0; i < sizes.size(); ++i) {
    layout_hash = layout_hash * 1000003u ^ static_cast<size_t>(sizes[i]);
    layout_hash = layout_hash * 1000003u ^ static_cast<size_t>(strides[i]);
  }
  // A contiguous tensor's entry serves every shape of its bytes: a reshape
  // or view of it (view, reshape, flatten, squeeze, ...) is finalized from
  // the cached byte sums without reading the bytes (docs/fingerprint.md).
  const bool contiguous = t.is_contiguous();
  const uint32_t ndim = static_cast<uint32_t>(sizes.size());
  FingerprintCache::Key key{data, TensorVersion(t), dtype, contiguous,
                            contiguous ? t.numel() * t.element_size() : layout_hash};
  if (ts.collective_writes_seen != g_collective_writes->Count()) {
    g_collective_writes->Apply(ts.collective_writes_seen, ts.cache, ts.uninitialised);
  }
  // Memory an op handed out uninitialised (aten::empty) is often filled
  // without an op or a version bump (torch.LongTensor([n]) writes it in C++):
  // its fingerprint is never cached, so a later read hashes what is there
  // rather than the garbage seen at allocation.
  const bool cacheable = data != nullptr && !ts.uninitialised.Contains(t);
  if (cacheable && cached) {
    if (const auto* hit = ts.cache.Find(key, storage)) {
      if (hit->layout_hash == layout_hash) {
        out->fp_lo = hit->lo;
        out->fp_hi = hit->hi;
      } else if (opguard_fingerprint_reshape(&hit->sums, dtype, sizes.data(), ndim, out) !=
                 OPGUARD_OK) {
        return false;
      }
      out->stats = hit->stats;
      out->has_stats = hit->has_stats;
      out->dtype = dtype;
      out->device = -1;
      out->shape = OpContext::AsOffset(offset);
      out->ndim = ndim;
      return true;
    }
  }
  // A strided tensor is fingerprinted in logical order, as its contiguous
  // copy would be (docs/fingerprint.md): small ones are gathered here into a
  // per-thread buffer, which spares the fingerprint's own gather its 64 KiB
  // tile buffer per call.
  const void* bytes = data;
  const int64_t* fp_strides = nullptr;
  if (data != nullptr && !contiguous) {
    if (!GatherLogical(data, t.element_size(), sizes, strides, ts.gather)) {
      fp_strides = strides.data();
    } else {
      bytes = ts.gather.data();
    }
  }
  opguard_byte_sums sums{};
  if (opguard_fingerprint_host_sums(bytes, dtype, sizes.data(), ndim, fp_strides, out, &sums) !=
      OPGUARD_OK) {
    return false;
  }
  out->shape = OpContext::AsOffset(offset);
  if (cacheable) {
    ts.cache.Put(key, FingerprintCache::Value{t.storage().getWeakStorageImpl(), out->fp_lo,
                                              out->fp_hi, out->stats, out->has_stats, sums,
                                              layout_hash});
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

// Inputs of replicated ops are hashed from their bytes, never taken from the
// cache: what replicas compare must show memory that changed behind torch's
// back (a bit flipped in one replica's reduced gradient between the
// all-reduce and the optimizer: the op read corrupted inputs, it did not
// compute wrongly). The cache assumes bytes change only with the version.
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
        if (!FingerprintTensor(t, ctx, ts, &value.tensor, !ctx.replicated)) {
          ctx.unfingerprintable = true;
        }
        value.kind = OPGUARD_VALUE_TENSOR;
      }
    } else if (v.isTensorList()) {
      const c10::List<at::Tensor> list = v.toTensorList();
      const size_t first = ctx.list_tensors.size();
      for (size_t i = 0; i < list.size(); ++i) {
        const at::Tensor t = list.get(i);
        opguard_tensor tensor;
        if (!FingerprintTensor(t, ctx, ts, &tensor, !ctx.replicated)) ctx.unfingerprintable = true;
        ctx.list_tensors.push_back(tensor);
      }
      value.kind = OPGUARD_VALUE_TENSOR_LIST;
      value.num_tensors = static_cast<uint32_t>(list.size());
      value.tensors = reinterpret_cast<const opguard_tensor*>(static_cast<uintptr_t>(first));
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

bool CollectOutputs(const at::RecordFunction& fn, OpContext& ctx, ThreadState& ts) {
  const bool allocates = HasUninitialisedOutput(fn.name());
  for (const c10::IValue& v : fn.outputs()) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      TrackUninitialised(allocates, t, ctx, ts);
      opguard_tensor out;
      if (!FingerprintTensor(t, ctx, ts, &out)) return false;
      ctx.outputs.push_back(out);
    } else if (v.isTensorList()) {
      const c10::List<at::Tensor> list = v.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        const at::Tensor t = list.get(i);
        TrackUninitialised(allocates, t, ctx, ts);
        opguard_tensor out;
        if (!FingerprintTensor(t, ctx, ts, &out)) return false;
        ctx.outputs.push_back(out);
      }
    }
  }
  return true;
}

NodeName NodeNameOf(const char* name) {
  static constexpr std::string_view kPrefix = "autograd::engine::evaluate_function: ";
  std::string_view view(name);
  if (view.substr(0, kPrefix.size()) == kPrefix) view.remove_prefix(kPrefix.size());
  return NodeName{view, std::hash<std::string_view>()(view)};
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
    if (std::this_thread::get_id() != g_main_thread && !BackendLoops().empty()) {
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

// torch.optim wraps every Optimizer.step in a USER_SCOPE RecordFunction named
// "Optimizer.step#<Class>.step".
bool IsOptimizerStep(const at::RecordFunction& fn) {
  return std::strncmp(fn.name(), "Optimizer.step#", 15) == 0;
}

// Drops the cached fingerprints of the tensors in `v` (nested lists too:
// c10d::allgather_ takes a list of tensor lists).
void ForgetTensors(const c10::IValue& v, ThreadState& ts) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.has_storage()) ts.cache.StorageWritten(t.storage().unsafeGetStorageImpl());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) ForgetTensors(e, ts);
  }
}

// Switching RecordFunction off and on again (torch rebuilds its thread-local
// callback lists both times) costs about as much as observing three or four
// nested ops: ops running fewer are left alone (callgrind on a small
// training loop: 2.080 M instructions per iteration with 4, 2.097 M with 1,
// 2.096 M never switching; 1.382 M without OpGuard).
constexpr uint64_t kNestedOpsWorthTheSwitch = 4;

std::unique_ptr<at::ObserverContext> NativeCollectiveStart(const at::RecordFunction& fn,
                                                           ThreadState& ts);
void NativeCollectiveEnd(const at::RecordFunction& fn, OpContext& ctx);
void RecordCompletedNatives();

std::unique_ptr<at::ObserverContext> OnFunctionStart(const at::RecordFunction& fn, ThreadState& ts) {
  if (IsEngineWrapper(fn)) return nullptr;
  int depth = ts.depth++;
  if (depth > 0) ++ts.nested_calls;
  if (!g_recording.load(std::memory_order_relaxed)) return nullptr;
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
  if (std::strncmp(fn.name(), "opguard::", 9) == 0) return nullptr;
  // A backend's own ops while it runs a collective (gloo's all_gather copies
  // its flat buffer into the outputs on its worker thread) are the
  // collective's internals, shown by its Completed record.
  if (ts.callback_lanes.empty() && IsBackendThread(ts)) return nullptr;
  bool in_backward = ts.backward_nodes > 0 && !ts.nodes.empty();
  if (depth != 0 && !g_all_depths.load(std::memory_order_relaxed)) return nullptr;
  if (ts.unrecorded_regions > 0) return nullptr;
  if (ts.cache_step != g_step.load(std::memory_order_relaxed)) {
    ts.cache.Clear();  // bound the cache to one step's tensors
    ts.cache_step = g_step.load(std::memory_order_relaxed);
  }
  auto ctx = std::make_unique<OpContext>();
  ctx->start_ns = NowNs();
  ctx->backward = in_backward;
  ctx->replicated = ts.optimizer_steps > 0 || ts.replicated_regions > 0;
  if (in_backward) {
    const NodeName& node = ts.nodes.back();
    ctx->name = ts.names.GetBackward(fn.name(), node.text, node.hash);
    ctx->seq_nr = ts.node_seq;
    ctx->site = ts.node_seq >= 0 ? g_forward_sites->Lookup(ts.node_seq) : 0;
  } else {
    ctx->name = ts.names.Get(fn.name());
    ctx->site = FindUserSite().site;
    ctx->seq_begin = PeekSequenceNumber();
  }
  CollectInputs(fn, *ctx, ts);
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
  if (g_skip_nested.load(std::memory_order_relaxed) && !at::hasThreadLocalCallbacks()) {
    auto it = ts.nests.find(fn.name());
    if (it != ts.nests.end() && it->second == 2) {
      at::enableRecordFunction(false);
      ctx->reenable_record_function = true;
    } else {
      ctx->learn_nesting = true;
      ctx->nested_calls_at_start = ts.nested_calls;
    }
  }
  return ctx;
}

void OnFunctionEnd(const at::RecordFunction& fn, OpContext* ctx, ThreadState& ts) {
  if (ctx != nullptr && ctx->reenable_record_function) {
    at::enableRecordFunction(true);
    ctx->reenable_record_function = false;
  } else if (ctx != nullptr && ctx->learn_nesting) {
    if (ts.nests.size() >= 4096) ts.nests.clear();
    const uint64_t nested = ts.nested_calls - ctx->nested_calls_at_start;
    ts.nests.insert_or_assign(fn.name(), nested >= kNestedOpsWorthTheSwitch ? 2 : 1);
  }
  if (IsEngineWrapper(fn)) return;
  --ts.depth;
  if (ctx != nullptr && ctx->native != nullptr) {
    NativeCollectiveEnd(fn, *ctx);
    return;
  }
  if (ctx == nullptr || !g_recording.load(std::memory_order_relaxed)) return;
  uint32_t lane = LaneOf(ts);
  if (ctx->unfingerprintable || !CollectOutputs(fn, *ctx, ts)) {
    opguard_report_gap(lane, 1, "tensor without host bytes (device, sparse or quantized)", nullptr);
    return;
  }
  if (!ctx->backward) g_forward_sites->Add(ctx->seq_begin, PeekSequenceNumber(), ctx->site);
  ctx->Resolve();
  opguard_op op;
  std::memset(&op, 0, sizeof(op));
  op.struct_size = sizeof(op);
  op.lane = lane;
  op.op_index = OPGUARD_AUTO;
  op.name = ctx->name;
  op.site = ctx->site;
  op.flags = ctx->backward ? OPGUARD_OP_BACKWARD : 0;
  if (ctx->uninitialised_output) op.flags |= OPGUARD_OP_NONDETERMINISTIC;
  if (ctx->replicated) op.flags |= OPGUARD_OP_REPLICATED;
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
    RecordCompletedNatives();
    switch (fn.scope()) {
      case at::RecordScope::FUNCTION:
        return OnFunctionStart(fn, ts);
      case at::RecordScope::BACKWARD_FUNCTION:
        ++ts.backward_nodes;
        ts.node_seq = fn.seqNr();
        ts.nodes.push_back(NodeNameOf(fn.name()));
        return nullptr;
      case at::RecordScope::USER_SCOPE:
        // Counted whether or not recording is on, so that recording switched
        // on inside a step still sees the step's end as its end.
        if (IsOptimizerStep(fn)) ++ts.optimizer_steps;
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
        if (!ts.nodes.empty()) ts.nodes.pop_back();
        break;
      case at::RecordScope::USER_SCOPE:
        if (IsOptimizerStep(fn)) {
          if (ts.optimizer_steps > 0) --ts.optimizer_steps;
          if (g_recording.load(std::memory_order_relaxed)) MarkStep(ts);
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

namespace opguard::torch_adapter {
namespace {

// Serialises registering and unregistering the callbacks (opguard.paused()
// may be used from several threads).
std::mutex g_callback_mu;

// Two callbacks, so that torch boxes arguments only where they are read:
// ops (FUNCTION) with their inputs and outputs; autograd nodes and user
// scopes (BACKWARD_FUNCTION, USER_SCOPE: only their names and sequence
// numbers are read) without, which spares every backward node a vector of
// its input gradients.
std::array<at::CallbackHandle, 2> AddCallbacks() {
  return {at::addGlobalCallback(at::RecordFunctionCallback(&OnStart, &OnEnd)
                                    .needsInputs(true)
                                    .needsOutputs(true)
                                    .scopes({at::RecordScope::FUNCTION})),
          at::addGlobalCallback(
              at::RecordFunctionCallback(&OnStart, &OnEnd)
                  .scopes({at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}))};
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

// One phase of a collective in one call: the op boundary in the calling
// thread's lane ("c10d::<kind> [enter]" holding the inputs, or
// "c10d::<kind>" with the launch inputs and the outputs), then the collective
// record. `rec->lane` is set here; for Entered, `rec->op_index` is set to the
// lane position after the boundary (where the collective was issued), for
// Completed the caller repeats it. Collective boundaries are never flagged
// replicated: their inputs are each rank's own.
int RecordCollective(opguard_collective* rec, uint64_t op_name, uint64_t* seq,
                     uint32_t op_flags = 0) {
  const uint32_t lane = LaneOf(t_state);
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

// Collectives launched and not yet completed, by token: what their
// Completed record repeats (the launch inputs, seq, position). Completion
// may come on another thread (work.wait() there). Bounded: a collective whose
// work is never waited for is forgotten after enough others.
struct PendingCollective {
  opguard_collective rec;
  c10::SmallVector<opguard_tensor, 4> inputs;  // shapes as offsets into dims
  c10::SmallVector<int64_t, 16> dims;
};
std::mutex g_pending_mu;
std::unordered_map<int64_t, PendingCollective>* g_pending =
    new std::unordered_map<int64_t, PendingCollective>();
int64_t g_next_token = 1;

// Fingerprints `tensors` from their bytes into ctx.outputs (shapes into
// ctx.dims); false if one has no host bytes. Never from the cache: an
// Entered record must show memory changed behind torch's back (a bit flipped
// in a gradient before its all-reduce), a Completed one the bytes the
// collective wrote. The results are cached for the ops that read them next.
bool FingerprintAll(at::TensorList tensors, OpContext& ctx, ThreadState& ts) {
  for (const at::Tensor& t : tensors) {
    opguard_tensor out;
    if (!FingerprintTensor(t, ctx, ts, &out, /*cached=*/false)) return false;
    // A receiving rank's broadcast buffer, fresh from torch.empty: its bytes
    // at launch are garbage, never evidence (see RecordEntered).
    if (ts.uninitialised.Contains(t)) ctx.uninitialised_output = true;
    ctx.outputs.push_back(out);
  }
  return true;
}

void BeginCacheStep(ThreadState& ts) {
  if (ts.cache_step != g_step.load(std::memory_order_relaxed)) {
    ts.cache.Clear();
    ts.cache_step = g_step.load(std::memory_order_relaxed);
  }
}

// Records the Entered phase of a collective whose inputs are fingerprinted
// into ctx.outputs (shapes resolved): its op boundary `name` and its
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
  rec.num_inputs = static_cast<uint32_t>(ctx.outputs.size());
  rec.inputs = ctx.outputs.data();
  const uint64_t step = g_step.load(std::memory_order_relaxed);
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
  pending->inputs.assign(ctx.outputs.begin(), ctx.outputs.end());
  pending->dims.assign(ctx.dims.begin(), ctx.dims.end());
  for (opguard_tensor& t : pending->inputs) {
    t.shape = OpContext::AsOffset(static_cast<size_t>(t.shape - ctx.dims.data()));
  }
  return true;
}

// Turns `pending` into its Completed record, with the outputs fingerprinted
// into `outputs`.outputs (shapes resolved here). Returns the record.
opguard_collective& CompletedRecord(PendingCollective& pending, OpContext& outputs) {
  for (opguard_tensor& t : outputs.outputs) outputs.ResolveTensor(t);
  for (opguard_tensor& t : pending.inputs) {
    t.shape = pending.dims.data() + reinterpret_cast<uintptr_t>(t.shape);
  }
  opguard_collective& rec = pending.rec;
  rec.phase = OPGUARD_PHASE_COMPLETED;
  rec.num_inputs = static_cast<uint32_t>(pending.inputs.size());
  rec.inputs = pending.inputs.data();
  rec.num_outputs = static_cast<uint32_t>(outputs.outputs.size());
  rec.outputs = outputs.outputs.data();
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
    if (!g_recording.load(std::memory_order_relaxed) || g_paused.load()) return 0;
    ThreadState& ts = t_state;
    BeginCacheStep(ts);
    OpContext ctx;
    if (!FingerprintAll(inputs, ctx, ts)) return 0;
    for (opguard_tensor& t : ctx.outputs) ctx.ResolveTensor(t);
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
    if (!g_recording.load(std::memory_order_relaxed)) return 0;
    ThreadState& ts = t_state;
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

// Where the arguments of one c10d op are (the same positions in torch 1.13
// and 2.x); -1: none. The process group is found by its type: its position
// differs (c10d::barrier takes a tensor first in 2.x, not in 1.13).
struct NativeKind {
  const char* op;     // c10d op name
  uint8_t kind;       // OPGUARD_COLL_*
  const char* label;  // torch.distributed's name, for "c10d::<label> [enter]"
  int inputs;         // Tensor, Tensor[] or Tensor[][]
  int outputs;        // fingerprinted after completion
  int reduce_op;      // ReduceOp
  int root;           // int: root or peer rank in the group
};
constexpr NativeKind kNativeKinds[] = {
    {"c10d::allreduce_", OPGUARD_COLL_ALL_REDUCE, "all_reduce", 0, 0, 2, -1},
    {"c10d::broadcast_", OPGUARD_COLL_BROADCAST, "broadcast", 0, 0, -1, 2},
    {"c10d::reduce_", OPGUARD_COLL_REDUCE, "reduce", 0, 0, 2, 3},
    {"c10d::allgather_", OPGUARD_COLL_ALL_GATHER, "all_gather", 1, 0, -1, -1},
    {"c10d::_allgather_base_", OPGUARD_COLL_ALL_GATHER, "all_gather_into_tensor", 1, 0, -1, -1},
    {"c10d::reduce_scatter_", OPGUARD_COLL_REDUCE_SCATTER, "reduce_scatter", 1, 0, 3, -1},
    {"c10d::_reduce_scatter_base_", OPGUARD_COLL_REDUCE_SCATTER, "reduce_scatter_tensor", 1, 0, 3,
     -1},
    {"c10d::alltoall_", OPGUARD_COLL_ALL_TO_ALL, "all_to_all", 1, 0, -1, -1},
    {"c10d::alltoall_base_", OPGUARD_COLL_ALL_TO_ALL, "all_to_all_single", 1, 0, -1, -1},
    {"c10d::gather_", OPGUARD_COLL_GATHER, "gather", 1, 0, -1, 3},
    {"c10d::scatter_", OPGUARD_COLL_SCATTER, "scatter", 1, 0, -1, 3},
    {"c10d::send", OPGUARD_COLL_SEND, "send", 0, -1, -1, 2},
    {"c10d::recv_", OPGUARD_COLL_RECV, "recv", -1, 0, -1, 2},
    {"c10d::barrier", OPGUARD_COLL_BARRIER, "barrier", -1, -1, -1, -1},
    // torch 2.x only: coalesced collectives (dist.all_reduce_coalesced,
    // all_gather_coalesced, and what _coalescing_manager issues at its exit:
    // one collective over a list of tensors), gather into one tensor, recv
    // from any source, and the monitored barrier (synchronous: it returns no
    // work, so it completes when it returns).
    {"c10d::allreduce_coalesced_", OPGUARD_COLL_ALL_REDUCE, "all_reduce_coalesced", 0, 0, 2, -1},
    {"c10d::allgather_coalesced_", OPGUARD_COLL_ALL_GATHER, "all_gather_coalesced", 1, 0, -1, -1},
    {"c10d::allgather_into_tensor_coalesced_", OPGUARD_COLL_ALL_GATHER,
     "all_gather_into_tensor_coalesced", 1, 0, -1, -1},
    {"c10d::reduce_scatter_tensor_coalesced_", OPGUARD_COLL_REDUCE_SCATTER,
     "reduce_scatter_tensor_coalesced", 1, 0, 3, -1},
    {"c10d::gather_into_tensor_", OPGUARD_COLL_GATHER, "gather_into_tensor", 1, 0, -1, 3},
    {"c10d::recv_any_source_", OPGUARD_COLL_RECV, "recv_any_source", -1, 0, -1, -1},
    {"c10d::monitored_barrier_", OPGUARD_COLL_BARRIER, "monitored_barrier", -1, -1, -1, -1},
};

// A collective between its Entered and Completed records.
struct NativeCollective {
  PendingCollective entered;
  std::vector<at::Tensor> outputs;  // fingerprinted once the work completes
  c10::intrusive_ptr<c10::ivalue::Future> future;  // the work's, set at the op's end
  std::mutex mu;      // held while the Completed record is taken
  bool done = false;  // the Completed record was taken (or is not to be)
};

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

void WarnOnce(std::atomic<bool>& warned, const char* what) {
  if (!warned.exchange(true)) std::fprintf(stderr, "opguard-torch warning: %s\n", what);
}

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

// Interned "c10d::<label> [enter]" of kNativeKinds[i], on first use.
uint64_t EnteredName(size_t i) {
  static std::atomic<uint64_t> ids[std::size(kNativeKinds)];
  uint64_t id = ids[i].load(std::memory_order_relaxed);
  if (id == 0) {
    std::string text = std::string("c10d::") + kNativeKinds[i].label + " [enter]";
    id = opguard_intern(text.data(), text.size());
    ids[i].store(id, std::memory_order_relaxed);
  }
  return id;
}

std::unique_ptr<at::ObserverContext> NativeCollectiveStart(const at::RecordFunction& fn,
                                                           ThreadState& ts) {
  size_t index = 0;
  while (index < std::size(kNativeKinds) && std::strcmp(fn.name(), kNativeKinds[index].op) != 0) {
    ++index;
  }
  if (index == std::size(kNativeKinds)) return nullptr;
  const NativeKind* kind = &kNativeKinds[index];
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
  for (opguard_tensor& t : ctx->outputs) ctx->ResolveTensor(t);
  const at::Tensor* first = !inputs.empty()            ? &inputs[0]
                            : !native->outputs.empty() ? &native->outputs[0]
                                                       : nullptr;
  const c10::IValue* root = arg(kind->root);
  const c10::IValue* reduce_op = arg(kind->reduce_op);
  if (!RecordEntered(*ctx, first, kind->kind, communicator,
                     root != nullptr && root->isInt() ? static_cast<int32_t>(root->toInt()) : -1,
                     reduce_op != nullptr ? ReduceOpCode(*reduce_op) : 255, EnteredName(index),
                     &native->entered)) {
    return nullptr;
  }
  ctx->native = std::move(native);
  return ctx;
}

// Collectives launched whose Completed record is not taken yet (bounded: a
// work that never completes is forgotten after enough others).
std::mutex g_natives_mu;
std::vector<std::shared_ptr<NativeCollective>>* g_natives =
    new std::vector<std::shared_ptr<NativeCollective>>();
std::atomic<size_t> g_natives_size{0};

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
    if ((native.future && native.future->hasError()) ||
        !g_recording.load(std::memory_order_relaxed)) {
      return;
    }
    OpContext ctx;
    if (!FingerprintAll(native.outputs, ctx, t_state)) return;
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
    static std::atomic<bool> warned{false};
    WarnOnce(warned, "a collective's work has no future: its Completed record is not taken");
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

// Registers opguard::collective_enter and opguard::collective_complete with
// the dispatcher (once), so that Python hands the tensors themselves to the
// adapter: torch.ops.opguard.collective_enter(...). Throws if the namespace
// is taken.
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

// A per-thread region counter (replicated, unrecorded, callback regions).
int EnterRegion(int ThreadState::*depth) { return ++(t_state.*depth); }
int LeaveRegion(int ThreadState::*depth) {
  int& n = t_state.*depth;
  if (n > 0) --n;
  return n;
}

}  // namespace
}  // namespace opguard::torch_adapter

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
    if (!g_registered.load()) {
      RegisterCollectiveOps();
      // A forked child (a DataLoader worker) records nothing: the shim turns
      // itself off there, and the callbacks must not go on hashing every op
      // for records that go nowhere.
      pthread_atfork(nullptr, nullptr, [] { g_recording.store(false); });
      g_registered.store(true);
      g_main_thread = std::this_thread::get_id();
      g_foreign_global_observer = at::hasGlobalCallbacks();
      std::lock_guard<std::mutex> lock(g_callback_mu);
      g_handles = AddCallbacks();
    }
    g_skip_nested.store(all_depths == 0 && !g_foreign_global_observer && !KeepNestedOps());
    g_recording.store(true);
    return 1;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
    return 0;
  }
}

// opguard.paused(): with `paused` set, the callbacks are unregistered, so
// the ops that run meanwhile cost nothing (torch does not even box their
// arguments) and are not recorded, on any thread, nor are the collectives
// the Python wrappers record; cleared, they are registered again. Returns 1
// when the state was changed or already so.
__attribute__((visibility("default"))) int opguard_torch_pause(int paused) {
  try {
    std::lock_guard<std::mutex> lock(g_callback_mu);
    if (!g_registered.load()) return 0;
    if (paused != 0 && g_handles[0] != 0) {
      for (at::CallbackHandle& handle : g_handles) at::removeCallback(std::exchange(handle, 0));
    } else if (paused == 0 && g_handles[0] == 0) {
      g_handles = AddCallbacks();
    }
    g_paused.store(paused != 0);
    return 1;
  } catch (const std::exception& e) {
    DisableOnce(e.what());
    return 0;
  }
}

// 1 while the callbacks record (0 once stopped, failed or in a forked child).
__attribute__((visibility("default"))) int opguard_torch_recording(void) {
  return g_recording.load() ? 1 : 0;
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

// The regions below nest per thread: Begin returns the thread's depth after
// entering, End (ignored without a Begin) the depth after leaving.

// opguard.replicated(): ops the calling thread records in the region are
// flagged OPGUARD_OP_REPLICATED.
__attribute__((visibility("default"))) int opguard_torch_replicated_begin(void) {
  return EnterRegion(&ThreadState::replicated_regions);
}
__attribute__((visibility("default"))) int opguard_torch_replicated_end(void) {
  return LeaveRegion(&ThreadState::replicated_regions);
}

// The DataLoader's own work (fetching and collating batches, receiving them
// from its workers in whatever order they arrive, pinning them) is not
// recorded: the ops the calling thread runs in the region are left out
// (collectives excepted). A batch is fingerprinted where the training code
// first uses it.
__attribute__((visibility("default"))) int opguard_torch_unrecorded_begin(void) {
  return EnterRegion(&ThreadState::unrecorded_regions);
}
__attribute__((visibility("default"))) int opguard_torch_unrecorded_end(void) {
  return LeaveRegion(&ThreadState::unrecorded_regions);
}

// The opguard package wraps the callbacks given to a torch future: when one
// is registered it takes its lane here (see CallbackLane), and it runs
// between callback_begin(lane) and callback_end() on whichever thread runs
// it, its ops going to that lane.
__attribute__((visibility("default"))) uint32_t opguard_torch_callback_lane(void) {
  return CallbackLane();
}
__attribute__((visibility("default"))) int opguard_torch_callback_begin(uint32_t lane) {
  t_state.callback_lanes.push_back(lane);
  return static_cast<int>(t_state.callback_lanes.size());
}
__attribute__((visibility("default"))) int opguard_torch_callback_end(void) {
  if (!t_state.callback_lanes.empty()) t_state.callback_lanes.pop_back();
  return static_cast<int>(t_state.callback_lanes.size());
}

// The opguard package names a process group OpGuard has not seen before the
// collective call that uses it (python/opguard/_collectives.py): the next
// unknown group a c10d op of this thread takes is `communicator`. 0 clears.
__attribute__((visibility("default"))) void opguard_torch_announce_group(uint64_t communicator) {
  t_state.announced_communicator = communicator;
}

// torch.distributed.destroy_process_group is about to destroy the groups
// named `communicator` (0: every group): they are forgotten, so that a group
// created later at one of their addresses is not taken for them.
__attribute__((visibility("default"))) void opguard_torch_forget_groups(uint64_t communicator) {
  std::lock_guard<std::mutex> lock(g_groups_mu);
  if (communicator == 0) {
    g_groups->clear();
    return;
  }
  for (auto it = g_groups->begin(); it != g_groups->end();) {
    it = it->second.communicator == communicator ? g_groups->erase(it) : std::next(it);
  }
}

// The current step and the calling thread's lane (collectives recorded from
// Python use the same lane numbering as the ops around them).
__attribute__((visibility("default"))) uint64_t opguard_torch_step(void) { return g_step.load(); }
__attribute__((visibility("default"))) uint32_t opguard_torch_lane(void) {
  return LaneOf(t_state);
}

}  // extern "C"
