#include "sender.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace opguard::shim {
namespace {

using Clock = Sender::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A made-up clock: time T(ms) is ms after an arbitrary origin.
Clock::time_point T(int64_t ms) { return Clock::time_point{} + seconds(1000) + milliseconds(ms); }

Sender::Batch MakeBatch(uint32_t records) {
  return Sender::Batch{std::make_shared<const flatbuffers::DetachedBuffer>(), records};
}

// Records what Send puts on the wire: (seq, resend) in order. `refuse_after`
// transmissions are taken, then the socket refuses.
struct Wire {
  std::vector<std::pair<uint64_t, bool>> sent;
  size_t refuse_after = SIZE_MAX;

  Sender::Transmit Fn() {
    return [this](uint64_t seq, const Sender::Batch&, bool resend) {
      if (refuse_after == 0) return false;
      --refuse_after;
      sent.emplace_back(seq, resend);
      return true;
    };
  }
  std::vector<std::pair<uint64_t, bool>> Take() { return std::exchange(sent, {}); }
};

using Sent = std::vector<std::pair<uint64_t, bool>>;

void AddBatches(Sender& s, uint64_t first, uint64_t count, Clock::time_point now) {
  for (uint64_t seq = first; seq < first + count; ++seq) s.Add(seq, MakeBatch(10), now);
}

// A sender that has sent its first `count` batches (seqs from 0) at T(0).
Sender SentAtZero(milliseconds ack_timeout, size_t window, uint64_t count, Wire& wire) {
  Sender s(ack_timeout, window);
  AddBatches(s, 0, count, T(0));
  s.Send(T(0), wire.Fn());
  EXPECT_EQ(wire.Take().size(), std::min<size_t>(count, window));
  return s;
}

TEST(SenderWindow, FillsToMaxInFlightAndEachAckOpensOneSlot) {
  Sender s(milliseconds(1000), 3);
  Wire wire;
  AddBatches(s, 0, 5, T(0));
  s.Send(T(0), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{0, false}, {1, false}, {2, false}}));
  EXPECT_EQ(s.in_flight(), 3u);
  EXPECT_EQ(s.unsent(), 2u);
  EXPECT_FALSE(s.window_has_room());

  s.Send(T(1), wire.Fn());  // full window, nothing lost: nothing to send
  EXPECT_TRUE(wire.Take().empty());

  ASSERT_TRUE(s.Acknowledge(1, T(5)).has_value());
  EXPECT_TRUE(s.window_has_room());
  s.Send(T(5), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{3, false}}));

  ASSERT_TRUE(s.Acknowledge(0, T(6)));
  ASSERT_TRUE(s.Acknowledge(2, T(6)));
  s.Send(T(6), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{4, false}}));
  EXPECT_EQ(s.in_flight(), 2u);
  EXPECT_EQ(s.unsent(), 0u);
  EXPECT_EQ(s.pending(), 2u);
}

TEST(SenderWindow, ARefusedTransmissionEndsTheRoundAndIsRetriedNext) {
  Sender s(milliseconds(1000), 8);
  Wire wire;
  AddBatches(s, 0, 4, T(0));
  wire.refuse_after = 1;
  s.Send(T(0), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{0, false}}));
  EXPECT_EQ(s.in_flight(), 1u);
  EXPECT_EQ(s.unsent(), 3u);

  wire.refuse_after = SIZE_MAX;
  s.Send(T(5), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{1, false}, {2, false}, {3, false}}));
}

TEST(SenderAck, ReturnsTheBatchOnceAndSettlesInOrder) {
  Sender s(milliseconds(1000), 8);
  Wire wire;
  s.Add(0, MakeBatch(7), T(0));
  s.Add(1, MakeBatch(9), T(0));
  s.Add(2, MakeBatch(4), T(0));
  EXPECT_EQ(s.pending_records(), 20u);
  s.Send(T(0), wire.Fn());

  std::optional<Sender::Batch> b = s.Acknowledge(1, T(3));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->records, 9u);
  EXPECT_FALSE(s.Acknowledge(1, T(4)).has_value());   // a duplicate after a resend
  EXPECT_FALSE(s.Acknowledge(42, T(4)).has_value());  // never sent
  EXPECT_EQ(s.pending_records(), 11u);
  EXPECT_TRUE(s.SettledBelow(0));
  EXPECT_FALSE(s.SettledBelow(1));  // 0 still pending
  ASSERT_TRUE(s.Acknowledge(0, T(5)));
  EXPECT_TRUE(s.SettledBelow(2));
  EXPECT_FALSE(s.SettledBelow(3));
  ASSERT_TRUE(s.Acknowledge(2, T(5)));
  EXPECT_TRUE(s.SettledBelow(UINT64_MAX));
  EXPECT_EQ(s.pending(), 0u);
}

