// The ingest contract (docs/daemon.md, "The ingest contract") against a real
// opguardd process, real RocksDB and real ZeroMQ: a Durable ack means the
// batch's records are stored; each record is stored once and counted once,
// whatever order, resends, restarts and kill -9 came in between; what is not
// stored is a gap.
//
// OPGUARD_CONTRACT_SEED=N replays one run of the property test;
// OPGUARDD_UNDER_TEST=PATH runs these against another opguardd build.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>
#include <zmq.hpp>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::BatchOptions;
using testing::DaemonProcess;

// One batch as a sender holds it.
struct Frame {
  uint32_t rank = 0;
  uint64_t session = 0, seq = 0;
  uint64_t first_op = 0;
  uint32_t ops = 0;
  std::string bytes;
};
using FrameKey = std::tuple<uint32_t, uint64_t, uint64_t>;
FrameKey KeyOf(const Frame& f) { return {f.rank, f.session, f.seq}; }

// A sender with no policy of its own: sends the frames it is given in the
// order given, with at most `window` unanswered, and records every answer.
// A "retry later" answer puts the frame back; those are sent again in
// ascending seq order (as the shim keeps its pending batches) once the
// others are out.
class FrameSender {
 public:
  explicit FrameSender(const std::string& endpoint) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::sndhwm, 100000);
    socket_.set(zmq::sockopt::reconnect_ivl, 50);
    socket_.connect(endpoint);
  }

  // Returns once every frame is answered Durable or Rejected, or at `deadline`.
  void Send(std::vector<const Frame*> order, size_t window, Clock::time_point deadline) {
    std::map<FrameKey, const Frame*> unanswered;
    std::vector<const Frame*> retry;
    size_t next = 0;
    while (Clock::now() < deadline) {
      if (next == order.size() && unanswered.empty()) {
        if (retry.empty()) return;
        std::sort(retry.begin(), retry.end(), [](const Frame* a, const Frame* b) { return KeyOf(*a) < KeyOf(*b); });
        order = std::move(retry);
        retry.clear();
        next = 0;
      }
      while (next < order.size() && unanswered.size() < window) {
        const Frame* f = order[next];
        if (!socket_.send(zmq::buffer(f->bytes), zmq::send_flags::dontwait)) break;
        unanswered[KeyOf(*f)] = f;
        ++next;
      }
      zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 100ms);
      zmq::message_t reply;
      while (socket_.recv(reply, zmq::recv_flags::dontwait)) {
        auto env = wire::OpenEnvelope(reply.data(), reply.size());
        if (!env.ok() || (*env)->message_as_Ack() == nullptr) continue;
        const auto* ack = (*env)->message_as_Ack();
        const FrameKey key{ack->rank(), ack->session(), ack->seq()};
        auto it = unanswered.find(key);
        if (ack->code() == wire::AckCode::Durable) durable_.insert(key);
        if (ack->code() == wire::AckCode::Rejected) rejected_[key] = ack->error() ? ack->error()->str() : "";
        if (ack->code() == wire::AckCode::Retry) {
          ++retries_;
          if (it != unanswered.end()) retry.push_back(it->second);
        }
        if (it != unanswered.end()) unanswered.erase(it);
      }
    }
  }

  // Sends `order` without waiting for answers (a daemon about to be killed).
  void SendOnly(const std::vector<const Frame*>& order) {
    for (const Frame* f : order) (void)socket_.send(zmq::buffer(f->bytes), zmq::send_flags::dontwait);
  }
  // Reads the answers that come within `wait`.
  void Collect(std::chrono::milliseconds wait) {
    const auto until = Clock::now() + wait;
    while (Clock::now() < until) {
      zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 20ms);
      zmq::message_t reply;
      while (socket_.recv(reply, zmq::recv_flags::dontwait)) {
        auto env = wire::OpenEnvelope(reply.data(), reply.size());
        if (!env.ok() || (*env)->message_as_Ack() == nullptr) continue;
        const auto* ack = (*env)->message_as_Ack();
        if (ack->code() == wire::AckCode::Durable) durable_.insert({ack->rank(), ack->session(), ack->seq()});
      }
    }
  }

  const std::set<FrameKey>& durable() const { return durable_; }
  const std::map<FrameKey, std::string>& rejected() const { return rejected_; }
  uint64_t retries() const { return retries_; }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::set<FrameKey> durable_;
  std::map<FrameKey, std::string> rejected_;
  uint64_t retries_ = 0;
};

std::string Opguardd() {
  const char* other = std::getenv("OPGUARDD_UNDER_TEST");
  return other != nullptr && *other != '\0' ? other : OPGUARDD_PATH;
}

