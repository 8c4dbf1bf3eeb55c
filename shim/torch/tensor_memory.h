// What the adapter remembers about tensor memory on each thread: the
// fingerprints it already took (FingerprintCache), sets of storages
// (StorageSet: those holding memory nobody has written yet, those with views
// whose version counters are their own), and, across threads,
// the storages completed collectives wrote behind torch's back
// (CollectiveWrites). Used by tensor_fingerprint.cc; owned by ThreadState.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "opguard/shim.h"

namespace opguard::torch_adapter {

// Fingerprints of tensors seen on this thread, so the output of one op is not
// hashed again as the input of the next. An entry is valid while its weak
// reference still points at the tensor's storage object (a weak reference
// keeps the object's memory, so its address cannot be taken by a new
// storage), the tensor's version counter is unchanged and no write to the
// storage has been marked since it was put (StorageWritten). The version
// alone does not do: tensors of one storage may have counters of their own
// (`p.data`), at equal counts while their bytes differ.
//
// A fixed table indexed by a hash of the key, one entry per slot: a new entry
// replaces whatever held its slot, which only costs a later miss. Nothing is
// allocated per entry, and a whole step's entries are dropped by moving to
// the next epoch.
//
// A weak reference to a freed storage still holds the storage object, a
// small allocation among the freed tensors' large ones: thousands held
// across the heap keep glibc from merging what the tensors free, and the
// training's heap grew to four times its size without OpGuard
// (docs/torch.md, "Memory"). So references to freed storages are let go
// promptly: each Put looks at a few more slots in turn, and NewStep lets go
// of every one.
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
    // lo/hi/has_stats are a pending fingerprint's marker (async_fingerprints.h):
    // usable for the same layout only, as there are no sums yet.
    bool pending = false;
  };

  // The entry for `key`, if one was put at or after mark `since` (0: any).
  const Value* Find(const Key& key, const c10::StorageImpl* storage, uint64_t since = 0) {
    Slot& slot = slots_[SlotOf(key)];
    if (slot.epoch != epoch_ || slot.generation < since || !(slot.key == key) ||
        slot.value.storage._unsafe_get_target() != storage) {
      return nullptr;
    }
    if (MaybeWritten(storage)) {
      auto w = written_.find(storage);
      if (w != written_.end() && slot.generation < w->second) {
        slot.epoch = 0;
        return nullptr;
      }
    }
    return &slot.value;
  }
  void Put(const Key& key, Value value) {
    if (written_.size() >= kMaxWritten) Clear();
    for (int i = 0; i < kSweptPerPut; ++i) {
      auto& storage = slots_[sweep_++ & (kSlots - 1)].value.storage;
      if (storage.expired()) storage.reset();
    }
    Slot& slot = slots_[SlotOf(key)];
    slot.key = key;
    slot.value = std::move(value);
    slot.generation = generation_;
    slot.epoch = epoch_;
  }
  // A mark for Find: entries put from now on are at or after it.
  uint64_t Mark() { return ++generation_; }
  // Drops every entry. O(1): the adapter clears the cache for every op it
  // records inside compiled code, so the references stay for Put's sweep.
  void Clear() {
    ++epoch_;
    if (!written_.empty()) {
      written_.clear();
      written_filter_.fill(0);
    }
  }
  // Drops every entry and lets go of every reference: once a step. Without
  // it, the heap at d_model 256 stayed ~15% larger (docs/torch.md, "Memory").
  void NewStep() {
    Clear();
    for (Slot& slot : slots_) slot.value.storage.reset();
  }
  // The storage's bytes changed: entries of it (any view, any tensor of it
  // whatever its version counter) put before now are stale. O(1); Find drops
  // them lazily. Every write an op records (op_observer.cc) and every
  // collective's (CollectiveWrites) comes here.
  void StorageWritten(const c10::StorageImpl* storage) {
    written_[storage] = ++generation_;
    written_filter_[FilterBit(storage) / 64] |= uint64_t{1} << (FilterBit(storage) % 64);
  }

 private:
  static constexpr size_t kSlots = 4096;  // a power of two
  // A step puts about as many entries as there are slots (the e2e model:
  // ~2 000), so every slot is looked at within a step or two.
  static constexpr int kSweptPerPut = 4;
  size_t sweep_ = 0;
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
  // Storages written, by the generation of their last write; entries put
  // before it are stale. An optimizer's step writes three or four storages
  // per parameter: bounded well above that, a full map empties the cache.
  static constexpr size_t kMaxWritten = 1u << 16;
  std::unordered_map<const c10::StorageImpl*, uint64_t> written_;
  // Most lookups are of storages never written in the step: a bit filter
  // in front of the map answers them without a hash lookup.
  static constexpr size_t kFilterBits = 1u << 15;
  static size_t FilterBit(const c10::StorageImpl* storage) {
    return (reinterpret_cast<uintptr_t>(storage) * 0x9E3779B97F4A7C15ull >> 40) % kFilterBits;
  }
  bool MaybeWritten(const c10::StorageImpl* storage) const {
    return !written_.empty() &&
           (written_filter_[FilterBit(storage) / 64] >> (FilterBit(storage) % 64) & 1) != 0;
  }
  std::array<uint64_t, kFilterBits / 64> written_filter_{};
  uint64_t generation_ = 0;
};

// A set of storages, per thread. A storage found in the set is the one it
// was added as: the weak reference keeps a reused address from matching a
// new allocation. Freed storages are let go of as the set grows (see
// FingerprintCache on why they must not be held). Bounded: a set full of
// live storages is emptied (Add says so).
class StorageSet {
 public:
  // True when the set was full and emptied before `t` was added.
  bool Add(const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return false;
    if (map_.size() >= sweep_at_) DropFreed();
    const bool emptied = map_.size() >= kMax;
    if (emptied) Clear();
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    map_.insert_or_assign(storage, t.storage().getWeakStorageImpl());
    filter_[FilterBit(storage) / 64] |= uint64_t{1} << (FilterBit(storage) % 64);
    return emptied;
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
  static constexpr size_t kMax = 4096;
  // Sweeps when the set has doubled since the last one left it: amortized
  // O(1) per Add.
  void DropFreed() {
    for (auto it = map_.begin(); it != map_.end();) {
      it = it->second.expired() ? map_.erase(it) : std::next(it);
    }
    sweep_at_ = std::max<size_t>(kFirstSweep, 2 * map_.size());
  }
  static constexpr size_t kFirstSweep = 64;
  size_t sweep_at_ = kFirstSweep;
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
  void Apply(uint64_t& seen, FingerprintCache& cache, StorageSet& uninitialised) {
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
inline CollectiveWrites* const g_collective_writes = new CollectiveWrites();

}  // namespace opguard::torch_adapter
