#include "sender.h"

#include <algorithm>
#include <string>
#include <utility>

#include "opguard/common/log.h"

namespace opguard::shim {

using std::chrono::milliseconds;

void Sender::Add(uint64_t seq, Batch batch, Clock::time_point now) {
  Entry e;
  e.batch = std::move(batch);
  e.created = now;
  pending_.emplace(seq, std::move(e));
}

std::optional<Sender::Batch> Sender::Acknowledge(uint64_t seq, Clock::time_point now) {
  auto it = pending_.find(seq);
  if (it == pending_.end()) return std::nullopt;
  Entry& e = it->second;
  if (e.in_flight) {
    SampleAckLatency(now - e.first_send);
    in_flight_.erase(seq);
  }
  newest_acked_tx_ = std::max(newest_acked_tx_, e.tx);
  // The daemon is alive and working through our batches: whatever else is in
  // flight is queued there, not lost.
  quiet_since_ = now;
  last_ack_ = now;
  backoff_ = 0;
  retry_rounds_ = 0;
  Batch batch = std::move(e.batch);
  pending_.erase(it);
  return batch;
}

void Sender::Defer(uint64_t seq, Clock::time_point now) {
  auto it = pending_.find(seq);
  if (it == pending_.end()) return;
  Entry& e = it->second;
  if (e.in_flight) {
    e.in_flight = false;
    e.first_send = {};
    in_flight_.erase(seq);
  }
  quiet_since_ = now;
  last_ack_ = now;
  backoff_ = 0;
  // One round is the answers to what was sent since the last hold ended.
  if (now >= hold_sends_until_) {
    const Clock::duration wait = std::min<Clock::duration>(
        kFirstRetryWait * (int64_t{1} << std::min(retry_rounds_, kMaxBackoffShift)), kMaxRetryWait);
    hold_sends_until_ = now + wait;
    ++retry_rounds_;
  }
}

void Sender::ConnectionLost(Clock::time_point now) {
  // Whatever was in flight went with the connection (queued in ZeroMQ's pipe,
  // or received by a daemon whose ack can no longer reach us): it is sent
  // again, oldest first, once a connection is back. A resend is idempotent.
  if (!in_flight_.empty()) {
    OPGUARD_LOG(LogLevel::kDebug, "connection to the daemon lost with " +
                                      std::to_string(in_flight_.size()) +
                                      " batch(es) in flight; they are resent on reconnect");
  }
  for (uint64_t seq : in_flight_) {
    Entry& e = pending_.at(seq);
    e.in_flight = false;
    e.first_send = {};
  }
  in_flight_.clear();
  backoff_ = 0;
  hold_sends_until_ = now + kReconnectHold;
}

bool Sender::TransmitEntry(uint64_t seq, Entry& e, Clock::time_point now,
                           const Transmit& transmit) {
  if (!transmit(seq, e.batch, e.attempts != 0)) return false;
  if (!e.in_flight) {
    if (in_flight_.empty()) quiet_since_ = now;  // the silence is counted from here
    e.in_flight = true;
    e.first_send = now;
    in_flight_.insert(seq);
  }
  e.tx = ++next_tx_;
  e.last_send = now;
  ++e.attempts;
  return true;
}

void Sender::Send(Clock::time_point now, const Transmit& transmit) {
  const Clock::duration timeout = AckTimeout();
  bool blocked = now < hold_sends_until_;  // connection lost, no new one yet
  if (!blocked && !in_flight_.empty() && now - quiet_since_ >= StallTimeout()) {
    // No ack at all for a whole (backed-off) timeout while batches are in
    // flight: a daemon that restarted without us seeing the connection drop,
    // or lost acks. Resend the window, oldest first; wait twice as long next time.
    size_t resent = 0;
    for (uint64_t seq : in_flight_) {
      if (!TransmitEntry(seq, pending_.at(seq), now, transmit)) {
        blocked = true;
        break;
      }
      ++resent;
    }
    OPGUARD_LOG(
        LogLevel::kDebug,
        "no acknowledgement for " +
            std::to_string(std::chrono::duration_cast<milliseconds>(now - quiet_since_).count()) +
            " ms; resent " + std::to_string(resent) + " batch(es) in flight");
    backoff_ = std::min(backoff_ + 1, kMaxBackoffShift);
    quiet_since_ = now;
  } else if (!blocked && newest_acked_tx_ != 0) {
    // Acks come back in send order: a batch sent before one that has been
    // acknowledged, and still unanswered after the ack timeout, was lost
    // (or its ack was). Resend it alone; acks are flowing, so the rest of
    // the window is merely queued at the daemon and is left alone.
    for (uint64_t seq : in_flight_) {
      Entry& e = pending_.at(seq);
      if (e.tx < newest_acked_tx_ && now - e.last_send >= LossTimeout(timeout, e.attempts)) {
        if (!TransmitEntry(seq, e, now, transmit)) {
          blocked = true;
          break;
        }
      }
    }
  }
  // New batches (and those a lost connection took), oldest first, while the
  // window has room; the rest wait in the bounded buffer.
  for (auto it = pending_.begin(); !blocked && it != pending_.end() && window_has_room(); ++it) {
    if (it->second.in_flight) continue;
    if (!TransmitEntry(it->first, it->second, now, transmit)) break;
  }
}

void Sender::SampleAckLatency(Clock::duration rtt) {
  // Smoothed latency and deviation as TCP keeps them (RFC 6298).
  if (!have_rtt_) {
    srtt_ = rtt;
    rttvar_ = rtt / 2;
    have_rtt_ = true;
  } else {
    Clock::duration err = rtt > srtt_ ? rtt - srtt_ : srtt_ - rtt;
    rttvar_ = (3 * rttvar_ + err) / 4;
    srtt_ = (7 * srtt_ + rtt) / 8;
  }
}

Sender::Clock::duration Sender::AckTimeout() const {
  if (!have_rtt_) return ack_timeout_;
  return std::clamp<Clock::duration>(2 * srtt_ + 4 * rttvar_, ack_timeout_,
                                     ack_timeout_ * kAckTimeoutCeilingFactor);
}

Sender::Clock::duration Sender::StallTimeout() const {
  const Clock::duration timeout = AckTimeout();
  const Clock::duration cap = std::max<Clock::duration>(timeout, kMaxStallWait);
  return std::min<Clock::duration>(timeout * (int64_t{1} << backoff_), cap);
}

Sender::Clock::duration Sender::LossTimeout(Clock::duration ack_timeout, uint32_t attempts) {
  uint32_t shift = std::min(attempts > 0 ? attempts - 1 : 0, kMaxBackoffShift);
  return ack_timeout * (int64_t{1} << shift);
}

Sender::Clock::time_point Sender::NextResendCheck() const {
  if (in_flight_.empty()) return Clock::time_point::max();
  Clock::time_point at = quiet_since_ + StallTimeout();
  const Clock::duration timeout = AckTimeout();
  for (uint64_t seq : in_flight_) {
    const Entry& e = pending_.at(seq);
    if (e.tx < newest_acked_tx_) at = std::min(at, e.last_send + LossTimeout(timeout, e.attempts));
  }
  return at;
}

bool Sender::LooksUnreachable(Clock::time_point now) const {
  if (pending_.empty()) return false;
  const Entry& oldest = pending_.begin()->second;
  return now - oldest.created >= std::max<Clock::duration>(AckTimeout(), milliseconds(2000)) &&
         last_ack_ < oldest.created;
}

uint64_t Sender::pending_records() const {
  uint64_t records = 0;
  for (const auto& [seq, e] : pending_) records += e.batch.records;
  return records;
}

}  // namespace opguard::shim