// One batch sent at `sent` and acknowledged `rtt` later.
void Sample(Sender& s, Wire& wire, uint64_t seq, int64_t sent, int64_t rtt) {
  s.Add(seq, MakeBatch(1), T(sent));
  s.Send(T(sent), wire.Fn());
  ASSERT_TRUE(s.Acknowledge(seq, T(sent + rtt)));
}

TEST(SenderRtt, AckTimeoutFollowsTheSmoothedLatencyAndDeviation) {
  Sender s(milliseconds(100), 8);
  Wire wire;
  EXPECT_EQ(s.AckTimeout(), milliseconds(100));  // no sample yet: the configured one
  Sample(s, wire, 0, 0, 100);
  // srtt 100, rttvar 50: 2 x 100 + 4 x 50.
  EXPECT_EQ(s.AckTimeout(), milliseconds(400));
  Sample(s, wire, 1, 1000, 200);
  // err 100; rttvar (3 x 50 + 100) / 4 = 62.5; srtt (7 x 100 + 200) / 8 = 112.5.
  EXPECT_EQ(s.AckTimeout(), std::chrono::microseconds(225000 + 250000));
  Sample(s, wire, 2, 2000, 112);
  // err 0.5; rttvar (187.5 + 0.5) / 4 = 47; srtt (787.5 + 112) / 8 = 112.4375.
  EXPECT_EQ(s.AckTimeout(), std::chrono::microseconds(224875 + 188000));
}

TEST(SenderRtt, AckTimeoutStaysBetweenTheConfiguredOneAndEightTimesIt) {
  Sender fast(milliseconds(100), 8);
  Wire wire;
  Sample(fast, wire, 0, 0, 10);  // 2 x 10 + 4 x 5 = 40 ms, below the floor
  EXPECT_EQ(fast.AckTimeout(), milliseconds(100));

  Sender slow(milliseconds(100), 8);
  Sample(slow, wire, 0, 0, 1000);  // 4 s, above the ceiling
  EXPECT_EQ(slow.AckTimeout(), milliseconds(800));
}

// A peer on the made-up clock that answers every transmission (resends too)
// in arrival order: it spends `service_ms` on each message, one at a time,
// and its ack leaves `delay_ms` after that. The sender is driven each ms:
// due acks first, then Send. Returns the resent seqs in order and checks the
// window on every step.
struct PeerRun {
  std::vector<uint64_t> resent;
  size_t most_in_flight = 0;
};
PeerRun RunAgainstPeer(Sender& s, size_t window, int64_t service_ms, int64_t delay_ms, int64_t until_ms) {
  PeerRun run;
  std::deque<std::pair<int64_t, uint64_t>> acks;  // (due ms, seq), due times increasing
  int64_t peer_free = 0;
  for (int64_t t = 0; t <= until_ms; ++t) {
    while (!acks.empty() && acks.front().first <= t) {
      s.Acknowledge(acks.front().second, T(t));
      acks.pop_front();
    }
    s.Send(T(t), [&](uint64_t seq, const Sender::Batch&, bool resend) {
      if (resend) run.resent.push_back(seq);
      peer_free = std::max(peer_free, t) + service_ms;
      acks.emplace_back(peer_free + delay_ms, seq);
      return true;
    });
    run.most_in_flight = std::max(run.most_in_flight, s.in_flight());
    EXPECT_LE(s.in_flight(), window);
  }
  return run;
}

