// opguard diff / ranks / collectives end to end: real opguardd processes,
// traces recorded through the real shim by opguard-loadgen, the real CLI and
// HTTP. The three-daemon tests run three daemons on this machine as three
// nodes, each holding a slice of the ranks (loadgen --first-rank/--world-size).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"

namespace opguard::daemon {
namespace {

using json = nlohmann::json;
using testing::DaemonProcess;
using testing::RunCommand;

json ParseJson(const std::string& out) {
  auto brace = out.find('{');
  if (brace == std::string::npos) return json();
  return json::parse(out.substr(brace), nullptr, false);
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(OPGUARD_LOADGEN_PATH)) << OPGUARD_LOADGEN_PATH << " not built";
  }

  DaemonProcess& StartDaemon(std::vector<std::string> args = {}) {
    dirs_.push_back(std::make_unique<testing::TempDir>());
    daemons_.push_back(
        std::make_unique<DaemonProcess>(OPGUARDD_PATH, dirs_.back()->path(), std::move(args)));
    Status st = daemons_.back()->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return *daemons_.back();
  }

  // Records a run through the shim into `d`; returns loadgen's JSON report.
  json Loadgen(const DaemonProcess& d, const std::string& args) {
    auto out = RunCommand(std::string(OPGUARD_LOADGEN_PATH) + " " + args + " --endpoint " +
                              d.ingest() + " --json 2>/dev/null",
                          120);
    EXPECT_EQ(out.exit_code, 0) << args << "\n" << out.output;
    json j = ParseJson(out.output);
    EXPECT_TRUE(j.is_object() && j.value("all_acknowledged", false)) << out.output;
    return j;
  }

  // Runs `opguard ARGS --json --daemon D`; returns {exit code, JSON}.
  std::pair<int, json> Cli(const DaemonProcess& d, const std::string& args, int timeout_s = 60) {
    auto out = RunCommand(
        std::string(OPGUARD_CLI_PATH) + " " + args + " --json --daemon " + d.query() + " 2>&1",
        timeout_s + 30);
    json j = ParseJson(out.output);
    EXPECT_TRUE(j.is_object()) << args << "\n" << out.output;
    last_output_ = out.output;
    return {out.exit_code, j};
  }

  void TearDown() override {
    for (auto& d : daemons_) {
      if (d->pid() > 0) d->Kill9();
    }
  }

  std::vector<std::unique_ptr<testing::TempDir>> dirs_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
  std::string last_output_;
};

constexpr char kTrace[] = "--ranks 4 --ops 3000 --collective-every 100 --seed 7";

TEST_F(ClusterTest, IdenticalRunsAreIdenticalOverTheCliAndHttp) {
  auto& d = StartDaemon();
  Loadgen(d, std::string("--run ref ") + kTrace);
  Loadgen(d, std::string("--run sus ") + kTrace);
  auto [rc, j] = Cli(d, "diff ref sus");
  EXPECT_EQ(rc, 0) << last_output_;
  EXPECT_EQ(j["status"], "identical") << last_output_;
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["aligned"].get<uint64_t>(), 4u * 3000u);
  EXPECT_TRUE(j["diverging_ranks"].empty());
  EXPECT_TRUE(j["missing_ranks"].empty());
  auto http =
      testing::HttpGet(d.http(), "/api/diff?reference=ref&suspect=sus", std::chrono::seconds(60));
  ASSERT_TRUE(http.ok()) << http.status().message();
  EXPECT_EQ(http->status, 200) << http->body;
  EXPECT_EQ(json::parse(http->body)["status"], "identical");
  auto missing = testing::HttpGet(d.http(), "/api/diff?reference=ref&suspect=nope");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404) << missing->body;
  auto bad = RunCommand(std::string(OPGUARD_CLI_PATH) + " diff onlyone 2>&1");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

