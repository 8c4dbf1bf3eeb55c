// opguard-loadgen's ranks (the real shim, in real processes) against a
// ZeroMQ ROUTER peer written here: every envelope verified, an ack only after
// the batch is stored ("durable"), a peer that can be stopped and restarted
// on the same endpoint while the ranks keep recording, and a slow peer.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "opguard/idl/envelope.h"

namespace {

namespace w = opguard::wire;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Op {
  uint64_t index;
  uint64_t fp;
};

// What the peer stored, per run and rank. Survives Stop()/Start() as a
// daemon's disk would.
struct Store {
  std::map<std::tuple<std::string, uint32_t, uint64_t, uint64_t>, int> batches;  // -> times received
  std::map<std::pair<std::string, uint32_t>, std::vector<Op>> ops;
  std::map<std::pair<std::string, uint32_t>, std::vector<std::pair<uint64_t, uint64_t>>> gaps;
  std::map<std::pair<std::string, uint32_t>, uint64_t> collectives;
  uint64_t invalid = 0;
  uint64_t acks = 0;
};

class Peer {
 public:
  explicit Peer(std::string endpoint) : endpoint_(std::move(endpoint)) {}
  ~Peer() { Stop(); }

  void Start() {
    stop_ = false;
    ready_ = false;
    crashed_ = false;
    crash_budget_ = -1;
    thread_ = std::thread([this] { Serve(); });
    for (int i = 0; i < 500 && !ready_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(ready_.load());
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Simulates kill -9 mid-ingest: the next `n` batches are received but never
  // stored or acknowledged, then the peer's socket goes away.
  void CrashAfterReceiving(int n) {
    crash_budget_ = n;
    for (int i = 0; i < 5000 && thread_.joinable() && !crashed_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    Stop();
  }
  uint64_t lost_in_crash() const { return lost_; }
  // Every message costs this long before it is stored and acknowledged (a
  // daemon on a loaded machine); set before Start().
  void SetServiceTime(std::chrono::microseconds t) { service_us_ = t.count(); }
  Store Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return store_;
  }

 private:
  void Serve() {
    zmq::socket_t sock(ctx_, zmq::socket_type::router);
    sock.set(zmq::sockopt::linger, 0);
    sock.bind(endpoint_);
    ready_ = true;
    while (!stop_) {
      zmq_pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      zmq::message_t id, msg;
      w::AlignedStorage aligned;
      while (sock.recv(id, zmq::recv_flags::dontwait)) {
        if (!sock.recv(msg, zmq::recv_flags::none)) break;
        if (service_us_ != 0) std::this_thread::sleep_for(std::chrono::microseconds(service_us_));
        if (crash_budget_ >= 0) {
          ++lost_;
          if (--crash_budget_ <= 0) {
            crashed_ = true;
            return;  // the socket closes with batches received but never acknowledged
          }
          continue;
        }
        auto env = w::OpenEnvelope(msg.data(), msg.size(), aligned);
        std::unique_lock<std::mutex> lock(mu_);
        if (!env.ok() || (*env)->message_type() != w::Message::Batch || msg.more()) {
          ++store_.invalid;
          continue;
        }
        const w::Batch* b = (*env)->message_as_Batch();
        std::string run = b->run()->str();
        auto key = std::make_tuple(run, b->rank(), b->session(), b->seq());
        if (store_.batches[key]++ == 0) {  // idempotent: a resend stores nothing twice
          auto rk = std::make_pair(run, b->rank());
          if (b->ops() != nullptr) {
            for (const auto* op : *b->ops()) {
              store_.ops[rk].push_back({op->op_index(), op->outputs()->Get(0)->fingerprint()->lo()});
            }
          }
          if (b->gaps() != nullptr) {
            for (const auto* g : *b->gaps()) store_.gaps[rk].push_back({g->first_op(), g->last_op()});
          }
          if (b->collectives() != nullptr) store_.collectives[rk] += b->collectives()->size();
        }
        ++store_.acks;
        lock.unlock();
        // Stored above; only now is the batch acknowledged.
        flatbuffers::FlatBufferBuilder fbb;
        auto r = fbb.CreateString(run);
        auto ack = w::CreateAck(fbb, r, b->rank(), b->session(), b->seq(), w::AckCode::Durable);
        w::FinishEnvelope(fbb, ack);
        (void)sock.send(id, zmq::send_flags::sndmore);
        (void)sock.send(zmq::buffer(fbb.GetBufferPointer(), fbb.GetSize()), zmq::send_flags::dontwait);
      }
    }
  }

  const std::string endpoint_;
  zmq::context_t ctx_{1};
  std::thread thread_;
  std::atomic<bool> stop_{false}, ready_{false}, crashed_{false};
  std::atomic<int> crash_budget_{-1};
  std::atomic<uint64_t> lost_{0};
  std::atomic<int64_t> service_us_{0};
  std::mutex mu_;
  Store store_;
};

class ShimIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/opguard-shim-it-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    endpoint_ = "ipc://" + dir_ + "/ingest.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  pid_t Spawn(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), OPGUARD_LOADGEN);
    args.insert(args.end(), {"--endpoint", endpoint_, "--json"});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    env.insert({"PATH", "/usr/bin:/bin"});
    env.insert({"OPGUARD_ACK_TIMEOUT_MS", "300"});
    // A sanitizer build's options (scripts/sanitize.sh) hold for loadgen too.
    for (const char* var : {"ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS"}) {
      if (const char* v = std::getenv(var)) env.insert({var, v});
    }
    std::vector<std::string> envs;
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string out = dir_ + "/out.json", err = dir_ + "/err.txt";
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }

  // Waits (bounded) and returns loadgen's JSON report; exit code in *code.
  json Wait(pid_t pid, int* code, int timeout_s = 120) {
    auto start = Clock::now();
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) != pid) {
      if (Clock::now() - start > std::chrono::seconds(timeout_s)) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "loadgen timed out";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(dir_ + "/out.json");
    std::stringstream ss;
    ss << in.rdbuf();
    std::ifstream err(dir_ + "/err.txt");
    std::stringstream es;
    es << err.rdbuf();
    stderr_ = es.str();
    json doc = json::parse(ss.str(), nullptr, false);
    EXPECT_FALSE(doc.is_discarded()) << ss.str() << stderr_;
    return doc;
  }

  json RunLoadgen(std::vector<std::string> args, int* code) { return Wait(Spawn(std::move(args)), code); }

  std::string dir_, endpoint_, stderr_;
};

// Every op index 0..n-1 of a rank is stored once or lies in exactly one gap.
void ExpectCompleteTrace(const Store& s, const std::string& run, uint32_t rank, uint64_t n) {
  auto key = std::make_pair(run, rank);
  std::vector<int> seen(n, 0);
  if (s.ops.count(key)) {
    for (const auto& op : s.ops.at(key)) {
      ASSERT_LT(op.index, n);
      seen[op.index]++;
    }
  }
  if (s.gaps.count(key)) {
    for (const auto& [first, last] : s.gaps.at(key)) {
      for (uint64_t i = first; i <= last; ++i) {
        ASSERT_LT(i, n);
        seen[i]++;
      }
    }
  }
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << run << " rank " << rank << " op " << i;
}

TEST_F(ShimIntegration, LoadgenRanksAreStoredCompletelyAndAcknowledged) {
  Peer peer(endpoint_);
  peer.Start();
  int code = -1;
  json doc = RunLoadgen({"--run", "it-clean", "--ranks", "4", "--ops", "20000", "--seed", "7",
                         "--collective-every", "250"},
                        &code);
  ASSERT_EQ(code, 0) << stderr_;
  EXPECT_TRUE(doc["all_acknowledged"].get<bool>());
  Store s = peer.Snapshot();
  EXPECT_EQ(s.invalid, 0u);
  for (uint32_t r = 0; r < 4; ++r) {
    const json& rep = doc["per_rank"][r];
    EXPECT_EQ(rep["ops"].get<uint64_t>(), 20000u);
    EXPECT_EQ(rep["collectives"].get<uint64_t>(), 80u);
    EXPECT_EQ(s.ops[std::make_pair(std::string("it-clean"), r)].size(), 20000u);
    EXPECT_EQ(s.collectives[std::make_pair(std::string("it-clean"), r)], 160u);  // Entered + Completed
    EXPECT_EQ(rep["records_acked"].get<uint64_t>(), 20160u);
    ExpectCompleteTrace(s, "it-clean", r, 20000);
  }
}

TEST_F(ShimIntegration, PeerRestartLosesNothingAndStoresNothingTwice) {
  Peer peer(endpoint_);
  peer.Start();
  // ~3 s of recording at 20k ops/s per rank; the peer is away for ~1 s of it.
  pid_t pid = Spawn({"--run", "it-restart", "--ranks", "3", "--ops", "60000", "--rate", "20000",
                     "--seed", "3"});
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  peer.CrashAfterReceiving(6);
  ASSERT_GT(peer.lost_in_crash(), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  peer.Start();
  int code = -1;
  json doc = Wait(pid, &code);
  ASSERT_EQ(code, 0) << stderr_ << doc.dump();
  Store s = peer.Snapshot();
  uint64_t resent = 0;
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(doc["per_rank"][r]["records_dropped"].get<uint64_t>(), 0u);
    resent += doc["per_rank"][r]["batches_resent"].get<uint64_t>();
    // Exactly once each: nothing lost, nothing stored twice.
    EXPECT_EQ(s.ops[std::make_pair(std::string("it-restart"), r)].size(), 60000u);
    ExpectCompleteTrace(s, "it-restart", r, 60000);
  }
  // The batches the crash swallowed were resent (on the new connection).
  EXPECT_GT(resent, 0u);
}