class ContractTest : public ::testing::Test {
 protected:
  std::unique_ptr<DaemonProcess> StartDaemon() {
    auto d = std::make_unique<DaemonProcess>(Opguardd(), dir_.path());
    Status st = d->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return d;
  }

  // Every op index of (run, rank, lane 0), in the order read, duplicates kept.
  static std::vector<uint64_t> ReadAll(DaemonProcess& d, const std::string& run, uint32_t rank) {
    std::vector<uint64_t> ops;
    DaemonClient client(d.query(), 20s);
    uint64_t from = 0;
    for (int page = 0; page < 10000; ++page) {
      auto answer = client.ReadTrace(run, rank, 0, from, 5000);
      if (!answer.ok()) {
        // A rank with nothing stored yet is not found.
        EXPECT_NE(answer.status().message().find("no"), std::string::npos) << answer.status().message();
        break;
      }
      const auto* t = answer->envelope()->message_as_ReadTraceAnswer();
      if (t->ops()) {
        for (const auto* op : *t->ops()) ops.push_back(op->op_index());
      }
      if (t->done()) break;
      from = t->next_op();
    }
    return ops;
  }

  // The run's JSON (counters per rank), or null.
  static nlohmann::json Run(DaemonProcess& d, const std::string& run) {
    auto r = testing::HttpGet(d.http(), "/api/runs/" + run, 20s);
    if (!r.ok() || r->status != 200) return nullptr;
    return nlohmann::json::parse(r->body);
  }
  static nlohmann::json Rank(const nlohmann::json& run, uint32_t rank) {
    for (const auto& r : run["ranks"]) {
      if (r["rank"] == rank) return r;
    }
    return nullptr;
  }

  // Every op of every durably acknowledged frame is stored, and no op twice.
  static void ExpectAckedStoredOnce(DaemonProcess& d, const std::string& run, const std::vector<Frame>& frames,
                                    const std::set<FrameKey>& durable, uint32_t ranks, const std::string& when) {
    for (uint32_t r = 0; r < ranks; ++r) {
      const auto ops = ReadAll(d, run, r);
      const std::set<uint64_t> present(ops.begin(), ops.end());
      EXPECT_EQ(present.size(), ops.size()) << when << ": an op of rank " << r << " is stored twice";
      for (const Frame& f : frames) {
        if (f.rank != r || !durable.count(KeyOf(f))) continue;
        for (uint64_t op = f.first_op; op < f.first_op + f.ops; ++op) {
          ASSERT_TRUE(present.count(op)) << when << ": op " << op << " of rank " << r << " (session "
                                         << f.session << " seq " << f.seq << ") acknowledged, not stored";
        }
      }
    }
  }

  testing::TempDir dir_;
};

// One session of thousands of batches sent in random order: every batch
// acknowledged Durable is stored, once, and counted once; the diff of the
// run with itself sees every op. Before, dedup gave up after 64 gaps and
// acknowledged later batches as duplicates without storing them.
TEST_F(ContractTest, ThousandsOfBatchesInRandomOrderAreEachStoredOnce) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  constexpr uint64_t kBatches = 3000;
  constexpr uint32_t kOps = 4;
  BatchOptions o;
  o.definitions = true;
  o.world_size = 1;
  std::vector<Frame> frames(kBatches);
  std::vector<const Frame*> order;
  for (uint64_t seq = 0; seq < kBatches; ++seq) {
    BatchOptions first = o;
    first.announce = seq == 0;
    frames[seq] = {0, 77, seq, seq * kOps, kOps, testing::MakeBatch("shuffled", 0, 77, seq, seq * kOps, kOps, first)};
    order.push_back(&frames[seq]);
  }
  std::mt19937_64 random(38);
  std::shuffle(order.begin(), order.end(), random);
  FrameSender sender(d->ingest());
  sender.Send(order, /*window=*/1000, Clock::now() + 180s);
  EXPECT_TRUE(sender.rejected().empty()) << sender.rejected().begin()->second;
  ASSERT_EQ(sender.durable().size(), kBatches) << "not every batch was acknowledged in time";
  std::printf("%llu batches in random order: %llu answered \"retry later\" and sent again\n",
              static_cast<unsigned long long>(kBatches), static_cast<unsigned long long>(sender.retries()));

  const auto ops = ReadAll(*d, "shuffled", 0);
  ASSERT_EQ(ops.size(), kBatches * kOps) << "acknowledged ops missing (or stored twice)";
  for (uint64_t i = 0; i < ops.size(); ++i) ASSERT_EQ(ops[i], i);
  const auto rank = Rank(Run(*d, "shuffled"), 0);
  EXPECT_EQ(rank["ops"], kBatches * kOps);
  EXPECT_EQ(rank["batches"], kBatches);
  EXPECT_EQ(rank["gaps"], 0);

  auto diff = testing::RunCommand(std::string(OPGUARD_CLI_PATH) + " diff --daemon " + d->query() +
                                      " --json shuffled shuffled 2>&1",
                                  120);
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  const auto j = nlohmann::json::parse(diff.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << diff.output;
  EXPECT_EQ(j["status"], "identical") << diff.output;
  EXPECT_EQ(j["aligned"], kBatches * kOps) << diff.output;
  EXPECT_EQ(d->Stop(), 0);
}

