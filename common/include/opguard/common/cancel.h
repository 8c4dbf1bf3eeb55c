// A query's stop signal: its client went away, its time budget ran out, or
// the process is stopping. The thread that serves the client cancels; the
// worker that computes the answer polls Check() at its check points (every
// few hundred records of a scan, every window of an alignment): one relaxed
// load and one steady_clock read, so a check point costs ~20 ns.
//
// Thread-safe: Cancel() from any thread, Check()/reason() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "opguard/common/status.h"

namespace opguard {

class CancelToken {
 public:
  enum class Reason : int { kNone = 0, kClientGone, kTimeBudget, kStopping };
  using Clock = std::chrono::steady_clock;

  // No budget (budget <= 0) and no process-wide flag: only Cancel() stops it.
  CancelToken() = default;
  // `budget` counts from now; `stopping`, when set, is a process-wide flag
  // (shutdown) that stops every token made with it. It must outlive the token.
  explicit CancelToken(Clock::duration budget, const std::atomic<bool>* stopping = nullptr)
      : budget_(budget),
        deadline_(budget > Clock::duration::zero() ? Clock::now() + budget : Clock::time_point::max()),
        stopping_(stopping) {}
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  // The first reason set stays. Const: a token is shared as const by the
  // workers, and cancelling does not change what the query asked.
  void Cancel(Reason why) const {
    int none = static_cast<int>(Reason::kNone);
    reason_.compare_exchange_strong(none, static_cast<int>(why), std::memory_order_relaxed);
  }

  // Ok while the work should go on; otherwise Unavailable with a message
  // naming why ("query exceeded its time budget of 2 s", ...).
  Status Check() const {
    if (reason_.load(std::memory_order_relaxed) == static_cast<int>(Reason::kNone)) {
      if (stopping_ != nullptr && stopping_->load(std::memory_order_relaxed)) {
        Cancel(Reason::kStopping);
      } else if (deadline_ != Clock::time_point::max() && Clock::now() >= deadline_) {
        Cancel(Reason::kTimeBudget);
      } else {
        return Status::Ok();
      }
    }
    return Unavailable(Message());
  }
  bool cancelled() const { return !Check().ok(); }
  Reason reason() const { return static_cast<Reason>(reason_.load(std::memory_order_relaxed)); }
  Clock::duration budget() const { return budget_; }

  // "query exceeded its time budget of 2 s" (seconds, or ms below 1 s).
  std::string Message() const;

 private:
  const Clock::duration budget_{};
  const Clock::time_point deadline_ = Clock::time_point::max();
  const std::atomic<bool>* stopping_ = nullptr;
  // Set by Cancel(), or by the first Check() past the deadline.
  mutable std::atomic<int> reason_{static_cast<int>(Reason::kNone)};
};

// Check() of a token that may be null (no cancellation).
inline Status CheckCancel(const CancelToken* token) { return token != nullptr ? token->Check() : Status::Ok(); }

}  // namespace opguard
