// opguardd end to end: a real daemon process (local mode under a temp dir),
// real RocksDB, real ZeroMQ senders, HTTP and the CLI.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::BatchOptions;
using testing::DaemonProcess;
using testing::RankSender;

class DaemonTest : public ::testing::Test {
 protected:
  std::unique_ptr<DaemonProcess> StartDaemon(std::vector<std::string> args = {}) {
    auto d = std::make_unique<DaemonProcess>(OPGUARDD_PATH, dir_.path(), std::move(args));
    Status st = d->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return d;
  }

  static wire::Envelope const* Env(const Result<Answer>& a) { return a->envelope(); }

  // rank -> RankSummary of `run`, via the ZeroMQ query endpoint.
  std::map<uint32_t, std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>> Ranks(DaemonProcess& d,
                                                                               const std::string& run) {
    std::map<uint32_t, std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>> out;
    DaemonClient client(d.query());
    auto answer = client.ListRuns();
    EXPECT_TRUE(answer.ok()) << answer.status().message();
    if (!answer.ok()) return out;
    for (const auto* r : *Env(answer)->message_as_ListRunsAnswer()->runs()) {
      if (r->name()->str() != run) continue;
      for (const auto* k : *r->ranks()) out[k->rank()] = {k->ops(), k->collectives(), k->steps(), k->gaps()};
    }
    return out;
  }

  // Every op index of (run, rank, lane 0), read back page by page.
  std::vector<uint64_t> ReadAll(DaemonProcess& d, const std::string& run, uint32_t rank) {
    std::vector<uint64_t> ops;
    DaemonClient client(d.query(), 10s);
    uint64_t from = 0;
    for (int page = 0; page < 10000; ++page) {
      auto answer = client.ReadTrace(run, rank, 0, from, 5000);
      EXPECT_TRUE(answer.ok()) << answer.status().message();
      if (!answer.ok()) break;
      const auto* t = Env(answer)->message_as_ReadTraceAnswer();
      if (t->ops()) {
        for (const auto* op : *t->ops()) ops.push_back(op->op_index());
      }
      if (t->done()) break;
      from = t->next_op();
    }
    return ops;
  }

  // Sends one raw frame to the ingest socket; the answer must be a Rejected
  // ack whose error contains `error`.
  static void ExpectRejected(DaemonProcess& d, const std::string& what, const std::string& frame,
                             const std::string& error) {
    auto reply = testing::SendRaw(d.ingest(), frame, 10s);
    ASSERT_TRUE(reply.ok()) << what << ": " << reply.status().message();
    const std::string ack = testing::DescribeAck(*reply);
    EXPECT_EQ(ack.rfind("rejected: ", 0), 0u) << what << ": " << ack;
    EXPECT_NE(ack.find(error), std::string::npos) << what << ": " << ack;
  }

  static uint64_t Metric(const std::string& text, const std::string& name_and_labels) {
    auto pos = text.find("\n" + name_and_labels + " ");
    if (pos == std::string::npos) return UINT64_MAX;
    return std::stoull(text.substr(pos + name_and_labels.size() + 2));
  }

  testing::TempDir dir_;
};