TEST_F(ClusterTest, DivergenceNamesTheRankAndOpAndExplainsTheOthersThroughTheAllReduce) {
  auto& d = StartDaemon();
  Loadgen(d, std::string("--run ref ") + kTrace);
  json lg = Loadgen(d, std::string("--run sus --diverge-at 2:1234 ") + kTrace);
  const uint64_t op = lg["per_rank"][2]["divergence"]["op"].get<uint64_t>();
  auto [rc, j] = Cli(d, "diff ref sus");
  EXPECT_EQ(rc, 1) << last_output_;
  EXPECT_EQ(j["status"], "diverged") << last_output_;
  EXPECT_EQ(j["diverging_ranks"], json::array({2})) << last_output_;
  // Loadgen's step (its synthetic_trace.cc) is 121 ops: 59
  // forward (embedding, 4 blocks of 14 ops, head, loss), their backward ops
  // in reverse order, 3 optimizer ops. Op 1234 is step 10's op 24: block 1's
  // op 9, its second layer norm (model.py:63).
  ASSERT_EQ(op, 1234u);
  EXPECT_EQ(lg["per_rank"][2]["divergence"]["step"], 10);
  const auto& fd = j["first_divergence"];
  ASSERT_TRUE(fd.is_object()) << last_output_;
  EXPECT_EQ(fd["rank"], 2);
  EXPECT_EQ(fd["step"], 10);
  EXPECT_EQ(fd["op"], "aten::layer_norm");
  EXPECT_EQ(fd["op_index"]["suspect"].get<uint64_t>(), op);
  EXPECT_EQ(fd["op_index"]["reference"].get<uint64_t>(), op);
  EXPECT_TRUE(fd["inputs_equal"].get<bool>());  // its input comes from the op before
  for (const char* run : {"reference", "suspect"}) {
    EXPECT_EQ(fd["site"][run]["file"], "model.py") << run;
    EXPECT_EQ(fd["site"][run]["line"], 63) << run;
    EXPECT_EQ(fd["site"][run]["function"], "Block.forward") << run;
  }
  // Every other rank diverged later, through the next all-reduce from rank 2.
  std::set<uint32_t> explained;
  for (const auto& e : j["explained"]) {
    EXPECT_EQ(e["from_rank"], 2) << e;
    explained.insert(e["rank"].get<uint32_t>());
  }
  EXPECT_EQ(explained, (std::set<uint32_t>{0, 1, 3})) << last_output_;
  // One rank only: its own pivot, where the all-reduce's output reached it.
  // The all-reduce after op 1299 carries it: op 1300 is step 10's op 90,
  // the backward of forward op 27, block 1's MLP output projection
  // (model.py:102), whose site the backward op carries.
  auto [rc1, j1] = Cli(d, "diff ref sus --rank 1");
  EXPECT_EQ(rc1, 1);
  const auto& fd1 = j1["first_divergence"];
  EXPECT_EQ(fd1["rank"], 1) << last_output_;
  EXPECT_EQ(lg["per_rank"][1]["divergence"]["op"], 1300);
  EXPECT_EQ(fd1["op_index"]["suspect"], 1300);
  EXPECT_EQ(fd1["step"], 10);
  EXPECT_EQ(fd1["op"], "autograd::linear_backward");
  EXPECT_EQ(fd1["site"]["suspect"]["line"], 102);
  // The text report leads with the pivot.
  auto text = RunCommand(
      std::string(OPGUARD_CLI_PATH) + " diff ref sus --daemon " + d.query() + " 2>&1", 60);
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(text.output.find("first divergence · rank 2"), std::string::npos) << text.output;
}

TEST_F(ClusterTest, InsertedAndReorderedOpsAreNotDivergence) {
  auto& d = StartDaemon();
  Loadgen(d, std::string("--run ref ") + kTrace);
  Loadgen(d, std::string("--run sus --insert 25 --reorder 25 ") + kTrace);
  auto [rc, j] = Cli(d, "diff ref sus");
  EXPECT_EQ(rc, 0) << last_output_;
  EXPECT_EQ(j["status"], "identical") << last_output_;
  uint64_t reordered = 0, unaligned = 0;
  for (const auto& r : j["ranks"]) {
    reordered += r["reordered"].get<uint64_t>();
    unaligned += r["unaligned_total"]["suspect"].get<uint64_t>();
  }
  EXPECT_GT(reordered, 0u);
  EXPECT_EQ(unaligned, 4u * 25u);
}

TEST_F(ClusterTest, DroppedRecordsNearThePivotMakeItIncompleteWithTheMissingRanges) {
  auto& d = StartDaemon();
  Loadgen(d, std::string("--run ref ") + kTrace);
  json lg = Loadgen(
      d, std::string("--run sus --diverge-at 0:2990 --drop-batches 3 --drop-size 50 ") + kTrace);
  auto [rc, j] = Cli(d, "diff ref sus");
  EXPECT_EQ(rc, 3) << last_output_;
  EXPECT_EQ(j["status"], "incomplete") << last_output_;
  // Exactly the ranks and ranges loadgen dropped are reported missing.
  std::set<std::tuple<uint32_t, uint64_t, uint64_t>> dropped, reported;
  for (const auto& r : lg["per_rank"]) {
    for (const auto& g : r["gaps"]) {
      dropped.insert(
          {r["rank"].get<uint32_t>(), g["first_op"].get<uint64_t>(), g["last_op"].get<uint64_t>()});
    }
  }
  ASSERT_FALSE(dropped.empty());
  std::set<uint32_t> incomplete;
  for (const auto& r : j["incomplete_ranks"]) incomplete.insert(r.get<uint32_t>());
  for (const auto& r : j["ranks"]) {
    for (const auto& m : r["missing"]) {
      EXPECT_EQ(m["run"], "suspect");
      reported.insert(
          {m["rank"].get<uint32_t>(), m["first_op"].get<uint64_t>(), m["last_op"].get<uint64_t>()});
    }
  }
  EXPECT_EQ(reported, dropped) << last_output_;
  for (const auto& [rank, first, last] : dropped) EXPECT_TRUE(incomplete.count(rank)) << rank;
}

