// The shim's table of pending fingerprints: handles given out to callers
// (shim.h, "pending fingerprints"), their state, and how many held records
// still wait on each. Not thread-safe: the core uses it under its mutex.
//
// Lifetime of a handle: Begin() makes it pending (counted against the
// limit); Resolve() or Fail() settles it once. A settled handle stays in the
// table while held records reference it and until `keep_settled` newer
// handles have settled, so a record made a little later (the same tensor as
// the next op's input) still finds its bits; after that Find() no longer
// knows it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>

#include "opguard/shim.h"

namespace opguard::shim {

// A resolved fingerprint: the fields of opguard_tensor that a pending
// marker stands for.
struct FpResult {
  uint64_t lo = 0;
  uint64_t hi = 0;
  uint8_t has_stats = 0;
  opguard_tensor_stats stats{};
};

inline bool IsPendingMarker(const opguard_tensor& t) {
  return t.has_stats == OPGUARD_TENSOR_PENDING && t.fp_hi == OPGUARD_PENDING_TAG;
}

class PendingTable {
 public:
  enum class State : uint8_t { kPending, kResolved, kFailed };
  struct Entry {
    State state = State::kPending;
    bool expired = false;  // out of the keep window; erased when refs reach 0
    uint32_t refs = 0;     // held records waiting on it
    FpResult result;
    std::string reason;    // kFailed
  };

  // `max_pending`: unresolved handles at most; `keep_settled`: settled
  // handles kept for later records.
  PendingTable(uint64_t max_pending, uint64_t keep_settled)
      : max_pending_(max_pending), keep_settled_(keep_settled) {}

  // A new pending handle (never 0), or 0 at the limit.
  uint64_t Begin();
  // A new handle that is failed already (outside the limit).
  uint64_t BeginFailed(std::string_view reason);
  // Settle a pending handle; false if it is unknown or already settled.
  bool Resolve(uint64_t handle, const FpResult& result);
  bool Fail(uint64_t handle, std::string_view reason);
  // nullptr for an unknown (never issued, or expired and unreferenced) handle.
  Entry* Find(uint64_t handle);
  // Also an expired entry (one that held records still reference).
  const Entry* Peek(uint64_t handle) const {
    auto it = entries_.find(handle);
    return it == entries_.end() ? nullptr : &it->second;
  }
  void AddRef(Entry* e) { ++e->refs; }
  // One held record no longer waits on `handle`.
  void Unref(uint64_t handle);

  uint64_t pending() const { return pending_; }
  uint64_t resolved() const { return resolved_; }
  uint64_t failed() const { return failed_; }
  size_t size() const { return entries_.size(); }

 private:
  // Applies `set` to a pending entry and counts it settled; false if none.
  template <typename F>
  bool Settle(uint64_t handle, F&& set);
  void Settled(uint64_t handle);

  const uint64_t max_pending_;
  const uint64_t keep_settled_;
  uint64_t next_handle_ = 1;
  uint64_t pending_ = 0, resolved_ = 0, failed_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
  std::deque<uint64_t> settled_order_;  // oldest first
};

}  // namespace opguard::shim