// The policy behind shim_core_test's SlowAcksStoreEachRecordOnceWithinTheWindow,
// exactly: acks 5 x the configured timeout late. Before the first ack there
// is no latency to go by, so the first window goes again at 50 ms and at
// 150 ms (backoff); the first ack (250 ms) lifts the timeout to its ceiling
// and nothing else is ever resent.
TEST(SenderRtt, ASlowPeerSeesTheFirstWindowTwiceAndThenNoResend) {
  Sender s(milliseconds(50), 8);
  AddBatches(s, 0, 80, T(0));
  PeerRun run = RunAgainstPeer(s, 8, 0, 250, 5000);
  EXPECT_EQ(run.resent, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(run.most_in_flight, 8u);
  EXPECT_EQ(s.AckTimeout(), milliseconds(400));
  EXPECT_EQ(s.pending(), 0u);
}

TEST(SenderRtt, LatencyIsMeasuredFromTheFirstSendOnTheConnection) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(100), 8, 1, wire);
  s.Send(T(100), wire.Fn());  // silent for the ack timeout: resent
  EXPECT_EQ(wire.Take(), (Sent{{0, true}}));
  ASSERT_TRUE(s.Acknowledge(0, T(150)));
  // A sample of 150 ms (not 50): srtt 150, rttvar 75.
  EXPECT_EQ(s.AckTimeout(), milliseconds(600));
}

// With a silent daemon: the waits (ms) before each of the next `n` resends,
// each checked to happen at that very millisecond, not one earlier.
std::vector<int64_t> StallWaits(Sender& s, Wire& wire, int n) {
  std::vector<int64_t> waits;
  int64_t now = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t at = std::chrono::duration_cast<milliseconds>(s.NextResendCheck() - T(0)).count();
    s.Send(T(at - 1), wire.Fn());
    EXPECT_TRUE(wire.Take().empty()) << "resent before " << at;
    s.Send(T(at), wire.Fn());
    EXPECT_FALSE(wire.Take().empty()) << "nothing resent at " << at;
    waits.push_back(at - now);
    now = at;
  }
  return waits;
}

TEST(SenderBackoff, SilenceResendsTheWindowAfterADoublingWaitCappedAt64Times) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(100), 8, 1, wire);
  EXPECT_EQ(s.StallTimeout(), milliseconds(100));
  EXPECT_EQ(StallWaits(s, wire, 9),
            (std::vector<int64_t>{100, 200, 400, 800, 1600, 3200, 6400, 6400, 6400}));
  EXPECT_EQ(s.StallTimeout(), milliseconds(6400));

  // Any ack resets the wait.
  AddBatches(s, 1, 1, T(30000));
  s.Send(T(30000), wire.Fn());
  ASSERT_TRUE(s.Acknowledge(1, T(30001)));
  EXPECT_EQ(s.StallTimeout(), milliseconds(100));
}

TEST(SenderBackoff, TheWaitIsCappedAtAMinuteUnlessTheAckTimeoutIsLonger) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(2000), 8, 1, wire);
  EXPECT_EQ(StallWaits(s, wire, 8),
            (std::vector<int64_t>{2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000}));

  Sender long_timeout = SentAtZero(seconds(100), 8, 1, wire);
  EXPECT_EQ(StallWaits(long_timeout, wire, 3), (std::vector<int64_t>{100000, 100000, 100000}));
}

TEST(SenderBackoff, SilenceResendsTheWholeWindowOldestFirst) {
  Sender s(milliseconds(100), 3);
  Wire wire;
  AddBatches(s, 0, 5, T(0));
  s.Send(T(0), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{0, false}, {1, false}, {2, false}}));
  s.Send(T(100), wire.Fn());
  // The window again; the two waiting batches still wait for room.
  EXPECT_EQ(wire.Take(), (Sent{{0, true}, {1, true}, {2, true}}));
  EXPECT_EQ(s.unsent(), 2u);
}

TEST(SenderLoss, ABatchOvertakenByAnAckIsResentAloneWaitingLongerEachTime) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(1000), 8, 3, wire);
  // The daemon answers in order: 1 and 2 acknowledged means 0 was lost.
  ASSERT_TRUE(s.Acknowledge(1, T(10)));
  ASSERT_TRUE(s.Acknowledge(2, T(20)));
  EXPECT_EQ(s.NextResendCheck(), T(1000));
  s.Send(T(999), wire.Fn());
  EXPECT_TRUE(wire.Take().empty());

  // Acks keep flowing (a new batch every 500 ms, acknowledged at once), so
  // there is never a silence; 0 is resent after 1 s, then after 2 s more.
  uint64_t seq = 3;
  for (int64_t t = 500; t <= 3000; t += 500) {
    s.Send(T(t), wire.Fn());
    AddBatches(s, seq, 1, T(t));
    s.Send(T(t), wire.Fn());
    ASSERT_TRUE(s.Acknowledge(seq++, T(t)));
  }
  EXPECT_EQ(wire.Take(), (Sent{{3, false},
                               {0, true},
                               {4, false},
                               {5, false},
                               {6, false},
                               {7, false},
                               {0, true},
                               {8, false}}));
}