TEST_F(ClusterTest, LiveCollectivesNameTheRankAHungJobWaitsFor) {
  auto& d = StartDaemon();
  Loadgen(d, std::string("--run hung --hang 3:10 ") + kTrace);
  auto [rc, j] = Cli(d, "collectives hung");
  EXPECT_EQ(rc, 0) << last_output_;
  EXPECT_TRUE(j["waiting"].get<bool>()) << last_output_;
  ASSERT_EQ(j["live"].size(), 1u) << last_output_;
  const auto& live = j["live"][0];
  EXPECT_EQ(live["name"], "world");
  EXPECT_EQ(live["pending_seq"], 10);
  EXPECT_EQ(live["pending_kind"], "all_reduce");
  EXPECT_EQ(live["waiting"], json::array({0, 1, 2}));
  EXPECT_EQ(live["not_joined"], json::array({3}));
  auto http = testing::HttpGet(d.http(), "/api/runs/hung/collectives");
  ASSERT_TRUE(http.ok());
  EXPECT_EQ(json::parse(http->body)["live"][0]["not_joined"], json::array({3})) << http->body;
  auto text = RunCommand(
      std::string(OPGUARD_CLI_PATH) + " collectives hung --daemon " + d.query() + " 2>&1", 60);
  EXPECT_NE(text.output.find("3"), std::string::npos) << text.output;
}

TEST_F(ClusterTest, ACollectiveDesyncIsReportedWithEveryMember) {
  auto& d = StartDaemon();
  Loadgen(d, std::string("--run desync --desync 1:5 ") + kTrace);
  auto [rc, j] = Cli(d, "collectives desync");
  EXPECT_EQ(rc, 1) << last_output_;
  EXPECT_EQ(j["status"], "diverged");
  ASSERT_EQ(j["desyncs"].size(), 1u) << last_output_;
  const auto& desync = j["desyncs"][0];
  EXPECT_EQ(desync["seq"], 5);
  EXPECT_EQ(desync["communicator_name"], "world");
  EXPECT_EQ(desync["fields"], json::array({"count"}));
  // Every rank's all-reduce after op 599, in step 4 (121 ops a step;
  // loadgen: train.py:125, train_step), rank 1's one element longer.
  ASSERT_EQ(desync["members"].size(), 4u) << last_output_;
  for (uint32_t r = 0; r < 4; ++r) {
    const auto& m = desync["members"][r];
    EXPECT_EQ(m["rank"], r);
    EXPECT_EQ(m["kind"], "all_reduce");
    EXPECT_EQ(m["count"], (1 << 20) + (r == 1 ? 1 : 0)) << m;
    EXPECT_EQ(m["step"], 4) << m;
    EXPECT_EQ(m["op_index"], 600) << m;
    EXPECT_EQ(m["site"]["file"], "train.py");
    EXPECT_EQ(m["site"]["line"], 125);
    EXPECT_EQ(m["site"]["function"], "train_step");
  }
  auto [rrc, r] = Cli(d, "ranks desync");
  EXPECT_EQ(rrc, 1);
  EXPECT_EQ(r["kind"], "ranks");
  EXPECT_EQ(r["status"], "diverged") << last_output_;
  EXPECT_EQ(r["collectives"]["desyncs"].size(), 1u);
  auto http = testing::HttpGet(d.http(), "/api/runs/desync/ranks");
  ASSERT_TRUE(http.ok());
  EXPECT_EQ(http->status, 200) << http->body;
  EXPECT_EQ(json::parse(http->body)["kind"], "ranks");
  auto unknown = testing::HttpGet(d.http(), "/api/runs/nope/collectives");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, 404) << unknown->body;
}