// A session forgotten (more than 8 newer sessions of its rank) and then sent
// again, across a restart: nothing is counted twice, and a batch of it never
// applied before is stored and counted. Before, the replay re-applied every
// batch and the rank's counters grew by the resent ops.
TEST_F(ContractTest, ASessionForgottenAndSentAgainCountsNothingTwice) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  constexpr uint32_t kOps = 10;
  std::vector<Frame> frames;
  auto add = [&](uint64_t session, uint64_t seq, uint64_t batch) {
    BatchOptions o;
    o.definitions = true;
    o.steps_every = 5;
    o.collectives_every = 5;
    frames.push_back({0, session, seq, batch * kOps, kOps,
                      testing::MakeBatch("replayed", 0, session, seq, batch * kOps, kOps, o)});
  };
  for (uint64_t seq = 0; seq < 10; ++seq) add(/*session=*/1, seq, /*batch=*/seq);
  for (uint64_t s = 0; s < 10; ++s) add(/*session=*/100 + s, 0, /*batch=*/10 + s);
  add(/*session=*/1, 10, /*batch=*/20);  // never sent before the replay
  std::vector<const Frame*> first;
  for (size_t i = 0; i + 1 < frames.size(); ++i) first.push_back(&frames[i]);
  {
    FrameSender sender(d->ingest());
    // One at a time: each session's batch is durable before the next comes.
    for (const Frame* f : first) sender.Send({f}, 1, Clock::now() + 20s);
    ASSERT_EQ(sender.durable().size(), first.size());
  }
  const auto before = Rank(Run(*d, "replayed"), 0);
  ASSERT_EQ(before["ops"], 20 * kOps);
  EXPECT_EQ(d->Stop(), 0);
  d = StartDaemon();
  ASSERT_TRUE(d->Running());
  std::vector<const Frame*> replay;
  for (const Frame& f : frames) {
    if (f.session == 1) replay.push_back(&f);
  }
  FrameSender sender(d->ingest());
  sender.Send(replay, 4, Clock::now() + 30s);
  ASSERT_EQ(sender.durable().size(), replay.size());
  ExpectAckedStoredOnce(*d, "replayed", frames, sender.durable(), 1, "after the replay");
  const auto after = Rank(Run(*d, "replayed"), 0);
  EXPECT_EQ(after["ops"], 21 * kOps) << "the replayed session's ops were counted twice";
  EXPECT_EQ(after["steps"], before["steps"].get<uint64_t>() + 2);
  EXPECT_EQ(after["collectives"], before["collectives"].get<uint64_t>() + 2);
  EXPECT_EQ(after["batches"], 21);
  EXPECT_EQ(d->Stop(), 0);
}