// A slow peer: 8 ms per batch, so with 4 ranks sending at full speed the
// last batches wait about a second for their ack, over three times the ack
// timeout (300 ms). Every batch is stored once and every copy the peer saw
// beyond the first was one the ranks counted as a resend. (That acks which
// keep coming, however late, cause no resend at all is the sender's policy,
// tested exactly by shim_sender_test's
// SenderLoss.ABusyPeerAckingInOrderIsNeverResentThoughEachAckIsLate.)
TEST_F(ShimIntegration, SlowPeerGetsEveryBatchOnce) {
  Peer peer(endpoint_);
  peer.SetServiceTime(std::chrono::milliseconds(8));
  peer.Start();
  int code = -1;
  json doc = RunLoadgen({"--run", "it-slow", "--ranks", "4", "--ops", "30000", "--seed", "9"}, &code);
  ASSERT_EQ(code, 0) << stderr_ << doc.dump();
  EXPECT_TRUE(doc["all_acknowledged"].get<bool>());
  Store s = peer.Snapshot();
  uint64_t resent = 0, batches = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    const json& rep = doc["per_rank"][r];
    EXPECT_EQ(rep["records_dropped"].get<uint64_t>(), 0u);
    resent += rep["batches_resent"].get<uint64_t>();
    EXPECT_EQ(s.ops[std::make_pair(std::string("it-slow"), r)].size(), 30000u);
    ExpectCompleteTrace(s, "it-slow", r, 30000);
  }
  uint64_t duplicates = 0;
  for (const auto& [key, times] : s.batches) {
    ++batches;
    duplicates += static_cast<uint64_t>(times - 1);
  }
  EXPECT_GE(batches, 4u * 29);  // 30000 ops in batches of 1024
  EXPECT_LE(duplicates, resent) << doc.dump();
  std::printf("slow peer: %llu batches, %llu resent, %llu duplicates\n", static_cast<unsigned long long>(batches),
              static_cast<unsigned long long>(resent), static_cast<unsigned long long>(duplicates));
}

TEST_F(ShimIntegration, DroppedBatchesAreExactGapsAndMutationsAreReported) {
  Peer peer(endpoint_);
  peer.Start();
  int code = -1;
  json doc = RunLoadgen({"--run", "it-gaps", "--ranks", "2", "--ops", "5000", "--seed", "11",
                         "--drop-batches", "4", "--drop-size", "50", "--insert", "6", "--reorder", "3",
                         "--collective-every", "100"},
                        &code);
  ASSERT_EQ(code, 0) << stderr_;
  Store s = peer.Snapshot();
  uint64_t gap_ranges = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    const json& rep = doc["per_rank"][r];
    uint64_t n = rep["op_indices"].get<uint64_t>();
    EXPECT_EQ(n, 5006u);
    ExpectCompleteTrace(s, "it-gaps", r, n);
    std::vector<std::pair<uint64_t, uint64_t>> reported;
    for (const auto& g : rep["gaps"]) reported.push_back({g["first_op"], g["last_op"]});
    EXPECT_EQ(s.gaps[std::make_pair(std::string("it-gaps"), r)], reported);
    gap_ranges += reported.size();
    EXPECT_EQ(rep["ops"].get<uint64_t>() + 50 * reported.size(), n);
    EXPECT_EQ(rep["inserted_at"].size(), 6u);
    EXPECT_EQ(rep["reordered_at"].size(), 3u);
  }
  EXPECT_EQ(gap_ranges, 4u);
}

TEST_F(ShimIntegration, DivergenceStartsAtTheGivenOpAndReachesOtherRanksThroughAnAllReduce) {
  Peer peer(endpoint_);
  peer.Start();
  int code = -1;
  RunLoadgen({"--run", "it-ref", "--ranks", "3", "--ops", "3000", "--seed", "5", "--collective-every", "500"},
             &code);
  ASSERT_EQ(code, 0) << stderr_;
  json doc = RunLoadgen({"--run", "it-bad", "--ranks", "3", "--ops", "3000", "--seed", "5",
                         "--collective-every", "500", "--diverge-at", "1:1234"},
                        &code);
  ASSERT_EQ(code, 0) << stderr_;
  Store s = peer.Snapshot();
  auto first_difference = [&](uint32_t r) -> int64_t {
    auto ref = s.ops[std::make_pair(std::string("it-ref"), r)];
    auto bad = s.ops[std::make_pair(std::string("it-bad"), r)];
    auto by_index = [](const Op& a, const Op& b) { return a.index < b.index; };
    std::sort(ref.begin(), ref.end(), by_index);
    std::sort(bad.begin(), bad.end(), by_index);
    EXPECT_EQ(ref.size(), bad.size());
    for (size_t i = 0; i < std::min(ref.size(), bad.size()); ++i) {
      if (ref[i].fp != bad[i].fp) return static_cast<int64_t>(ref[i].index);
    }
    return -1;
  };
  EXPECT_EQ(first_difference(1), 1234);
  EXPECT_EQ(doc["per_rank"][1]["divergence"]["op"].get<int64_t>(), 1234);
  for (uint32_t r : {0u, 2u}) {
    // The next all-reduce after op 1234 follows op 1499: ranks 0 and 2 differ from op 1500.
    EXPECT_EQ(first_difference(r), 1500) << "rank " << r;
    EXPECT_EQ(doc["per_rank"][r]["divergence"]["op"].get<int64_t>(), 1500);
    EXPECT_TRUE(doc["per_rank"][r]["divergence"]["via_collective"].get<bool>());
  }
}

}  // namespace