TEST_F(DaemonTest, EightRanksIngestThenEveryCountMatches) {
  auto d = StartDaemon();
  constexpr uint64_t kBatches = 40, kOps = 250;
  std::vector<std::unique_ptr<RankSender>> senders;
  for (uint32_t r = 0; r < 8; ++r) {
    BatchOptions o;
    o.steps_every = 100;
    o.collectives_every = 50;
    if (r == 3) o.gaps = {{1000000, 1000009}};
    senders.push_back(std::make_unique<RankSender>(d->ingest(), "eight", r, 77 + r, kOps, o));
  }
  std::vector<std::thread> threads;
  std::vector<Status> results(8);
  for (uint32_t r = 0; r < 8; ++r) {
    threads.emplace_back([&, r] { results[r] = senders[r]->Run(kBatches, Clock::now() + 60s); });
  }
  for (auto& t : threads) t.join();
  for (uint32_t r = 0; r < 8; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].message();
    EXPECT_EQ(senders[r]->rejected(), 0u);
  }
  auto ranks = Ranks(*d, "eight");
  ASSERT_EQ(ranks.size(), 8u);
  for (const auto& [rank, counts] : ranks) {
    const auto [ops, collectives, steps, gaps] = counts;
    EXPECT_EQ(ops, kBatches * kOps) << "rank " << rank;
    EXPECT_EQ(collectives, kBatches * kOps / 50) << "rank " << rank;
    EXPECT_EQ(steps, kBatches * kOps / 100) << "rank " << rank;
    EXPECT_EQ(gaps, rank == 3 ? kBatches * 10 : 0u) << "rank " << rank;
  }
  for (uint32_t rank : {0u, 7u}) {
    auto ops = ReadAll(*d, "eight", rank);
    ASSERT_EQ(ops.size(), kBatches * kOps);
    for (uint64_t i = 0; i < ops.size(); ++i) ASSERT_EQ(ops[i], i);
  }
  // Run metadata from the announce.
  DaemonClient client(d->query());
  auto list = client.ListRuns();
  ASSERT_TRUE(list.ok());
  const auto* run = Env(list)->message_as_ListRunsAnswer()->runs()->Get(0);
  EXPECT_EQ(run->world_size(), 8u);
  EXPECT_EQ(run->framework()->str(), "loadgen");
  EXPECT_EQ(run->job_id()->str(), "job-42");
  ASSERT_NE(run->determinism(), nullptr);
  EXPECT_EQ(run->determinism()->LookupByKey("deterministic_algorithms")->value()->str(), "true");
  EXPECT_GT(run->end_ns(), 0u);
  // The same numbers after a clean restart (counters are persisted).
  EXPECT_EQ(d->Stop(), 0) << "SIGTERM must stop the daemon cleanly";
  d = StartDaemon();
  auto again = Ranks(*d, "eight");
  EXPECT_EQ(again, ranks);
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(DaemonTest, KillNineMidIngestLosesNoAckedRecordAndDuplicatesNothing) {
  auto d = StartDaemon();
  constexpr uint64_t kBatches = 120, kOps = 100;
  constexpr uint32_t kRanks = 8;
  std::vector<std::unique_ptr<RankSender>> senders;
  for (uint32_t r = 0; r < kRanks; ++r) {
    senders.push_back(std::make_unique<RankSender>(d->ingest(), "crash", r, 1000 + r, kOps));
  }
  // Phase 1: senders run; the daemon is killed while they are sending.
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { (void)senders[r]->Run(kBatches, Clock::now() + 60s, 8); });
  }
  // Wait (bounded) until some batches are durable, then kill -9.
  for (int i = 0; i < 400; ++i) {
    auto metrics = testing::HttpGet(d->http(), "/metrics");
    if (metrics.ok() && Metric(metrics->body, "opguard_batches_total{result=\"durable\"}") >= kRanks * 20) break;
    std::this_thread::sleep_for(10ms);
  }
  d->Kill9();
  for (auto& s : senders) s->Abort();
  for (auto& t : threads) t.join();
  std::vector<std::set<uint64_t>> acked_before(kRanks);
  uint64_t total_acked = 0;
  for (uint32_t r = 0; r < kRanks; ++r) {
    acked_before[r] = senders[r]->acked();
    total_acked += acked_before[r].size();
  }
  ASSERT_GT(total_acked, 0u);
  ASSERT_LT(total_acked, kRanks * kBatches) << "the kill came too late to test anything";

  // Phase 2: restart; every acknowledged record is there.
  d = StartDaemon();
  for (uint32_t r = 0; r < kRanks; ++r) {
    auto ops = ReadAll(*d, "crash", r);
    std::set<uint64_t> present(ops.begin(), ops.end());
    EXPECT_EQ(present.size(), ops.size()) << "duplicate op records on rank " << r;
    for (uint64_t seq : acked_before[r]) {
      for (uint64_t op = seq * kOps; op < (seq + 1) * kOps; ++op) {
        ASSERT_TRUE(present.count(op)) << "acked op " << op << " of rank " << r << " lost";
      }
    }
  }
  // Phase 3: the senders resend what was not acked and finish.
  threads.clear();
  std::vector<Status> results(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { results[r] = senders[r]->Run(kBatches, Clock::now() + 60s, 8); });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) ASSERT_TRUE(st.ok()) << st.message();
  auto ranks = Ranks(*d, "crash");
  ASSERT_EQ(ranks.size(), kRanks);
  for (const auto& [rank, counts] : ranks) EXPECT_EQ(std::get<0>(counts), kBatches * kOps) << "rank " << rank;
  // Phase 4: resending everything again changes nothing.
  for (uint32_t r = 0; r < kRanks; ++r) senders[r]->ForgetAcks();
  threads.clear();
  for (uint32_t r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] { results[r] = senders[r]->Run(kBatches, Clock::now() + 60s, 16); });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(Ranks(*d, "crash"), ranks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    auto ops = ReadAll(*d, "crash", r);
    ASSERT_EQ(ops.size(), kBatches * kOps);
    for (uint64_t i = 0; i < ops.size(); ++i) ASSERT_EQ(ops[i], i);
  }
  auto metrics = testing::HttpGet(d->http(), "/metrics");
  ASSERT_TRUE(metrics.ok());
  // Phase 4 alone resent every batch; phase 3 may have resent a few whose
  // ack was merely late.
  EXPECT_GE(Metric(metrics->body, "opguard_batches_total{result=\"duplicate\"}"), kRanks * kBatches);
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(DaemonTest, BadInputIsRejectedAndCountedWhileGoodTrafficContinues) {
  auto d = StartDaemon({"--ingest.max-message-bytes", "1MiB"});
  RankSender good(d->ingest(), "good", 0, 5, 200);
  Status good_result;
  std::thread sender([&] { good_result = good.Run(150, Clock::now() + 60s, 4); });

  const std::string valid = testing::MakeBatch("bad", 1, 9, 0, 0, 10, {});
  struct Case {
    const char* what;
    std::string frame;
    const char* error;
  };
  BatchOptions big;
  BatchOptions major;
  major.schema_major = 9;
  flatbuffers::FlatBufferBuilder list;
  wire::FinishEnvelope(list, wire::CreateListRunsRequest(list));
  std::vector<Case> cases = {
      {"garbage", std::string(4096, 'x'), "missing identifier"},
      {"truncated", valid.substr(0, valid.size() / 2), "verification"},
      {"oversized", testing::MakeBatch("bad", 1, 9, 1, 0, 3000, big), "exceeds the limit"},
      {"wrong major", testing::MakeBatch("bad", 1, 9, 2, 0, 10, major), "schema major 9"},
      {"not a batch", std::string(reinterpret_cast<const char*>(list.GetBufferPointer()), list.GetSize()),
       "expected a Batch"},
      {"bad run name", testing::MakeBatch("a/b", 1, 9, 3, 0, 10, {}), "invalid run name"},
      {"empty", std::string(), "missing identifier"},
  };
  ASSERT_GT(cases[2].frame.size(), 1u << 20);
  ASSERT_LT(cases[2].frame.size(), 2u << 20);
  for (const auto& c : cases) ExpectRejected(*d, c.what, c.frame, c.error);
  // Beyond twice the limit ZeroMQ drops the connection without reading it.
  auto huge = testing::SendRaw(d->ingest(), std::string(3u << 20, 'y'), 1500ms);
  EXPECT_FALSE(huge.ok());

  sender.join();
  ASSERT_TRUE(good_result.ok()) << good_result.message();
  EXPECT_EQ(good.rejected(), 0u);
  EXPECT_EQ(std::get<0>(Ranks(*d, "good")[0]), 150u * 200);
  EXPECT_TRUE(Ranks(*d, "bad").empty());
  auto metrics = testing::HttpGet(d->http(), "/metrics");
  ASSERT_TRUE(metrics.ok());
  const std::string& m = metrics->body;
  EXPECT_EQ(Metric(m, "opguard_batches_rejected_total{reason=\"not_opguard\"}"), 2u);
  EXPECT_EQ(Metric(m, "opguard_batches_rejected_total{reason=\"malformed\"}"), 1u);
  EXPECT_EQ(Metric(m, "opguard_batches_rejected_total{reason=\"oversized\"}"), 1u);
  EXPECT_EQ(Metric(m, "opguard_batches_rejected_total{reason=\"schema_major\"}"), 1u);
  EXPECT_EQ(Metric(m, "opguard_batches_rejected_total{reason=\"wrong_message\"}"), 1u);
  EXPECT_EQ(Metric(m, "opguard_batches_rejected_total{reason=\"invalid_batch\"}"), 1u);
  EXPECT_EQ(Metric(m, "opguard_batches_total{result=\"durable\"}"), 150u);
  EXPECT_TRUE(d->Running());
  EXPECT_EQ(d->Stop(), 0);
}

