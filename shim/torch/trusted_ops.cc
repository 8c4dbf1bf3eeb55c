#include "trusted_ops.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace opguard::torch_adapter {
namespace {

struct TrustedList {
  std::mutex mu;
  std::shared_ptr<const std::unordered_set<std::string>> names;
  // Bumped by each SetTrustedOps: threads drop the answers they remembered.
  std::atomic<uint32_t> generation{0};
  std::atomic<bool> any{false};  // full mode (the default) costs one load per op
};

TrustedList& List() {
  static auto* list = new TrustedList;  // never destroyed: callbacks may run during exit
  return *list;
}

}  // namespace

void SetTrustedOps(std::vector<std::string> names) {
  TrustedList& list = List();
  auto set = std::make_shared<const std::unordered_set<std::string>>(names.begin(), names.end());
  std::lock_guard<std::mutex> lock(list.mu);
  list.any.store(!set->empty(), std::memory_order_relaxed);
  list.names = std::move(set);
  list.generation.fetch_add(1, std::memory_order_release);
}

bool IsTrustedOp(const char* name, ThreadState& ts) {
  TrustedList& list = List();
  if (!list.any.load(std::memory_order_relaxed)) return false;
  const uint32_t generation = list.generation.load(std::memory_order_acquire);
  if (ts.trusted_generation != generation) {
    ts.trusted_names.clear();
    ts.trusted_generation = generation;
  }
  auto [it, fresh] = ts.trusted_names.try_emplace(name, false);
  if (fresh) {
    std::shared_ptr<const std::unordered_set<std::string>> names;
    {
      std::lock_guard<std::mutex> lock(list.mu);
      names = list.names;
    }
    it->second = names != nullptr && names->count(name) != 0;
  }
  return it->second;
}

}  // namespace opguard::torch_adapter
