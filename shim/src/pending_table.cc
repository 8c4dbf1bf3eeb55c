#include "pending_table.h"

namespace opguard::shim {

uint64_t PendingTable::Begin() {
  if (pending_ >= max_pending_) return 0;
  uint64_t h = next_handle_++;
  entries_.emplace(h, Entry{});
  ++pending_;
  return h;
}

uint64_t PendingTable::BeginFailed(std::string_view reason) {
  uint64_t h = next_handle_++;
  Entry& e = entries_[h];
  e.state = State::kFailed;
  e.reason = reason;
  ++failed_;
  Settled(h);
  return h;
}

template <typename F>
bool PendingTable::Settle(uint64_t handle, F&& set) {
  auto it = entries_.find(handle);
  if (it == entries_.end() || it->second.state != State::kPending) return false;
  set(it->second);
  --pending_;
  Settled(handle);
  return true;
}

bool PendingTable::Resolve(uint64_t handle, const FpResult& result) {
  return Settle(handle, [&](Entry& e) {
    e.state = State::kResolved;
    e.result = result;
    ++resolved_;
  });
}

bool PendingTable::Fail(uint64_t handle, std::string_view reason) {
  return Settle(handle, [&](Entry& e) {
    e.state = State::kFailed;
    e.reason = reason;
    ++failed_;
  });
}

void PendingTable::Settled(uint64_t handle) {
  settled_order_.push_back(handle);
  while (settled_order_.size() > keep_settled_) {
    auto old = entries_.find(settled_order_.front());
    settled_order_.pop_front();
    if (old == entries_.end()) continue;
    if (old->second.refs == 0) {
      entries_.erase(old);
    } else {
      old->second.expired = true;
    }
  }
}

PendingTable::Entry* PendingTable::Find(uint64_t handle) {
  auto it = entries_.find(handle);
  return it == entries_.end() || it->second.expired ? nullptr : &it->second;
}

void PendingTable::Unref(uint64_t handle) {
  auto it = entries_.find(handle);
  if (it == entries_.end()) return;
  if (it->second.refs > 0) --it->second.refs;
  if (it->second.refs == 0 && it->second.expired) entries_.erase(it);
}

}  // namespace opguard::shim