// One byte that is not UTF-8, in the run name or in a setting's value, used
// to abort the daemon when the run's JSON was written (and again after each
// restart, as the shim resent it). Then every such batch was refused whole,
// its valid ops with it: a Latin-1 source path cost the ops of its batch.
// Now only the run name (the run's identity) is refused; any other text is
// stored with each bad byte written as \xNN, and every op is kept.
TEST_F(DaemonTest, NonUtf8TextIsRepairedAndNoOpIsLost) {
  auto d = StartDaemon();
  BatchOptions announce;
  announce.announce = announce.definitions = true;
  ExpectRejected(*d, "run name", testing::MakeBatch("latin\xff", 0, 3, 0, 0, 10, announce), "run name is not valid UTF-8");
  ASSERT_TRUE(d->Running());

  BatchOptions bad = announce;
  bad.world_size = 1;
  bad.determinism = {{"cudnn.benchmark", "f\xff"}};
  bad.sources = {{"/home/\xe9l\xe8ve/train.py", "print('caf\xe9')\n"}};
  bad.gaps = {{1000, 1004}};
  auto reply = testing::SendRaw(d->ingest(), testing::MakeBatch("latin1", 0, 4, 0, 0, 10, bad), 10s);
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(testing::DescribeAck(*reply), "durable");
  RankSender more(d->ingest(), "latin1", 0, 4, 10);
  ASSERT_TRUE(more.Run(3, Clock::now() + 30s, 4).ok());  // seq 0 again (a duplicate), then 1 and 2
  EXPECT_EQ(ReadAll(*d, "latin1", 0).size(), 30u) << "every op of the batches is stored";

  auto run = testing::HttpGet(d->http(), "/api/runs/latin1");
  ASSERT_TRUE(run.ok() && run->status == 200) << (run.ok() ? run->body : run.status().message());
  auto json = nlohmann::json::parse(run->body);
  EXPECT_EQ(json["determinism"]["cudnn.benchmark"], "f\\xff");
  EXPECT_EQ(json["ranks"][0]["ops"], 30u);
  EXPECT_EQ(json["ranks"][0]["gaps"], 5u);
  auto metrics = testing::HttpGet(d->http(), "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(Metric(metrics->body, "opguard_batches_rejected_total{reason=\"invalid_batch\"}"), 1u);
  EXPECT_EQ(Metric(metrics->body, "opguard_batches_text_repaired_total"), 1u);
  EXPECT_TRUE(d->Running());
  EXPECT_EQ(d->Stop(), 0);
}