// Three daemons, three "nodes": ranks 0-1, 2-3 and 4-5 of a 6-rank run.
class ThreeNodes : public ClusterTest {
 protected:
  void StartNodes() {
    for (int i = 0; i < 3; ++i) dirs_.push_back(std::make_unique<testing::TempDir>());
    auto query = [&](int i) { return "ipc://" + dirs_[i]->path() + "/query.sock"; };
    for (int i = 0; i < 3; ++i) {
      std::string peers;
      for (int k = 0; k < 3; ++k)
        peers += (peers.empty() ? "" : ",") + query(k);  // itself too: skipped
      daemons_.push_back(std::make_unique<DaemonProcess>(
          OPGUARDD_PATH, dirs_[i]->path(), std::vector<std::string>{"--peers", peers}));
      Status st = daemons_.back()->Start();
      ASSERT_TRUE(st.ok()) << st.message();
    }
  }
  void Record(const std::string& run, const std::string& extra) {
    for (uint32_t n = 0; n < 3; ++n) {
      Loadgen(*daemons_[n], "--run " + run + " --ranks 2 --first-rank " + std::to_string(2 * n) +
                                " --world-size 6 --ops 2000 --collective-every 100 --seed 3 " +
                                extra);
    }
  }
};

TEST_F(ThreeNodes, DiffMergesEveryNodesRanksAndAMissingPeerMakesItPartial) {
  StartNodes();
  Record("ref", "");
  Record("sus", "--diverge-at 3:777");
  auto [rc, j] = Cli(*daemons_[0], "diff ref sus");
  EXPECT_EQ(rc, 1) << last_output_;
  EXPECT_EQ(j["status"], "diverged") << last_output_;
  EXPECT_EQ(j["ranks"].size(), 6u);
  EXPECT_EQ(j["diverging_ranks"], json::array({3})) << last_output_;
  // Op 777 is step 6's op 51: block 3's op 8, its residual add (model.py:62).
  const auto& fd = j["first_divergence"];
  EXPECT_EQ(fd["rank"], 3);
  EXPECT_EQ(fd["op_index"]["suspect"], 777);
  EXPECT_EQ(fd["step"], 6);
  EXPECT_EQ(fd["op"], "aten::add");
  EXPECT_EQ(fd["site"]["suspect"]["file"], "model.py");
  EXPECT_EQ(fd["site"]["suspect"]["line"], 62);
  std::set<uint32_t> explained;
  for (const auto& e : j["explained"]) {
    EXPECT_EQ(e["from_rank"], 3) << e;
    explained.insert(e["rank"].get<uint32_t>());
  }
  EXPECT_EQ(explained, (std::set<uint32_t>{0, 1, 2, 4, 5})) << last_output_;
  EXPECT_EQ(j["nodes"].size(), 3u) << last_output_;
  for (const auto& n : j["nodes"]) EXPECT_TRUE(n["answered"].get<bool>()) << n;
  // Any node can receive the query.
  auto [rc2, j2] = Cli(*daemons_[2], "diff ref sus");
  EXPECT_EQ(j2["diverging_ranks"], json::array({3})) << last_output_;
  auto [crc, c] = Cli(*daemons_[1], "collectives sus");
  EXPECT_EQ(crc, 0) << last_output_;
  EXPECT_EQ(c["status"], "identical") << last_output_;
  EXPECT_TRUE(c["missing_ranks"].empty());
  ASSERT_EQ(c["live"].size(), 1u);
  EXPECT_EQ(c["live"][0]["ranks"].size(), 6u);

  // The node holding ranks 4 and 5 dies: the answer is partial and names them.
  daemons_[2]->Kill9();
  auto [prc, p] = Cli(*daemons_[0], "diff ref sus --timeout 6", 6);
  EXPECT_EQ(prc, 3) << last_output_;
  EXPECT_EQ(p["status"], "partial") << last_output_;
  EXPECT_EQ(p["missing_ranks"], json::array({4, 5})) << last_output_;
  EXPECT_EQ(p["ranks"].size(), 4u);
  EXPECT_EQ(p["first_divergence"]["rank"], 3);  // real, but "first" is not certain
  bool failed_node = false;
  for (const auto& n : p["nodes"]) failed_node = failed_node || !n["answered"].get<bool>();
  EXPECT_TRUE(failed_node) << last_output_;
  auto [pc, pcj] = Cli(*daemons_[0], "collectives sus --timeout 6", 6);
  EXPECT_EQ(pc, 3) << last_output_;
  EXPECT_EQ(pcj["status"], "partial") << last_output_;
  EXPECT_EQ(pcj["missing_ranks"], json::array({4, 5}));
}