// The property: random interleavings of sends, resends, reorders, sessions,
// daemon restarts and kill -9. For every acknowledged record, it is stored
// exactly once (and counted once); every record not stored is a gap.
// Bounded: 16 rounds of at most ~400 frames each.
TEST_F(ContractTest, RandomSendsResendsRestartsAndKillsKeepTheContract) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("OPGUARD_CONTRACT_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("OPGUARD_CONTRACT_SEED=%llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 random(seed);
  auto chance = [&random](double p) { return std::uniform_real_distribution<double>(0, 1)(random) < p; };

  constexpr uint32_t kRanks = 3, kBatches = 100, kOps = 8;
  const std::string run = "property";
  // Each rank's batches belong to 6..14 sessions (a process that restarts),
  // in consecutive blocks; a few are never sent (a sender that gave them
  // up) and the session's last batch reports their ops as a gap.
  std::vector<Frame> frames;
  std::set<FrameKey> abandoned;
  std::map<uint32_t, std::set<uint64_t>> abandoned_ops;
  for (uint32_t r = 0; r < kRanks; ++r) {
    const uint64_t sessions = 6 + random() % 9;  // more than the 8 remembered, mostly
    std::vector<uint64_t> starts{0};
    for (uint64_t s = 1; s < sessions; ++s) starts.push_back(random() % kBatches);
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    starts.push_back(kBatches);
    for (size_t s = 0; s + 1 < starts.size(); ++s) {
      const uint64_t session = (uint64_t{r} << 32) | (s + 1);
      std::vector<std::pair<uint64_t, uint64_t>> gaps;
      uint64_t seq = 0;
      for (uint64_t b = starts[s]; b < starts[s + 1]; ++b, ++seq) {
        BatchOptions o;
        o.definitions = seq == 0;
        o.announce = seq == 0;
        o.world_size = kRanks;
        o.steps_every = 4;
        frames.push_back({r, session, seq, b * kOps, kOps, testing::MakeBatch(run, r, session, seq, b * kOps, kOps, o)});
        if (chance(0.08)) {
          abandoned.insert(KeyOf(frames.back()));
          gaps.emplace_back(b * kOps, b * kOps + kOps - 1);
          for (uint64_t op = b * kOps; op < (b + 1) * kOps; ++op) abandoned_ops[r].insert(op);
        }
      }
      if (!gaps.empty()) {
        BatchOptions o;
        o.gaps = gaps;
        frames.push_back({r, session, seq, 0, 0, testing::MakeBatch(run, r, session, seq, 0, 0, o)});
      }
    }
  }
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  std::set<FrameKey> durable;
  int restarts = 0, kills = 0;
  constexpr int kRounds = 16;
  for (int round = 0; round < kRounds; ++round) {
    // Not yet acknowledged frames, and some acknowledged ones again
    // (resends: a lost ack, a process that resends after a restart).
    std::vector<const Frame*> order;
    for (const Frame& f : frames) {
      if (abandoned.count(KeyOf(f))) continue;
      if (!durable.count(KeyOf(f)) || chance(0.2)) order.push_back(&f);
    }
    std::shuffle(order.begin(), order.end(), random);
    order.resize(order.size() * (3 + random() % 8) / 10);  // 30..100% of them this round
    FrameSender sender(d->ingest());
    if (chance(0.3)) {
      // kill -9 while batches are arriving and being written.
      const size_t half = order.size() / 2;
      sender.Send({order.begin(), order.begin() + half}, 16, Clock::now() + 30s);
      sender.SendOnly({order.begin() + half, order.end()});
      sender.Collect(std::chrono::milliseconds(random() % 30));
      d->Kill9();
      sender.Collect(50ms);  // anything already on its way
      ++kills;
    } else {
      sender.Send(order, 1 + random() % 64, Clock::now() + 60s);
      EXPECT_TRUE(sender.rejected().empty()) << sender.rejected().begin()->second;
    }
    durable.insert(sender.durable().begin(), sender.durable().end());
    if (!d->Running() || chance(0.25)) {
      if (d->Running()) {
        EXPECT_EQ(d->Stop(), 0);
        ++restarts;
      }
      d = StartDaemon();
      ASSERT_TRUE(d->Running());
      ExpectAckedStoredOnce(*d, run, frames, durable, kRanks, "round " + std::to_string(round));
    }
  }
  // The senders finish: every frame not given up, in order.
  std::vector<const Frame*> rest;
  for (const Frame& f : frames) {
    if (!abandoned.count(KeyOf(f)) && !durable.count(KeyOf(f))) rest.push_back(&f);
  }
  FrameSender sender(d->ingest());
  sender.Send(rest, 8, Clock::now() + 60s);
  durable.insert(sender.durable().begin(), sender.durable().end());
  EXPECT_TRUE(sender.rejected().empty());
  std::printf("%d rounds, %d restarts, %d kill -9, %zu frames, %zu given up\n", kRounds, restarts, kills,
              frames.size(), abandoned.size());
  ExpectAckedStoredOnce(*d, run, frames, durable, kRanks, "at the end");
  const auto j = Run(*d, run);
  for (uint32_t r = 0; r < kRanks; ++r) {
    const auto ops = ReadAll(*d, run, r);
    const std::set<uint64_t> stored(ops.begin(), ops.end());
    for (uint64_t op = 0; op < uint64_t{kBatches} * kOps; ++op) {
      ASSERT_NE(stored.count(op), abandoned_ops[r].count(op))
          << "rank " << r << " op " << op << (stored.count(op) ? " stored and" : " neither stored nor")
          << " reported as a gap";
    }
    const auto rank = Rank(j, r);
    EXPECT_EQ(rank["ops"], stored.size()) << "rank " << r << ": counted ops are not the distinct stored ops";
    EXPECT_EQ(rank["gaps"], abandoned_ops[r].size()) << "rank " << r;
    EXPECT_EQ(rank["steps"], uint64_t{kBatches} * kOps / 4 - abandoned_ops[r].size() / 4) << "rank " << r;
  }
  EXPECT_EQ(d->Stop(), 0);
}

}  // namespace
}  // namespace opguard::daemon