// The viewer's API on a real daemon: range queries over a two-run
// alignment (bounds, paging, locating an op), a rank's lanes, the trace's
// count= range, and source files served only for the run that sent them.
TEST_F(DaemonTest, ViewerRangeQueriesAndSources) {
  auto d = StartDaemon();
  BatchOptions with_source;
  with_source.sources = {{"/src/model.py", "import torch\nx = torch.ones(3)\ny = x * 2\n"}};
  RankSender a(d->ingest(), "a", 0, 21, 50, with_source);
  RankSender b(d->ingest(), "b", 0, 22, 50);
  ASSERT_TRUE(a.Run(6, Clock::now() + 30s).ok());
  ASSERT_TRUE(b.Run(6, Clock::now() + 30s).ok());
  auto get = [&](const std::string& target) {
    auto r = testing::HttpGet(d->http(), target, 30s);
    EXPECT_TRUE(r.ok()) << target;
    return r.ok() ? *r : testing::HttpResult{};
  };
  auto json = [&](const std::string& target) {
    auto r = get(target);
    EXPECT_EQ(r.status, 200) << target << ": " << r.body;
    return r.status == 200 ? nlohmann::json::parse(r.body) : nlohmann::json::object();
  };

  // 300 identical ops: 300 rows, every one an equal pair; pages tile the range.
  auto page = json("/api/alignment?reference=a&suspect=b&rank=0&from=0&count=100&op=250");
  EXPECT_EQ(page["rows_total"], 300);
  EXPECT_EQ(page["pairs"], 300);
  EXPECT_EQ(page["lanes"], nlohmann::json::array({0}));
  EXPECT_EQ(page["located"], 250);
  EXPECT_TRUE(page["first_differing_row"].is_null());
  ASSERT_EQ(page["rows"].size(), 100u);
  EXPECT_EQ(page["rows"][0]["link"], "equal");
  EXPECT_EQ(page["rows"][0]["reference"]["op_index"], 0);
  EXPECT_EQ(page["rows"][99]["suspect"]["op_index"], 99);
  EXPECT_EQ(page["rows"][7]["suspect"]["name"], testing::OpName(7));
  EXPECT_EQ(page["rows"][7]["suspect"]["site"]["file"], "train.py");
  auto tail = json("/api/alignment?reference=a&suspect=b&rank=0&from=250&count=5000");
  ASSERT_EQ(tail["rows"].size(), 50u);
  EXPECT_EQ(tail["rows"][49]["row"], 299);
  EXPECT_EQ(tail["rows"][49]["reference"]["op_index"], 299);
  EXPECT_EQ(json("/api/alignment?reference=a&suspect=b&rank=0&from=300")["rows"].size(), 0u);
  EXPECT_TRUE(json("/api/alignment?reference=a&suspect=b&rank=0&op=300")["located"].is_null());
  EXPECT_EQ(get("/api/alignment?reference=a&suspect=b&rank=0&count=5001").status, 400);
  EXPECT_EQ(get("/api/alignment?reference=a&suspect=b&rank=0&from=x").status, 400);
  EXPECT_EQ(get("/api/alignment?reference=a&suspect=b&rank=3").status, 404);
  EXPECT_EQ(get("/api/alignment?reference=a&suspect=b&rank=0&lane=1").status, 404);
  EXPECT_EQ(get("/api/alignment?reference=a&suspect=nope&rank=0").status, 404);

  auto lanes = json("/api/runs/a/ranks/0/lanes");
  EXPECT_EQ(lanes["lanes"], nlohmann::json::parse(R"([{"lane": 0, "last_op": 299}])"));
  EXPECT_EQ(get("/api/runs/a/ranks/5/lanes").status, 404);
  auto trace = json("/api/runs/a/ranks/0/trace?from=298&count=10");
  ASSERT_EQ(trace["ops"].size(), 2u);
  EXPECT_EQ(trace["ops"][0]["inputs"][2]["bits_hex"], "0000000040400000");  // float32 3.0

  auto source = json("/api/source?run=a&file=%2Fsrc%2Fmodel.py");
  EXPECT_EQ(source["text"], "import torch\nx = torch.ones(3)\ny = x * 2\n");
  // Only files the run sent, by the exact path it sent: not another run's,
  // not a path it names without content, never a file of this machine.
  for (const char* target : {"/api/source?run=b&file=%2Fsrc%2Fmodel.py", "/api/source?run=a&file=train.py",
                             "/api/source?run=a&file=model.py", "/api/source?run=a&file=/etc/passwd",
                             "/api/source?run=a&file=%2Fsrc%2F..%2Fsrc%2Fmodel.py", "/api/source?run=nope&file=x"}) {
    auto r = get(target);
    EXPECT_EQ(r.status, 404) << target << ": " << r.body;
    EXPECT_EQ(r.body.find("import torch"), std::string::npos) << target;
  }
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(DaemonTest, HttpJsonAndMetrics) {
  auto d = StartDaemon();
  BatchOptions o;
  o.steps_every = 10;
  RankSender sender(d->ingest(), "web", 2, 11, 50, o);
  ASSERT_TRUE(sender.Run(4, Clock::now() + 30s).ok());

  auto status = testing::HttpGet(d->http(), "/api/status");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->status, 200);
  auto sj = nlohmann::json::parse(status->body);
  EXPECT_EQ(sj["runs"], 1);
  EXPECT_EQ(sj["http"], d->http());
  EXPECT_EQ(sj["ingest"], d->ingest());
  EXPECT_EQ(sj["records_ingested"], 200);

  auto runs = testing::HttpGet(d->http(), "/api/runs");
  ASSERT_TRUE(runs.ok());
  auto rj = nlohmann::json::parse(runs->body);
  ASSERT_EQ(rj["runs"].size(), 1u);
  EXPECT_EQ(rj["runs"][0]["name"], "web");
  EXPECT_EQ(rj["runs"][0]["ranks"][0]["rank"], 2);
  EXPECT_EQ(rj["runs"][0]["ranks"][0]["ops"], 200);
  EXPECT_EQ(rj["runs"][0]["ranks"][0]["steps"], 20);
  EXPECT_EQ(rj["runs"][0]["determinism"]["deterministic_algorithms"], "true");

  auto one = testing::HttpGet(d->http(), "/api/runs/web");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(nlohmann::json::parse(one->body)["ops"], 200);

  auto trace = testing::HttpGet(d->http(), "/api/runs/web/ranks/2/trace?from=5&max=3");
  ASSERT_TRUE(trace.ok());
  ASSERT_EQ(trace->status, 200) << trace->body;
  auto tj = nlohmann::json::parse(trace->body);
  ASSERT_EQ(tj["ops"].size(), 3u);
  EXPECT_EQ(tj["ops"][0]["op_index"], 5);
  EXPECT_EQ(tj["ops"][2]["op_index"], 7);
  EXPECT_EQ(tj["ops"][0]["name"], testing::OpName(5));
  EXPECT_EQ(tj["ops"][0]["site"]["file"], "train.py");
  EXPECT_EQ(tj["ops"][0]["site"]["function"], "forward");
  EXPECT_EQ(tj["ops"][0]["inputs"][2]["kind"], "scalar");
  EXPECT_EQ(tj["ops"][0]["inputs"][2]["bits"], 1077936128);
  EXPECT_EQ(tj["ops"][0]["outputs"][0]["fingerprint"].get<std::string>().size(), 32u);
  EXPECT_EQ(tj["ops"][0]["kernels"][0], "ampere_bf16_gemm");
  EXPECT_EQ(tj["next_op"], 8);
  EXPECT_EQ(tj["done"], false);
  auto last = testing::HttpGet(d->http(), "/api/runs/web/ranks/2/trace?from=190&max=100");
  ASSERT_TRUE(last.ok());
  auto lj = nlohmann::json::parse(last->body);
  EXPECT_EQ(lj["ops"].size(), 10u);
  EXPECT_EQ(lj["done"], true);

  EXPECT_EQ(testing::HttpGet(d->http(), "/api/runs/nope")->status, 404);
  EXPECT_EQ(testing::HttpGet(d->http(), "/api/runs/web/ranks/9/trace")->status, 404);
  EXPECT_EQ(testing::HttpGet(d->http(), "/api/runs/web/ranks/2/trace?max=abc")->status, 400);
  EXPECT_EQ(testing::HttpGet(d->http(), "/nope")->status, 404);
  EXPECT_EQ(testing::HttpGet(d->http(), "/healthz")->status, 200);

  auto metrics = testing::HttpGet(d->http(), "/metrics");
  ASSERT_TRUE(metrics.ok());
  const std::string& m = metrics->body;
  EXPECT_EQ(Metric(m, "opguard_records_ingested_total{kind=\"op\"}"), 200u);
  EXPECT_EQ(Metric(m, "opguard_records_ingested_total{kind=\"step\"}"), 20u);
  EXPECT_EQ(Metric(m, "opguard_ack_latency_seconds_count"), 4u);
  EXPECT_EQ(Metric(m, "opguard_runs"), 1u);
  EXPECT_NE(Metric(m, "opguard_ingest_bytes_total"), UINT64_MAX);
  EXPECT_NE(Metric(m, "opguard_rocksdb_sst_bytes{cf=\"ops\"}"), UINT64_MAX);
  EXPECT_NE(m.find("# TYPE opguard_ack_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(m.find("opguard_ack_latency_seconds_bucket{le=\"+Inf\"} 4"), std::string::npos);
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(DaemonTest, CliAgainstARealDaemon) {
  auto d = StartDaemon();
  RankSender sender(d->ingest(), "cli-run", 0, 3, 100);
  ASSERT_TRUE(sender.Run(3, Clock::now() + 30s).ok());
  const std::string cli = std::string(OPGUARD_CLI_PATH) + " ";
  const std::string at = " --daemon " + d->query();

  auto status = testing::RunCommand(cli + "status" + at);
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_NE(status.output.find("runs      1"), std::string::npos) << status.output;
  EXPECT_NE(status.output.find(d->http()), std::string::npos) << status.output;

  auto runs = testing::RunCommand(cli + "runs" + at);
  EXPECT_EQ(runs.exit_code, 0) << runs.output;
  EXPECT_NE(runs.output.find("cli-run"), std::string::npos) << runs.output;
  EXPECT_NE(runs.output.find("300"), std::string::npos) << runs.output;

  auto json = testing::RunCommand(cli + "runs --json" + at);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  auto j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["runs"][0]["name"], "cli-run");
  EXPECT_EQ(j["runs"][0]["ranks"][0]["ops"], 300);

  // --daemon and --json also before the command name; --opt=value and --opt value.
  auto before = testing::RunCommand(cli + "--daemon " + d->query() + " runs");
  EXPECT_EQ(before.exit_code, 0) << before.output;
  EXPECT_NE(before.output.find("cli-run"), std::string::npos) << before.output;
  auto equals = testing::RunCommand(cli + "--json runs --daemon=" + d->query());
  ASSERT_EQ(equals.exit_code, 0) << equals.output;
  EXPECT_EQ(nlohmann::json::parse(equals.output)["runs"][0]["name"], "cli-run");
  auto unknown = testing::RunCommand(cli + "runs --frobnicate" + at);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("--frobnicate"), std::string::npos) << unknown.output;
  EXPECT_EQ(std::count(unknown.output.begin(), unknown.output.end(), '\n'), 1) << unknown.output;
  auto diff_help = testing::RunCommand(cli + "diff --help");
  EXPECT_EQ(diff_help.exit_code, 0) << diff_help.output;
  for (const char* text : {"--daemon", "--timeout", "--rank", "REFERENCE", "SUSPECT", "Exit codes",
                           "0 identical", "1 diverged", "2 error (usage", "3 incomplete"}) {
    EXPECT_NE(diff_help.output.find(text), std::string::npos) << text << " in:\n" << diff_help.output;
  }

  auto rm = testing::RunCommand(cli + "rm cli-run" + at);
  EXPECT_EQ(rm.exit_code, 0) << rm.output;
  auto after = testing::RunCommand(cli + "runs --json" + at);
  EXPECT_TRUE(nlohmann::json::parse(after.output)["runs"].empty()) << after.output;
  DaemonClient client(d->query());
  EXPECT_FALSE(client.ReadTrace("cli-run", 0, 0, 0, 10).ok());
  auto again = testing::RunCommand(cli + "rm cli-run" + at);
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.output.find("no run named 'cli-run'"), std::string::npos) << again.output;

  // A re-sent run after rm starts afresh (new run id, no stale records).
  RankSender resend(d->ingest(), "cli-run", 0, 4, 10);
  ASSERT_TRUE(resend.Run(1, Clock::now() + 30s).ok());
  auto reread = ReadAll(*d, "cli-run", 0);
  EXPECT_EQ(reread.size(), 10u);

  // Unreachable daemon: one line, exit code 2, and it gives up by itself
  // (RunCommand would kill a CLI that waited forever: exit code 124, not 2).
  auto down =
      testing::RunCommand(cli + "status --timeout 1 --daemon ipc://" + dir_.path() + "/nobody.sock", 120);
  EXPECT_EQ(down.exit_code, 2) << down.output;
  EXPECT_NE(down.output.find("daemon not reachable at ipc://"), std::string::npos) << down.output;
  EXPECT_EQ(std::count(down.output.begin(), down.output.end(), '\n'), 1) << down.output;
  auto usage = testing::RunCommand(cli + "rm" + at);
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_EQ(d->Stop(), 0);
}