// The policy behind shim_core_test's BusyPeerStoresEachRecordOnceWithinTheWindow,
// exactly: a full window of 64 queues at a peer that takes 4 ms a message,
// so each ack comes about 256 ms after its batch, beyond even the adapted
// timeout's ceiling (8 x 20 ms); but one arrives every 4 ms: there is never
// a silence and never an ack out of order, so nothing is resent.
TEST(SenderLoss, ABusyPeerAckingInOrderIsNeverResentThoughEachAckIsLate) {
  Sender s(milliseconds(20), 64);
  AddBatches(s, 0, 250, T(0));
  PeerRun run = RunAgainstPeer(s, 64, 4, 0, 3000);
  EXPECT_TRUE(run.resent.empty());
  EXPECT_EQ(run.most_in_flight, 64u);
  EXPECT_EQ(s.pending(), 0u);
}

TEST(SenderReconnect, ALostConnectionResendsItsWindowOldestFirstOnceANewOneIsUp) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(1000), 3, 5, wire);
  ASSERT_TRUE(s.Acknowledge(1, T(5)));
  s.Send(T(5), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{3, false}}));

  s.ConnectionLost(T(10));
  EXPECT_EQ(s.in_flight(), 0u);
  EXPECT_EQ(s.NextResendCheck(), Clock::time_point::max());
  s.Send(T(20), wire.Fn());  // no new connection yet
  EXPECT_TRUE(wire.Take().empty());

  s.ConnectionUp();
  s.Send(T(30), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{0, true}, {2, true}, {3, true}}));
  s.Send(T(31), wire.Fn());
  EXPECT_TRUE(wire.Take().empty());  // 4 waits for room
}

TEST(SenderReconnect, WithoutNewsOfANewConnectionSendingResumesAfterTwoSeconds) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(1000), 3, 2, wire);
  s.ConnectionLost(T(10));
  s.Send(T(2009), wire.Fn());
  EXPECT_TRUE(wire.Take().empty());
  s.Send(T(2010), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{0, true}, {1, true}}));
}

TEST(SenderReconnect, ALostConnectionResetsTheBackoff) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(100), 3, 1, wire);
  s.Send(T(100), wire.Fn());
  s.Send(T(300), wire.Fn());
  EXPECT_EQ(s.StallTimeout(), milliseconds(400));
  s.ConnectionLost(T(310));
  EXPECT_EQ(s.StallTimeout(), milliseconds(100));
  s.ConnectionUp();
  s.Send(T(320), wire.Fn());
  EXPECT_EQ(s.NextResendCheck(), T(420));
}

TEST(SenderUnreachable, OnlyWhenNothingWasAcknowledgedSinceTheOldestBatchWasMade) {
  Sender s(milliseconds(100), 3);
  Wire wire;
  AddBatches(s, 0, 1, T(0));
  EXPECT_FALSE(s.LooksUnreachable(T(1999)));
  EXPECT_TRUE(s.LooksUnreachable(T(2000)));  // max(ack timeout, 2 s)

  Sender acking(milliseconds(100), 1);
  AddBatches(acking, 0, 2, T(0));
  acking.Send(T(0), wire.Fn());
  ASSERT_TRUE(acking.Acknowledge(0, T(5)));
  EXPECT_FALSE(acking.LooksUnreachable(T(60000)));                        // slow, but acking
  EXPECT_FALSE(Sender(milliseconds(100), 1).LooksUnreachable(T(60000)));  // nothing pending
}

