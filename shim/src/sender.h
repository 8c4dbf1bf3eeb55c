// The shim's sending policy: which encoded batches to transmit, when to
// resend one, and how long to wait for acknowledgements (docs/shim.md, Flow
// control). It owns the unacknowledged batches and decides; it touches no
// socket and reads no clock (it logs its resends at debug level).
//
// Contract: the core's sender thread ("opguard-send") owns the only Sender and
// calls every method; nothing here is thread-safe. Each call that depends on
// time takes `now` from the caller, so a test can drive it with made-up times.
// The core reads the socket and passes each Ack's seq to Acknowledge, tells
// the connection monitor's events to ConnectionLost/ConnectionUp, and lets
// Send hand it the batches to put on the wire.
//
// Policy, in short:
//  - at most `max_in_flight` batches are sent and unacknowledged (the window);
//    the others wait, oldest first;
//  - the ack timeout is clamp(2 x smoothed ack latency + 4 x its deviation,
//    configured timeout, 8 x configured timeout), latency kept as TCP does;
//  - a batch is resent only on evidence of loss: a lost connection (the window
//    goes again once a new one is up), no ack at all for a timeout that doubles
//    per silent round, or a later batch acknowledged first.
#pragma once

#include <flatbuffers/detached_buffer.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

namespace opguard::shim {

class Sender {
 public:
  using Clock = std::chrono::steady_clock;

  // The adapted ack timeout stays within [configured, 8 x configured].
  static constexpr int64_t kAckTimeoutCeilingFactor = 8;
  // Silent rounds double the wait before the window is resent again, up to
  // 64 x, and never beyond a minute unless the ack timeout itself is longer.
  // A batch presumed lost alone waits at most 64 x the ack timeout too.
  static constexpr uint32_t kMaxBackoffShift = 6;
  static constexpr std::chrono::seconds kMaxStallWait{60};
  // After a lost connection nothing is sent until a new one has completed its
  // handshake (the old pipe may still take, and then drop, a message), or at
  // most this long if the monitor never says so.
  static constexpr std::chrono::seconds kReconnectHold{2};
  static constexpr std::chrono::milliseconds kFirstRetryWait{250};
  static constexpr std::chrono::seconds kMaxRetryWait{8};

  // One encoded batch, as the core hands it over and gets it back.
  struct Batch {
    // Shared with ZeroMQ while a transmission is queued (zero-copy sends).
    std::shared_ptr<const flatbuffers::DetachedBuffer> bytes;
    uint32_t records = 0;  // ops + collectives
  };

  Sender(std::chrono::milliseconds ack_timeout, size_t max_in_flight)
      : ack_timeout_(ack_timeout), max_in_flight_(max_in_flight) {}

  // A newly encoded batch; seqs arrive in increasing order. It is sent by a
  // later Send when the window has room.
  void Add(uint64_t seq, Batch batch, Clock::time_point now);

  // The daemon answered (durable or rejected) for `seq`: the batch is settled
  // and returned; nullopt for a seq that is not pending (a duplicate ack after
  // a resend). Any ack shows the daemon alive: the silence and backoff reset.
  std::optional<Batch> Acknowledge(uint64_t seq, Clock::time_point now);

  // The daemon cannot store `seq` now (its disk is full) and asks for it
  // later: the batch stays pending, and nothing is sent until a retry
  // delay, 250 ms doubled per round of "retry later" up to kMaxRetryWait.
  // The daemon is alive: no resend for silence meanwhile.
  void Defer(uint64_t seq, Clock::time_point now);

  // The connection dropped: whatever was in flight is sent again, oldest
  // first, once a new connection is up (ConnectionUp) or after kReconnectHold.
  void ConnectionLost(Clock::time_point now);
  void ConnectionUp() { hold_sends_until_ = {}; }
  // Nothing is sent before this (a lost connection, "retry later").
  Clock::time_point hold_until() const { return hold_sends_until_; }

  // Called by Send for each batch to put on the wire, oldest first; returns
  // false when the socket would not take it, which ends this Send.
  // `resend`: the batch was transmitted before (on any connection).
  using Transmit = std::function<bool(uint64_t seq, const Batch& batch, bool resend)>;
  // Resends what is presumed lost, then sends new batches while the window
  // has room. Nothing is sent while a lost connection is not yet replaced.
  void Send(Clock::time_point now, const Transmit& transmit);

  // Earliest time Send has a resend to do (time_point::max if none).
  Clock::time_point NextResendCheck() const;
  // The ack timeout now, and the silence allowed (backed off) before the
  // window is resent.
  Clock::duration AckTimeout() const;
  Clock::duration StallTimeout() const;
  // The first batch is older than max(ack timeout, 2 s) and nothing was
  // acknowledged since it was made: the daemon looks unreachable.
  bool LooksUnreachable(Clock::time_point now) const;
  size_t pending() const { return pending_.size(); }
  size_t in_flight() const { return in_flight_.size(); }
  size_t unsent() const { return pending_.size() - in_flight_.size(); }
  bool window_has_room() const { return in_flight_.size() < max_in_flight_; }
  // True when every batch below `seq` is settled.
  bool SettledBelow(uint64_t seq) const {
    return pending_.empty() || pending_.begin()->first >= seq;
  }
  uint64_t pending_records() const;

 private:
  struct Entry {
    Batch batch;
    bool in_flight = false;  // sent on the current connection, not yet acknowledged
    uint32_t attempts = 0;   // transmissions so far (all connections)
    uint64_t tx = 0;         // number of its latest transmission (next_tx_)
    Clock::time_point last_send{};
    // First transmission on the current connection: the ack latency is
    // measured from here, so a resend never makes the latency look shorter.
    Clock::time_point first_send{};
    Clock::time_point created{};
  };

  bool TransmitEntry(uint64_t seq, Entry& e, Clock::time_point now, const Transmit& transmit);
  void SampleAckLatency(Clock::duration rtt);
  // A batch presumed lost alone is resent after the ack timeout, doubled for
  // each earlier attempt.
  static Clock::duration LossTimeout(Clock::duration ack_timeout, uint32_t attempts);

  const Clock::duration ack_timeout_;
  const size_t max_in_flight_;
  std::map<uint64_t, Entry> pending_;
  // Acks come back in send order on one connection.
  std::set<uint64_t> in_flight_;  // seqs of pending_ entries with in_flight set
  uint64_t next_tx_ = 0;          // transmissions numbered from 1
  uint64_t newest_acked_tx_ = 0;  // latest transmission whose batch was acknowledged
  Clock::time_point quiet_since_{};
  Clock::time_point last_ack_{};
  Clock::time_point hold_sends_until_{};
  uint32_t backoff_ = 0;  // silent rounds since the last ack
  uint32_t retry_rounds_ = 0;  // rounds of "retry later" since the last durable ack
  bool have_rtt_ = false;
  Clock::duration srtt_{}, rttvar_{};
};

}  // namespace opguard::shim