// `status --json` and `runs --json` are the HTTP API's answers (one renderer
// for both faces), the CLI adding only the endpoint it asked.
TEST_F(DaemonTest, CliJsonIsTheHttpJson) {
  const std::string cli = std::string(OPGUARD_CLI_PATH) + " ";
  auto d = StartDaemon();
  const std::string at = " --daemon " + d->query();
  BatchOptions o;
  o.collectives_every = 10;
  RankSender sender(d->ingest(), "same", 1, 5, 40, o);
  ASSERT_TRUE(sender.Run(2, Clock::now() + 30s).ok());

  auto status = testing::RunCommand(cli + "status --json" + at);
  ASSERT_EQ(status.exit_code, 0) << status.output;
  auto cli_status = nlohmann::json::parse(status.output);
  auto http_status = nlohmann::json::parse(testing::HttpGet(d->http(), "/api/status")->body);
  EXPECT_EQ(cli_status["healthy"], true);
  EXPECT_EQ(cli_status["endpoint"], d->query());
  EXPECT_EQ(cli_status["runs"], 1);
  for (auto* j : {&cli_status, &http_status}) j->erase("uptime_s");  // seconds apart
  cli_status.erase("endpoint");
  EXPECT_EQ(cli_status, http_status);

  auto runs = testing::RunCommand(cli + "runs --json" + at);
  ASSERT_EQ(runs.exit_code, 0) << runs.output;
  auto cli_runs = nlohmann::json::parse(runs.output);
  EXPECT_EQ(cli_runs, nlohmann::json::parse(testing::HttpGet(d->http(), "/api/runs")->body));
  const auto& run = cli_runs["runs"][0];
  EXPECT_EQ(run["name"], "same");
  EXPECT_EQ(run["ops"], 80);
  EXPECT_TRUE(run["versions"].is_object()) << run;
  EXPECT_TRUE(run["environment"].is_object()) << run;
  const auto& rank = run["ranks"][0];
  EXPECT_EQ(rank["rank"], 1);
  EXPECT_EQ(rank["collectives"], 8);
  EXPECT_EQ(rank["collective_gaps"], 0);
  EXPECT_EQ(rank["batches"], 2);
  EXPECT_EQ(rank["pid"], 1001);
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(DaemonTest, RetentionRemovesOldRunsButNeverTheNewest) {
  auto d = StartDaemon({"--retention.max-age", "1s", "--retention.interval", "1s"});
  RankSender a(d->ingest(), "old", 0, 1, 10);
  ASSERT_TRUE(a.Run(2, Clock::now() + 30s).ok());
  std::this_thread::sleep_for(1500ms);
  RankSender b(d->ingest(), "new", 0, 2, 10);
  ASSERT_TRUE(b.Run(2, Clock::now() + 30s).ok());
  bool old_gone = false;
  for (int i = 0; i < 100 && !old_gone; ++i) {
    old_gone = Ranks(*d, "old").empty();
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(old_gone);
  // "new" is the most recently active run: kept although older than 1 s by now.
  std::this_thread::sleep_for(2500ms);
  EXPECT_EQ(Ranks(*d, "new").size(), 1u);
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(DaemonTest, UnixSocketPermissionsAndRefusedSecondDaemon) {
  auto d = StartDaemon();
  struct stat st{};
  ASSERT_EQ(::stat((dir_.path() + "/ingest.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);  // the user's jobs (docs/operations.md)
  // A second daemon on the same data dir fails fast with a clear error and
  // does not take over the first one's sockets.
  auto second = testing::RunCommand(std::string(OPGUARDD_PATH) + " --local " + dir_.path() + " --http 127.0.0.1:0", 20);
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_NE(second.output.find("another opguardd (pid " + std::to_string(d->pid()) + ") serves " + dir_.path()),
            std::string::npos)
      << second.output;
  DaemonClient client(d->query());
  EXPECT_TRUE(client.Status().ok());
  RankSender sender(d->ingest(), "still-mine", 0, 1, 10);
  EXPECT_TRUE(sender.Run(1, Clock::now() + 20s).ok());
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(DaemonTest, LoadgenEightRanks) {
  ASSERT_TRUE(std::filesystem::exists(OPGUARD_LOADGEN_PATH)) << OPGUARD_LOADGEN_PATH << " not built";
  auto d = StartDaemon();
  auto out = testing::RunCommand(std::string(OPGUARD_LOADGEN_PATH) + " --run lg --ranks 8 --ops 3000 --collective-every 100 --endpoint " +
                                     d->ingest() + " --json 2>/dev/null",
                                 120);
  ASSERT_EQ(out.exit_code, 0) << out.output;
  auto j = nlohmann::json::parse(out.output.substr(out.output.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out.output;
  ASSERT_TRUE(j["all_acknowledged"].get<bool>()) << out.output;
  auto ranks = Ranks(*d, "lg");
  ASSERT_EQ(ranks.size(), 8u);
  for (const auto& r : j["per_rank"]) {
    const uint32_t rank = r["rank"].get<uint32_t>();
    EXPECT_EQ(std::get<0>(ranks[rank]), r["ops"].get<uint64_t>()) << "rank " << rank;
    EXPECT_EQ(std::get<1>(ranks[rank]), r["collectives"].get<uint64_t>()) << "rank " << rank;
    EXPECT_EQ(ReadAll(*d, "lg", rank).size(), r["ops"].get<uint64_t>()) << "rank " << rank;
  }
  EXPECT_EQ(d->Stop(), 0);
}

}  // namespace
}  // namespace opguard::daemon
