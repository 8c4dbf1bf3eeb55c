// Core against a fake daemon over real ZeroMQ ipc:// sockets: batching by
// count and time, resend after a daemon restart or a lost ack, flow control
// against a slow daemon (window, adaptive ack timeout), gap notices when the
// buffer is full, rejected batches, and never blocking the caller. These
// tests assert only what holds however threads are scheduled; how many
// resends a given timing causes is tested exactly in sender_test.cc.
#include "shim_core.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>

#include "fake_daemon.h"

namespace opguard::shim {
namespace {

using testing::FakeDaemon;
using testing::FakeDaemonOptions;
using testing::Received;
using Clock = std::chrono::steady_clock;

class CoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/opguard-shim-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    endpoint_ = "ipc://" + dir_ + "/ingest.sock";
    config_.enabled = true;
    config_.run = "core-test";
    config_.endpoint = endpoint_;
    config_.rank = 2;
    config_.world_size = 4;
    config_.batch_interval_ms = 10;
    config_.ack_timeout_ms = 200;
    config_.flush_timeout_ms = 2000;
    SetLogLevel(LogLevel::kError);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Core> StartCore() {
    auto core = Core::Start(config_);
    EXPECT_TRUE(core.ok()) << core.status().message();
    return core.ok() ? std::move(core).value() : nullptr;
  }

