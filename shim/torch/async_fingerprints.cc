#include "async_fingerprints.h"

#include <ATen/core/function_schema.h>

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "adapter_state.h"

namespace opguard::torch_adapter {
namespace {

// Storages with hashes in flight, and how many each.
class PendingStorages {
 public:
  void Add(const c10::StorageImpl* s) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[s];
    total_.fetch_add(1, std::memory_order_release);
  }
  void Done(const c10::StorageImpl* s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = counts_.find(s);
      if (it != counts_.end() && --it->second == 0) counts_.erase(it);
      total_.fetch_sub(1, std::memory_order_release);
    }
    cv_.notify_all();
  }
  bool Any() const { return total_.load(std::memory_order_acquire) != 0; }
  size_t Of(const c10::StorageImpl* s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = counts_.find(s);
    return it == counts_.end() ? 0 : it->second;
  }
  // Bounded by the fingerprint thread's queue ahead of these hashes (at most
  // OPGUARD_MAX_PENDING_FP tensors); the deadline only guards against a bug.
  bool Wait(const c10::StorageImpl* s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return counts_.count(s) == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<const c10::StorageImpl*, size_t> counts_;
  std::atomic<size_t> total_{0};
};

// What the fingerprint thread releases: the reference that keeps the bytes
// alive, and the storage's pending count.
struct Held {
  at::Tensor tensor;
  const c10::StorageImpl* storage;
};

struct AsyncState {
  PendingStorages pending;
  // Hashed tensors whose references are dropped on a recording thread, not
  // on the fingerprint thread: the last reference to a tensor that Python
  // knew takes the GIL to drop its Python object, and the GIL's holder may be
  // waiting in AwaitPendingWrites for a hash queued behind it.
  std::mutex finished_mu;
  std::vector<Held*> finished;
  std::atomic<size_t> finished_count{0};
};

// Leaked on purpose: the fingerprint thread may release a tensor during
// exit. A forked child (a DataLoader worker) starts with a fresh one: the
// parent's hashes never complete there, and a lock may have been held at
// the fork.
std::atomic<AsyncState*> g_state{nullptr};

AsyncState& State() {
  AsyncState* state = g_state.load(std::memory_order_acquire);
  if (state != nullptr) return *state;
  static std::once_flag once;
  std::call_once(once, [] {
    g_state.store(new AsyncState(), std::memory_order_release);
    pthread_atfork(nullptr, nullptr, [] { g_state.store(new AsyncState(), std::memory_order_release); });
  });
  return *g_state.load(std::memory_order_acquire);
}

PendingStorages& Pending() { return State().pending; }

void Release(void* context) {
  auto* held = static_cast<Held*>(context);
  AsyncState& state = State();
  // Read before `held` is published: from then on a recording thread's
  // DropFinished may delete it. (Read after, from freed memory, it once
  // decremented another storage's count and left this one pending for good:
  // every later write to a storage at that address waited out Wait's
  // deadline, after ~30 000 steps of a d_model 256 run.)
  const c10::StorageImpl* storage = held->storage;
  {
    std::lock_guard<std::mutex> lock(state.finished_mu);
    state.finished.push_back(held);
    state.finished_count.fetch_add(1, std::memory_order_release);
  }
  state.pending.Done(storage);
}

void DropFinished() {
  AsyncState& state = State();
  if (state.finished_count.load(std::memory_order_acquire) == 0) return;
  std::vector<Held*> finished;
  {
    std::lock_guard<std::mutex> lock(state.finished_mu);
    finished.swap(state.finished);
    state.finished_count.store(0, std::memory_order_release);
  }
  for (Held* held : finished) delete held;
}

std::atomic<bool> g_wait_warned{false};

void AwaitStorage(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (Pending().Of(s) != 0 && !Pending().Wait(s)) {
    WarnOnce(g_wait_warned,
             "a tensor's fingerprint was still pending after 60 s when an op wrote it; its record "
             "may show the written bytes");
  }
}

void AwaitValue(const c10::IValue& v) {
  if (v.isTensor()) {
    AwaitStorage(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) AwaitStorage(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) AwaitValue(e);
  }
}

// Collectives write their tensors (in place, or into the outputs they are
// given) on the backend's thread, and their schemas mark none written:
// c10d's dispatcher ops (c10d::allreduce_(Tensor[] tensors, ...)) and the
// op the opguard package issues before a collective that does not dispatch
// (torch 1.13's all_to_all_single). Every tensor they are given may be
// written. Waiting on their schemas alone, a large gradient's hash could
// read the bytes an all-reduce was writing into it (clean reruns of a
// tensor-parallel model under load diverged at the op that produced it,
// with equal inputs).
bool CollectiveWritesAnyArgument(const char* name) {
  return std::strncmp(name, "c10d::", 6) == 0 ||
         std::strcmp(name, "opguard::collective_enter") == 0;
}

}  // namespace

uint64_t AsyncMinBytes() {
  static const uint64_t min_bytes = EnvByteCount("OPGUARD_ASYNC_FP_MIN_BYTES", 1u << 20);
  return min_bytes;
}

bool SubmitHostFingerprint(const at::Tensor& t, uint8_t dtype, const int64_t* shape, uint32_t ndim,
                           opguard_tensor* out) {
  static const bool supported = opguard_api_version() >= 3;
  if (!supported) return false;
  DropFinished();
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  auto* held = new Held{t, storage};
  Pending().Add(storage);
  if (opguard_fingerprint_host_async(t.data_ptr(), dtype, shape, ndim, nullptr, &Release, held,
                                     out) != OPGUARD_OK) {
    // Not taken (the pending limit): the caller hashes inline.
    delete held;
    Pending().Done(storage);
    return false;
  }
  return true;
}

void AwaitPendingWrites(const at::RecordFunction& fn) {
  DropFinished();
  if (!Pending().Any()) return;
  auto inputs = fn.inputs();
  if (CollectiveWritesAnyArgument(fn.name())) {
    for (const c10::IValue& v : inputs) AwaitValue(v);
    return;
  }
  // The schema is copied out of the dispatcher: only when something is pending.
  auto schema = fn.operator_schema();
  for (size_t i = 0; i < inputs.size(); ++i) {
    bool written = true;  // no schema: any argument may be written
    if (schema.has_value()) {
      const auto& args = schema->arguments();
      written = i >= args.size() ||
                (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite());
    }
    if (written) AwaitValue(inputs[i]);
  }
}

size_t PendingHashesOf(const c10::StorageImpl* storage) { return Pending().Of(storage); }

}  // namespace opguard::torch_adapter