// Whatever happens (acks in any order, duplicates, lost connections, a
// refusing socket, silences), only a batch that was added and not yet
// acknowledged is ever put on the wire, and never beyond the window.
TEST(SenderInvariant, OnlyUnacknowledgedBatchesAreSentAndTheWindowHolds) {
  constexpr size_t kWindow = 4;
  Sender s(milliseconds(20), kWindow);
  std::mt19937 rng(7);
  std::set<uint64_t> added, acked, on_wire, unanswered;
  uint64_t next_seq = 0;
  int64_t now = 0;
  bool refuse = false;
  const Sender::Transmit transmit = [&](uint64_t seq, const Sender::Batch&, bool resend) {
    if (refuse) return false;
    EXPECT_EQ(added.count(seq), 1u) << seq;
    EXPECT_EQ(acked.count(seq), 0u) << "acknowledged batch " << seq << " sent again";
    EXPECT_EQ(resend, on_wire.count(seq) == 1) << seq;
    on_wire.insert(seq);
    unanswered.insert(seq);
    return true;
  };
  for (int step = 0; step < 20000; ++step) {
    now += static_cast<int64_t>(rng() % 30);
    switch (rng() % 6) {
      case 0:
        added.insert(next_seq);
        s.Add(next_seq++, MakeBatch(1), T(now));
        break;
      case 1: {  // the peer answers something it received, mostly once, now and then again
        const std::set<uint64_t>& from = rng() % 4 == 0 ? on_wire : unanswered;
        if (!from.empty()) {
          const uint64_t seq = *std::next(from.begin(), static_cast<long>(rng() % from.size()));
          EXPECT_EQ(s.Acknowledge(seq, T(now)).has_value(), acked.count(seq) == 0);
          acked.insert(seq);
          unanswered.erase(seq);
        }
        break;
      }
      case 2:
        if (rng() % 8 == 0) s.ConnectionLost(T(now));
        if (rng() % 2 == 0) s.ConnectionUp();
        break;
      default:
        refuse = rng() % 10 == 0;
        s.Send(T(now), transmit);
        break;
    }
    ASSERT_LE(s.in_flight(), kWindow);
    ASSERT_EQ(s.pending(), added.size() - acked.size());
  }
  EXPECT_GT(acked.size(), 1000u);  // the walk did exercise the sender
}

// "Retry later" (the daemon's disk is full): the batches stay, nothing is
// sent until the hold ends, holds double per round, and a durable ack
// resets them.
TEST(SenderRetry, DeferredBatchesAreKeptAndSentAgainAfterAGrowingHold) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(1000), 4, 4, wire);
  for (uint64_t seq = 0; seq < 4; ++seq) s.Defer(seq, T(10));
  EXPECT_EQ(s.pending(), 4u);
  EXPECT_EQ(s.in_flight(), 0u);
  EXPECT_EQ(s.hold_until(), T(10 + 250));
  s.Send(T(200), wire.Fn());
  EXPECT_TRUE(wire.Take().empty());
  EXPECT_FALSE(s.LooksUnreachable(T(200)));
  s.Send(T(260), wire.Fn());
  EXPECT_EQ(wire.Take(), (Sent{{0, true}, {1, true}, {2, true}, {3, true}}));

  // A second round waits twice as long; silence meanwhile is not a loss.
  for (uint64_t seq = 0; seq < 4; ++seq) s.Defer(seq, T(300));
  EXPECT_EQ(s.hold_until(), T(300 + 500));
  s.Send(T(790), wire.Fn());
  EXPECT_TRUE(wire.Take().empty());
  s.Send(T(800), wire.Fn());
  EXPECT_EQ(wire.Take().size(), 4u);

  // Stored at last: the next "retry later" starts from 250 ms again.
  ASSERT_TRUE(s.Acknowledge(0, T(900)).has_value());
  s.Defer(1, T(910));
  EXPECT_EQ(s.hold_until(), T(910 + 250));
  EXPECT_EQ(s.pending(), 3u);
}

// The hold never exceeds kMaxRetryWait, however long the disk stays full.
TEST(SenderRetry, TheHoldIsCapped) {
  Wire wire;
  Sender s = SentAtZero(milliseconds(1000), 1, 1, wire);
  int64_t now = 0;
  Clock::duration hold{};
  for (int round = 0; round < 20; ++round) {
    s.Defer(0, T(now));
    hold = s.hold_until() - T(now);
    EXPECT_LE(hold, Sender::kMaxRetryWait);
    now += std::chrono::duration_cast<milliseconds>(hold).count();
    s.Send(T(now), wire.Fn());
    EXPECT_EQ(wire.Take().size(), 1u);
  }
  EXPECT_EQ(hold, Sender::kMaxRetryWait);
}

}  // namespace
}  // namespace opguard::shim