  std::string dir_;
  std::string endpoint_;
  Config config_;
};

// One op with one tensor input, one scalar input and one output.
int Record(Core& core, uint32_t lane, uint64_t fp, uint64_t* index = nullptr,
           uint64_t name = 0, uint64_t site = 0) {
  int64_t shape[2] = {4, 8};
  opguard_value in[2] = {};
  in[0].kind = OPGUARD_VALUE_TENSOR;
  in[0].tensor.fp_lo = fp - 1;
  in[0].tensor.shape = shape;
  in[0].tensor.ndim = 2;
  in[0].tensor.dtype = OPGUARD_DTYPE_FLOAT32;
  in[1].kind = OPGUARD_VALUE_SCALAR;
  in[1].scalar_dtype = OPGUARD_DTYPE_FLOAT32;
  in[1].scalar_bits = 0x40400000;
  opguard_tensor out = {};
  out.fp_lo = fp;
  out.fp_hi = ~fp;
  out.shape = shape;
  out.ndim = 2;
  out.dtype = OPGUARD_DTYPE_FLOAT32;
  out.has_stats = 1;
  out.stats.max = 1.5;
  opguard_op op = {};
  op.struct_size = sizeof(op);
  op.lane = lane;
  op.op_index = OPGUARD_AUTO;
  op.name = name;
  op.site = site;
  op.num_inputs = 2;
  op.inputs = in;
  op.num_outputs = 1;
  op.outputs = &out;
  return core.RecordOp(op, index);
}

std::set<uint64_t> OpIndices(const Received& r, uint32_t lane) {
  std::set<uint64_t> s;
  for (const auto& op : r.ops) {
    if (op.lane == lane) s.insert(op.op_index);
  }
  return s;
}

TEST_F(CoreTest, BatchesByCountThenFlushSendsTheRest) {
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  config_.batch_records = 10;
  config_.batch_interval_ms = 60000;  // only count and flush may cut
  auto core = StartCore();
  ASSERT_TRUE(core);
  uint64_t name = core->Intern("aten::linear");
  uint64_t site = core->Site("train.py", 42, "forward");
  EXPECT_EQ(site, SiteId("train.py", 42, "forward"));
  for (int i = 0; i < 10; ++i) {
    uint64_t index = 99;
    ASSERT_EQ(Record(*core, 0, 1000 + i, &index, name, site), OPGUARD_OK);
    EXPECT_EQ(index, static_cast<uint64_t>(i));
  }
  // A full batch goes out by count alone (the interval is a minute).
  ASSERT_TRUE(daemon.WaitFor([](const Received& r) { return r.records >= 10; }, 5000));
  for (uint64_t upto : {20, 30}) {
    for (uint64_t i = upto - 10; i < upto; ++i) {
      ASSERT_EQ(Record(*core, 0, 1000 + i, nullptr, name, site), OPGUARD_OK);
    }
    ASSERT_TRUE(daemon.WaitFor([&](const Received& r) { return r.records >= upto; }, 5000));
  }
  for (int i = 30; i < 35; ++i) ASSERT_EQ(Record(*core, 0, 1000 + i, nullptr, name, site), OPGUARD_OK);
  // The remaining 5 are below the count and wait for the interval or a flush.
  EXPECT_FALSE(daemon.WaitFor([](const Received& r) { return r.records > 30; }, 300));
  Received r = daemon.Snapshot();
  EXPECT_EQ(r.records % 10, 0u);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  r = daemon.Snapshot();
  EXPECT_EQ(r.records, 35u);
  EXPECT_EQ(OpIndices(r, 0).size(), 35u);
  EXPECT_EQ(*OpIndices(r, 0).rbegin(), 34u);
  EXPECT_EQ(r.strings.at(name), "aten::linear");
  EXPECT_EQ(r.strings.at(StringId("train.py")), "train.py");
  EXPECT_EQ(r.sites.count(site), 1u);
  EXPECT_EQ(r.announces, 1u);  // first batch of the session only
  EXPECT_EQ(r.runs, std::vector<std::string>{"core-test"});
  EXPECT_EQ(r.invalid, 0u);
  for (const auto& op : r.ops) {
    EXPECT_EQ(op.rank, 2u);
    EXPECT_EQ(op.inputs, 2u);
    EXPECT_EQ(op.outputs, 1u);
    EXPECT_EQ(op.out_lo, 1000 + op.op_index);
    EXPECT_EQ(op.name, name);
  }
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  core->GetCounters(&c);
  EXPECT_EQ(c.records_enqueued, 35u);
  EXPECT_EQ(c.records_acked, 35u);
  EXPECT_EQ(c.records_sent, 35u);
  EXPECT_EQ(c.records_dropped, 0u);
  EXPECT_EQ(c.pending_batches, 0u);
  EXPECT_EQ(core->Shutdown(2000), OPGUARD_OK);
  r = daemon.Snapshot();
  EXPECT_EQ(r.end_of_run, 1u);
}

TEST_F(CoreTest, BatchesByTime) {
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  config_.batch_records = 100000;
  config_.batch_interval_ms = 20;
  auto core = StartCore();
  ASSERT_TRUE(core);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(Record(*core, 1, i + 1), OPGUARD_OK);
  // No flush: the interval alone must send them.
  EXPECT_TRUE(daemon.WaitFor([](const Received& r) { return r.records == 5; }, 3000));
}

TEST_F(CoreTest, ResendsAfterDaemonRestartWithoutLossOrDuplicateRecords) {
  auto daemon = std::make_unique<FakeDaemon>(endpoint_);
  ASSERT_TRUE(daemon->Start());
  config_.batch_records = 16;
  auto core = StartCore();
  ASSERT_TRUE(core);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received before = daemon->Snapshot();
  // The daemon goes away (its state is "durable": we keep what it stored).
  daemon->Stop();
  for (int i = 100; i < 200; ++i) ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
  EXPECT_EQ(core->Flush(300), OPGUARD_ERR_TIMEOUT);
  ASSERT_TRUE(daemon->Start());
  ASSERT_EQ(core->Flush(10000), OPGUARD_OK);
  Received after = daemon->Snapshot();
  EXPECT_EQ(after.records, 200u);
  auto indices = OpIndices(after, 0);
  EXPECT_EQ(indices.size(), 200u);
  EXPECT_EQ(*indices.rbegin(), 199u);
  EXPECT_EQ(after.ops.size(), 200u);  // no batch stored twice
  EXPECT_EQ(after.sessions.size(), 1u);
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  core->GetCounters(&c);
  EXPECT_EQ(c.records_acked, 200u);
  EXPECT_EQ(c.records_dropped, 0u);
  EXPECT_GE(before.records, 100u);
}

TEST_F(CoreTest, ResendsWhenAnAckIsLost) {
  FakeDaemonOptions options;
  options.ack = false;
  FakeDaemon daemon(endpoint_, options);
  ASSERT_TRUE(daemon.Start());
  config_.batch_records = 10;
  auto core = StartCore();
  ASSERT_TRUE(core);
  for (int i = 0; i < 20; ++i) ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
  ASSERT_TRUE(daemon.WaitFor([](const Received& r) { return r.records == 20; }, 5000));
  daemon.SetAck(true);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon.Snapshot();
  EXPECT_GE(r.duplicates, 1u);  // the same batch arrived again...
  EXPECT_EQ(r.records, 20u);    // ...and was stored once
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  core->GetCounters(&c);
  EXPECT_GE(c.batches_resent, 1u);
  EXPECT_EQ(c.records_acked, 20u);
}

opguard_counters Counters(Core& core) {
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  core.GetCounters(&c);
  return c;
}

// Polls `done` until it holds; false after `timeout` (a guard against a hang,
// not a limit on how long the work may take).
bool WaitUntil(const std::function<bool()>& done, std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// What holds however the machine schedules the threads, after a run in which
// every batch was eventually acknowledged: each record stored once, every
// extra copy the peer saw counted by the core as a resend, and never more
// distinct unanswered batches at the peer than the window. How many resends
// a given timing causes is sender_test.cc's to pin down, on a made-up clock.
void ExpectStoredOnceWithinTheWindow(const Received& r, const opguard_counters& c, uint64_t records,
                                     uint32_t window) {
  EXPECT_EQ(r.records, records);
  EXPECT_EQ(r.ops.size(), records);  // stored once each
  EXPECT_EQ(OpIndices(r, 0).size(), records);
  EXPECT_EQ(c.records_acked, records);
  EXPECT_EQ(c.records_dropped, 0u);
  EXPECT_EQ(c.pending_batches, 0u);
  EXPECT_LE(r.duplicates, c.batches_resent);
  EXPECT_LE(r.max_outstanding, window);
}

// The reported failure: acks arrive 5 x the configured timeout late. Only a
// window of batches is ever in flight, every record is stored once, and the
// ack timeout has followed the latency up. (That only the first window is
// sent again, twice, is SenderRtt.ASlowPeerSeesTheFirstWindowTwiceAndThenNoResend.)
TEST_F(CoreTest, SlowAcksStoreEachRecordOnceWithinTheWindow) {
  FakeDaemonOptions options;
  options.ack_delay_ms = 250;
  FakeDaemon daemon(endpoint_, options);
  ASSERT_TRUE(daemon.Start());
  constexpr uint32_t kWindow = 8;
  config_.batch_records = 10;
  config_.batch_interval_ms = 5;
  config_.ack_timeout_ms = 50;
  config_.max_in_flight = kWindow;
  auto core = StartCore();
  ASSERT_TRUE(core);
  constexpr uint64_t kRecords = 800;  // 80 batches or more: 10 windows or more
  for (uint64_t i = 0; i < kRecords; ++i) {
    ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
    if (i % 100 == 99) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  uint64_t most_pending = 0;
  ASSERT_TRUE(WaitUntil([&] {
    opguard_counters c = Counters(*core);
    most_pending = std::max(most_pending, c.pending_batches);
    return c.records_acked == kRecords;
  }));
  ASSERT_EQ(core->Flush(120000), OPGUARD_OK);
  opguard_counters c = Counters(*core);
  ExpectStoredOnceWithinTheWindow(daemon.Snapshot(), c, kRecords, kWindow);
  EXPECT_LE(most_pending, c.batches_sent);  // never more batches than were made
  // Every ack took at least the peer's 250 ms, so 2 x the smoothed latency is
  // over the ceiling (8 x 50 ms) whatever the scheduling added.
  EXPECT_TRUE(WaitUntil([&] { return core->ack_timeout_now_ms() == 400u; }))
      << core->ack_timeout_now_ms();
  std::printf("slow acks: %llu batches, %llu resent\n", static_cast<unsigned long long>(c.batches_sent),
              static_cast<unsigned long long>(c.batches_resent));
}

// A busy daemon: acks come one by one, each long after its batch was sent
// (the window queues at the daemon), but they keep coming. Every record is
// stored once within the window. (That nothing merely queued is resent is
// SenderLoss.ABusyPeerAckingInOrderIsNeverResentThoughEachAckIsLate.)
TEST_F(CoreTest, BusyPeerStoresEachRecordOnceWithinTheWindow) {
  FakeDaemonOptions options;
  options.service_us = 4000;  // 4 ms a message: 64 queued batches wait 256 ms
  FakeDaemon daemon(endpoint_, options);
  ASSERT_TRUE(daemon.Start());
  config_.batch_records = 10;
  config_.batch_interval_ms = 5;
  config_.ack_timeout_ms = 50;
  auto core = StartCore();
  ASSERT_TRUE(core);
  constexpr uint64_t kRecords = 2500;
  for (uint64_t i = 0; i < kRecords; ++i) ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
  ASSERT_EQ(core->Flush(120000), OPGUARD_OK);
  opguard_counters c = Counters(*core);
  ExpectStoredOnceWithinTheWindow(daemon.Snapshot(), c, kRecords, config_.max_in_flight);
  std::printf("busy peer: %llu batches, %llu resent\n", static_cast<unsigned long long>(c.batches_sent),
              static_cast<unsigned long long>(c.batches_resent));
}

// One ack is lost while later batches are acknowledged: that batch is sent
// again while records are still flowing, without waiting for a flush, and
// stored once. (That it is resent alone, after the ack timeout, is
// SenderLoss.ABatchOvertakenByAnAckIsResentAloneWaitingLongerEachTime.)
TEST_F(CoreTest, LostAckWhileAcksFlowIsResentWithoutAFlush) {
  FakeDaemonOptions options;
  options.drop_first_ack_seqs = {3};
  FakeDaemon daemon(endpoint_, options);
  ASSERT_TRUE(daemon.Start());
  config_.batch_records = 10;
  config_.batch_interval_ms = 5;
  config_.ack_timeout_ms = 200;
  auto core = StartCore();
  ASSERT_TRUE(core);
  uint64_t recorded = 0;
  int rc = OPGUARD_OK;
  ASSERT_TRUE(WaitUntil([&] {
    for (int i = 0; i < 10 && rc == OPGUARD_OK; ++i) rc = Record(*core, 0, ++recorded);
    Received r = daemon.Snapshot();
    return rc != OPGUARD_OK || (r.receipts.count(3) != 0 && r.receipts.at(3) >= 2);
  })) << "batch 3 was not resent while records flowed";
  ASSERT_EQ(rc, OPGUARD_OK);
  ASSERT_EQ(core->Flush(120000), OPGUARD_OK);
  Received r = daemon.Snapshot();
  EXPECT_EQ(r.acks_lost, 1u);
  EXPECT_GE(r.duplicates, 1u);
  opguard_counters c = Counters(*core);
  EXPECT_GE(c.batches_resent, 1u);
  ExpectStoredOnceWithinTheWindow(r, c, recorded, config_.max_in_flight);
}

// A daemon restart loses what was in flight: the peer never answered the
// first window, so each of its batches is sent again on the new connection,
// and stored once. (That only the window goes again, oldest first, is
// SenderReconnect.ALostConnectionResendsItsWindowOldestFirstOnceANewOneIsUp.)
TEST_F(CoreTest, RestartResendsTheUnansweredWindow) {
  FakeDaemonOptions options;
  options.ack = false;  // the first daemon answers nothing
  auto daemon = std::make_unique<FakeDaemon>(endpoint_, options);
  ASSERT_TRUE(daemon->Start());
  constexpr uint32_t kWindow = 4;
  config_.batch_records = 10;
  config_.batch_interval_ms = 5;
  config_.ack_timeout_ms = 5000;  // the restart, not a silence, is what should trigger the resend
  config_.max_in_flight = kWindow;
  auto core = StartCore();
  ASSERT_TRUE(core);
  for (int i = 0; i < 300; ++i) ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
  ASSERT_TRUE(daemon->WaitFor([](const Received& r) { return r.batches >= kWindow; }, 120000));
  daemon->Stop();
  Received first = daemon->Snapshot();
  EXPECT_EQ(first.batches, kWindow);  // without acks, no room for more
  daemon->SetAck(true);
  ASSERT_TRUE(daemon->Start());
  ASSERT_EQ(core->Flush(120000), OPGUARD_OK);
  Received r = daemon->Snapshot();
  for (const auto& [seq, times] : first.receipts) {
    EXPECT_GE(r.receipts.at(seq), times + 1) << "batch " << seq << " was not resent";
  }
  opguard_counters c = Counters(*core);
  EXPECT_GE(c.batches_resent, kWindow);
  ExpectStoredOnceWithinTheWindow(r, c, 300, kWindow);
}

TEST_F(CoreTest, FullBufferDropsAndReportsExactGaps) {
  config_.buffer_bytes = 64 << 10;  // a few hundred records
  config_.batch_records = 64;
  auto core = StartCore();
  ASSERT_TRUE(core);
  // No daemon: everything stays buffered until the buffer is full.
  int ok = 0, dropped = 0;
  for (int i = 0; i < 2000; ++i) {
    int rc = Record(*core, 3, i + 1);
    ASSERT_TRUE(rc == OPGUARD_OK || rc == OPGUARD_ERR_DROPPED) << rc;
    (rc == OPGUARD_OK ? ok : dropped)++;
  }
  ASSERT_GT(ok, 0);
  ASSERT_GT(dropped, 0);
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  ASSERT_EQ(core->Flush(10000), OPGUARD_OK);
  // Once drained, recording works again.
  for (int i = 2000; i < 2010; ++i) ASSERT_EQ(Record(*core, 3, i + 1), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon.Snapshot();
  // Every op index 0..2009 is either received or inside exactly one gap.
  std::vector<int> covered(2010, 0);
  for (const auto& op : r.ops) covered.at(op.op_index)++;
  uint64_t gap_records = 0;
  for (const auto& g : r.gaps) {
    EXPECT_EQ(g.lane, 3u);
    EXPECT_EQ(g.communicator, 0u);
    EXPECT_EQ(g.records_dropped, g.last_op - g.first_op + 1);
    gap_records += g.records_dropped;
    for (uint64_t i = g.first_op; i <= g.last_op; ++i) covered.at(i)++;
  }
  for (size_t i = 0; i < covered.size(); ++i) ASSERT_EQ(covered[i], 1) << "op " << i;
  EXPECT_EQ(gap_records, static_cast<uint64_t>(dropped));
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  core->GetCounters(&c);
  EXPECT_EQ(c.records_dropped, static_cast<uint64_t>(dropped));
  EXPECT_EQ(c.ops_missing, static_cast<uint64_t>(dropped));
  EXPECT_EQ(c.gaps_reported, r.gaps.size());
}

TEST_F(CoreTest, RejectedBatchIsDroppedAndCounted) {
  FakeDaemonOptions options;
  options.reject_seqs = {1};
  FakeDaemon daemon(endpoint_, options);
  ASSERT_TRUE(daemon.Start());
  config_.batch_records = 10;
  config_.batch_interval_ms = 60000;
  auto core = StartCore();
  ASSERT_TRUE(core);
  for (int i = 0; i < 30; ++i) ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  core->GetCounters(&c);
  EXPECT_EQ(c.batches_rejected, 1u);
  EXPECT_EQ(c.records_rejected, 10u);
  EXPECT_EQ(c.records_acked, 20u);
  EXPECT_EQ(c.batches_resent, 0u);  // a rejected batch is not retried
}

TEST_F(CoreTest, CollectivesAndCallerGaps) {
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  auto core = StartCore();
  ASSERT_TRUE(core);
  uint32_t ranks[4] = {0, 1, 2, 3};
  opguard_communicator comm = {};
  comm.struct_size = sizeof(comm);
  comm.size = 4;
  comm.name = "world";
  comm.ranks = ranks;
  uint64_t comm_id = core->DefineCommunicator(comm);
  EXPECT_NE(comm_id, 0u);
  EXPECT_EQ(core->DefineCommunicator(comm), comm_id);  // same identity, same id
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Record(*core, 0, i + 1), OPGUARD_OK);
  int64_t shape[1] = {16};
  opguard_tensor t = {};
  t.fp_lo = 77;
  t.shape = shape;
  t.ndim = 1;
  t.dtype = OPGUARD_DTYPE_FLOAT32;
  opguard_collective coll = {};
  coll.struct_size = sizeof(coll);
  coll.phase = OPGUARD_PHASE_ENTERED;
  coll.kind = OPGUARD_COLL_ALL_REDUCE;
  coll.communicator = comm_id;
  coll.seq = OPGUARD_AUTO;
  coll.op_index = OPGUARD_AUTO;
  coll.step = OPGUARD_AUTO;
  coll.num_inputs = 1;
  coll.inputs = &t;
  uint64_t seq = 99;
  ASSERT_EQ(core->RecordCollective(coll, &seq), OPGUARD_OK);
  EXPECT_EQ(seq, 0u);
  coll.phase = OPGUARD_PHASE_COMPLETED;
  coll.seq = seq;
  coll.num_outputs = 1;
  coll.outputs = &t;
  ASSERT_EQ(core->RecordCollective(coll, nullptr), OPGUARD_OK);
  // Completed must name its sequence number.
  coll.seq = OPGUARD_AUTO;
  EXPECT_EQ(core->RecordCollective(coll, nullptr), OPGUARD_ERR_INVALID);
  uint64_t first = 0;
  ASSERT_EQ(core->ReportGap(0, 5, "fingerprint failed", &first), OPGUARD_OK);
  EXPECT_EQ(first, 3u);
  uint64_t next = 0;
  ASSERT_EQ(Record(*core, 0, 9, &next), OPGUARD_OK);
  EXPECT_EQ(next, 8u);  // the reserved indices are consumed
  ASSERT_EQ(core->MarkStep(0, 1), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon.Snapshot();
  EXPECT_EQ(r.communicators.count(comm_id), 1u);
  ASSERT_EQ(r.collectives.size(), 2u);
  EXPECT_EQ(r.collectives[0].op_index, 3u);  // issued after ops 0..2
  EXPECT_EQ(r.collectives[1].out_lo, 77u);
  ASSERT_EQ(r.gaps.size(), 1u);
  EXPECT_EQ(r.gaps[0].first_op, 3u);
  EXPECT_EQ(r.gaps[0].last_op, 7u);
  EXPECT_EQ(r.gaps[0].reason, "fingerprint failed");
  EXPECT_EQ(r.steps, 1u);
}

TEST_F(CoreTest, RunInfoIsAnnouncedAndReannouncedWhenItChanges) {
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  auto core = StartCore();
  ASSERT_TRUE(core);
  ASSERT_EQ(core->SetRunInfo(OPGUARD_INFO_FRAMEWORK, "", "pytorch"), OPGUARD_OK);
  ASSERT_EQ(core->SetRunInfo(OPGUARD_INFO_DETERMINISM, "use_deterministic_algorithms", "true"), OPGUARD_OK);
  ASSERT_EQ(core->SetRunInfo(OPGUARD_INFO_VERSION, "torch", "2.3.0"), OPGUARD_OK);
  EXPECT_EQ(core->SetRunInfo(99, "k", "v"), OPGUARD_ERR_INVALID);
  ASSERT_EQ(Record(*core, 0, 1), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon.Snapshot();
  EXPECT_EQ(r.framework, "pytorch");
  EXPECT_EQ(r.determinism.at("use_deterministic_algorithms"), "true");
  EXPECT_EQ(r.versions.at("torch"), "2.3.0");
  EXPECT_EQ(r.versions.count("opguard-shim"), 1u);
  ASSERT_EQ(core->SetRunInfo(OPGUARD_INFO_DETERMINISM, "cudnn.benchmark", "false"), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  r = daemon.Snapshot();
  EXPECT_EQ(r.announces, 2u);
  EXPECT_EQ(r.determinism.at("cudnn.benchmark"), "false");
}

// The daemon refuses a batch holding text that is not UTF-8, so a Latin-1
// value (a path, a hostname) is refused here, where the caller sees it.
TEST_F(CoreTest, RunInfoThatIsNotUtf8IsRefused) {
  auto core = StartCore();
  ASSERT_TRUE(core);
  EXPECT_EQ(core->SetRunInfo(OPGUARD_INFO_JOB_ID, "", "caf\xe9"), OPGUARD_ERR_INVALID);
  EXPECT_EQ(core->SetRunInfo(OPGUARD_INFO_FRAMEWORK, "", "\xff"), OPGUARD_ERR_INVALID);
  EXPECT_EQ(core->SetRunInfo(OPGUARD_INFO_ENVIRONMENT, "HOME", "/home/j\xf6rg"), OPGUARD_ERR_INVALID);
  EXPECT_EQ(core->SetRunInfo(OPGUARD_INFO_DETERMINISM, "k\xff", "true"), OPGUARD_ERR_INVALID);
  EXPECT_EQ(core->SetRunInfo(OPGUARD_INFO_ENVIRONMENT, "HOME", "/home/j\xc3\xb6rg"), OPGUARD_OK);
}

TEST_F(CoreTest, InvalidArgumentsAreRefusedAndCounted) {
  auto core = StartCore();
  ASSERT_TRUE(core);
  EXPECT_EQ(Record(*core, kMaxLanes, 1), OPGUARD_ERR_INVALID);
  opguard_op op = {};
  op.struct_size = sizeof(op);
  op.op_index = OPGUARD_AUTO;
  op.num_inputs = 1;  // but no inputs pointer
  EXPECT_EQ(core->RecordOp(op, nullptr), OPGUARD_ERR_INVALID);
  op.num_inputs = 0;
  op.op_index = 10;
  EXPECT_EQ(core->RecordOp(op, nullptr), OPGUARD_OK);
  op.op_index = 10;  // not increasing
  EXPECT_EQ(core->RecordOp(op, nullptr), OPGUARD_ERR_INVALID);
  opguard_tensor bad = {};
  bad.ndim = 3;  // no shape
  op.op_index = OPGUARD_AUTO;
  op.num_outputs = 1;
  op.outputs = &bad;
  EXPECT_EQ(core->RecordOp(op, nullptr), OPGUARD_ERR_INVALID);
  // An older caller's smaller struct is read only as far as it goes.
  opguard_op old = {};
  old.struct_size = offsetof(opguard_op, start_ns);
  old.op_index = OPGUARD_AUTO;
  uint64_t index = 0;
  EXPECT_EQ(core->RecordOp(old, &index), OPGUARD_OK);
  EXPECT_EQ(index, 11u);
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  core->GetCounters(&c);
  EXPECT_EQ(c.records_invalid, 4u);
  EXPECT_EQ(c.records_enqueued, 2u);
  EXPECT_EQ(core->LanePosition(0), 12u);
}

TEST_F(CoreTest, NeverBlocksWithoutADaemon) {
  config_.buffer_bytes = 4 << 20;
  auto core = StartCore();
  ASSERT_TRUE(core);
  // No daemon: every call returns at once, OK while the buffer has room and
  // DROPPED once it is full. A call that waited for the network would hang
  // here until ctest's timeout. (How long a call takes without a daemon is
  // shim_bench's BM_RecordOpWithoutDaemon.)
  constexpr int kRecords = 200000;
  int ok = 0, dropped = 0;
  for (int i = 0; i < kRecords; ++i) {
    int rc = Record(*core, 0, i + 1);
    ASSERT_TRUE(rc == OPGUARD_OK || rc == OPGUARD_ERR_DROPPED) << rc;
    (rc == OPGUARD_OK ? ok : dropped)++;
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(dropped, 0);  // 4 MiB cannot hold 200k records
  opguard_counters c = Counters(*core);
  EXPECT_EQ(c.records_dropped, static_cast<uint64_t>(dropped));
  EXPECT_EQ(c.records_acked, 0u);
  // Shutdown gives up after its timeout rather than waiting for acks.
  EXPECT_EQ(core->Shutdown(200), OPGUARD_ERR_TIMEOUT);
  EXPECT_EQ(Record(*core, 0, 1), OPGUARD_ERR_DISABLED);
}

}  // namespace
}  // namespace opguard::shim