TEST_F(ThreeNodes, AHangAcrossNodesNamesTheMissingRank) {
  StartNodes();
  Record("hung", "--hang 4:7");
  auto [rc, j] = Cli(*daemons_[0], "collectives hung");
  EXPECT_EQ(rc, 0) << last_output_;
  ASSERT_EQ(j["live"].size(), 1u) << last_output_;
  EXPECT_EQ(j["live"][0]["pending_seq"], 7);
  EXPECT_EQ(j["live"][0]["not_joined"], json::array({4})) << last_output_;
  EXPECT_EQ(j["live"][0]["waiting"], json::array({0, 1, 2, 3, 5}));
}

// The viewer talks to one node; the ranks it pages through may be stored on
// another. Rank-local JSON API routes this node answers 404 are asked of the
// peers, which answer from their own data.
TEST_F(ThreeNodes, TheViewerOfAnyNodeReadsRanksStoredOnAnother) {
  StartNodes();
  Record("ref", "");
  Record("sus", "--diverge-at 3:777");
  const DaemonProcess& front = *daemons_[0];  // holds ranks 0 and 1
  auto get = [](const DaemonProcess& d, const std::string& target) {
    auto r = testing::HttpGet(d.http(), target, std::chrono::seconds(60));
    EXPECT_TRUE(r.ok()) << target << ": " << r.status().message();
    return r.ok() ? *r : testing::HttpResult{};
  };
  // Rank 3 lives on node 1: node 0 serves the same alignment page node 1 does.
  const std::string page = "/api/alignment?reference=ref&suspect=sus&rank=3&from=700&count=100&op=777";
  auto forwarded = get(front, page);
  ASSERT_EQ(forwarded.status, 200) << forwarded.body;
  auto own = get(*daemons_[1], page);
  EXPECT_EQ(forwarded.body, own.body);
  json a = json::parse(forwarded.body);
  EXPECT_EQ(a["rank"], 3);
  EXPECT_EQ(a["rows"].size(), 100u);
  ASSERT_FALSE(a["located"].is_null()) << forwarded.body;
  EXPECT_EQ(a["rows"][a["located"].get<int>() - 700]["suspect"]["op_index"], 777);
  EXPECT_GE(a["first_differing_row"].get<int64_t>(), 0);
  // Lanes and trace pages of node 2's ranks.
  auto lanes = get(front, "/api/runs/sus/ranks/5/lanes");
  ASSERT_EQ(lanes.status, 200) << lanes.body;
  EXPECT_EQ(json::parse(lanes.body)["rank"], 5);
  EXPECT_FALSE(json::parse(lanes.body)["lanes"].empty());
  auto trace = get(front, "/api/runs/sus/ranks/4/trace?lane=0&from=10&count=5");
  ASSERT_EQ(trace.status, 200) << trace.body;
  EXPECT_EQ(json::parse(trace.body)["ops"].size(), 5u);
  EXPECT_EQ(json::parse(trace.body)["ops"][0]["op_index"], 10);
  // A run only node 2 holds: its metadata and its source files.
  Loadgen(*daemons_[2], "--run solo --ranks 1 --first-rank 4 --world-size 6 --ops 200 --seed 3");
  auto run = get(front, "/api/runs/solo");
  ASSERT_EQ(run.status, 200) << run.body;
  EXPECT_EQ(json::parse(run.body)["name"], "solo");
  auto source = get(front, "/api/source?run=solo&file=model.py");
  ASSERT_EQ(source.status, 200) << source.body;
  EXPECT_FALSE(json::parse(source.body)["text"].get<std::string>().empty());
  // What no node holds stays a 404 with this node's own message.
  auto nowhere = get(front, "/api/alignment?reference=ref&suspect=sus&rank=9");
  EXPECT_EQ(nowhere.status, 404) << nowhere.body;
  EXPECT_NE(nowhere.body.find("rank 9"), std::string::npos) << nowhere.body;
  // Routes that are not rank-local are not forwarded, and a peer refuses them.
  EXPECT_EQ(get(front, "/api/nothing").status, 404);
  DaemonClient peer(daemons_[1]->query());
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateApiRequest(b, b.CreateString("/metrics")));
  auto refused = peer.Call(b);
  ASSERT_TRUE(refused.ok()) << refused.status().message();
  ASSERT_NE(refused->envelope()->message_as_ApiAnswer(), nullptr);
  EXPECT_EQ(refused->envelope()->message_as_ApiAnswer()->status(), 400);
  // The node holding rank 5 is gone: its ranks are a 404 again.
  daemons_[2]->Kill9();
  EXPECT_EQ(get(front, "/api/runs/sus/ranks/5/lanes").status, 404);
}

}  // namespace
}  // namespace opguard::daemon
