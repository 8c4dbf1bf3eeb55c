// opguardd under hostile numbers (issue 21, problems 3-5), against a real
// daemon process: what a sender announces does not size the daemon's memory,
// a missing batch seq does not make deduplication quadratic, ingest stops
// reading at its byte budget, and idle HTTP connections do not starve the
// training jobs' connections of file descriptors.
//
// OPGUARDD_UNDER_TEST=PATH runs these against another opguardd build.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
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

std::string Opguardd() {
  const char* other = std::getenv("OPGUARDD_UNDER_TEST");
  return other != nullptr && *other != '\0' ? other : OPGUARDD_PATH;
}

class LimitsTest : public ::testing::Test {
 protected:
  std::unique_ptr<testing::DaemonProcess> StartDaemon(std::vector<std::string> args = {},
                                             const std::string& binary = Opguardd()) {
    auto d = std::make_unique<testing::DaemonProcess>(binary, dir_.path(), std::move(args));
    Status st = d->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return d;  // the test asserts Running() before using it
  }

  // Still up after what the test did, and stops cleanly.
  static void StopCleanly(testing::DaemonProcess& d) {
    EXPECT_TRUE(d.Running());
    EXPECT_EQ(d.Stop(), 0);
  }

  static std::string Ack(testing::DaemonProcess& d, const std::string& frame) {
    auto reply = testing::SendRaw(d.ingest(), frame, 10s);
    return reply.ok() ? testing::DescribeAck(*reply) : "no ack: " + reply.status().message();
  }

  static void ExpectRejected(testing::DaemonProcess& d, const std::string& frame, const std::string& error) {
    const std::string ack = Ack(d, frame);
    EXPECT_EQ(ack.rfind("rejected: ", 0), 0u) << ack;
    EXPECT_NE(ack.find(error), std::string::npos) << ack;
  }

  static double Metric(testing::DaemonProcess& d, const std::string& name_and_labels) {
    auto metrics = testing::HttpGet(d.http(), "/metrics");
    if (!metrics.ok()) return -1;
    auto pos = metrics->body.find("\n" + name_and_labels + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(metrics->body.substr(pos + name_and_labels.size() + 2));
  }

  static nlohmann::json Run(testing::DaemonProcess& d, const std::string& name) {
    auto r = testing::HttpGet(d.http(), "/api/runs/" + name);
    if (!r.ok() || r->status != 200) return nullptr;
    return nlohmann::json::parse(r->body);
  }

  testing::TempDir dir_;
};

BatchOptions Announce(uint32_t world_size) {
  BatchOptions o;
  o.announce = o.definitions = true;
  o.world_size = world_size;
  return o;
}

// World size 2e7 used to be accepted, fixed for good by the first announce,
// and a collectives query then built every expected rank (19 MB -> 2.4 GB).
TEST_F(LimitsTest, AHugeWorldSizeIsRejectedAndQueriesStayCheap) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  ExpectRejected(*d, testing::MakeBatch("huge", 0, 1, 0, 0, 10, Announce(20000000)),
                 "ingest.max_world_size");
  ExpectRejected(*d, testing::MakeBatch("huge", 4000000000u, 2, 0, 0, 10, {}),
                 "ingest.max_world_size");
  ExpectRejected(*d, testing::MakeBatch("huge", 9, 3, 0, 0, 10, Announce(8)),
                 "outside the world size 8");
  // The same run from a sane rank: accepted, and its world size is the sane one.
  EXPECT_EQ(Ack(*d, testing::MakeBatch("huge", 0, 4, 0, 0, 10, Announce(8))), "durable");
  const uint64_t rss_before = d->RssBytes();
  auto collectives = testing::HttpGet(d->http(), "/api/runs/huge/collectives", 60s);
  ASSERT_TRUE(collectives.ok()) << collectives.status().message();
  EXPECT_EQ(collectives->status, 200) << collectives->body;
  EXPECT_EQ(Run(*d, "huge")["world_size"], 8);
  std::printf("daemon RSS around the collectives query: %.1f -> %.1f MiB\n", rss_before / 1048576.0,
              d->RssBytes() / 1048576.0);
  // Growth, not the total: sanitizer builds start far larger.
  EXPECT_LT(d->RssBytes(), rss_before + (200u << 20)) << "the daemon's memory followed an announced number";
  EXPECT_EQ(Metric(*d, "opguard_batches_rejected_total{reason=\"limit\"}"), 2);
  EXPECT_EQ(Metric(*d, "opguard_batches_rejected_total{reason=\"invalid_batch\"}"), 1);
  StopCleanly(*d);
}

// A first announce with a wrong world size is outvoted by the ranks that follow.
TEST_F(LimitsTest, TheFirstAnnounceDoesNotFixTheWorldSize) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(Ack(*d, testing::MakeBatch("vote", 1, 1, 0, 0, 10, Announce(100000))), "durable");
  EXPECT_EQ(Run(*d, "vote")["world_size"], 100000);
  for (uint32_t rank : {0u, 2u, 3u}) {
    EXPECT_EQ(Ack(*d, testing::MakeBatch("vote", rank, 10 + rank, 0, 0, 10, Announce(4))),
              "durable");
  }
  EXPECT_EQ(Run(*d, "vote")["world_size"], 4);
  // The vote is persisted with the ranks.
  EXPECT_EQ(d->Stop(), 0);
  d = StartDaemon();
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(Run(*d, "vote")["world_size"], 4);
  StopCleanly(*d);
}

TEST_F(LimitsTest, RunsRanksAndStringsAreCapped) {
  auto d = StartDaemon({"--ingest.max-runs", "3", "--ingest.max-ranks-per-run", "2",
                        "--ingest.max-ranks", "5", "--ingest.max-string-bytes", "1KiB",
                        "--ingest.max-run-metadata-bytes", "4KiB"});
  ASSERT_TRUE(d->Running());
  ASSERT_TRUE(d->Running());
  for (const char* run : {"a", "b", "c"})
    EXPECT_EQ(Ack(*d, testing::MakeBatch(run, 0, 1, 0, 0, 10, {})), "durable");
  ExpectRejected(*d, testing::MakeBatch("d", 0, 1, 0, 0, 10, {}), "ingest.max_runs (3)");
  EXPECT_EQ(Ack(*d, testing::MakeBatch("a", 1, 1, 0, 0, 10, {})), "durable");
  ExpectRejected(*d, testing::MakeBatch("a", 2, 1, 0, 0, 10, {}), "ingest.max_ranks_per_run (2)");
  EXPECT_EQ(Ack(*d, testing::MakeBatch("b", 1, 1, 0, 0, 10, {})), "durable");
  ExpectRejected(*d, testing::MakeBatch("c", 1, 1, 0, 0, 10, {}), "ingest.max_ranks (5)");
  // A known rank of a full run still sends.
  EXPECT_EQ(Ack(*d, testing::MakeBatch("a", 1, 1, 1, 10, 10, {})), "durable");

  BatchOptions long_value = Announce(8);
  long_value.determinism = {{"note", std::string(1500, 'x')}};
  ExpectRejected(*d, testing::MakeBatch("a", 0, 1, 2, 20, 10, long_value),
                 "ingest.max_string_bytes");
  // Settings merge across announces, up to the run's metadata budget.
  std::string error;
  int accepted = 0;
  for (int i = 0; i < 8 && error.empty(); ++i) {
    BatchOptions more = Announce(8);
    more.determinism = {{"key" + std::to_string(i), std::string(900, 'v')}};
    const std::string ack = Ack(*d, testing::MakeBatch("b", 0, 1, 1 + i, 10 * (1 + i), 10, more));
    if (ack == "durable")
      ++accepted;
    else
      error = ack;
  }
  // 4 KiB holds the announce's own settings and three or four more.
  EXPECT_GE(accepted, 3);
  EXPECT_LE(accepted, 4);
  EXPECT_NE(error.find("ingest.max_run_metadata_bytes"), std::string::npos) << error;

  // Removing a run makes room for another.
  DaemonClient client(d->query());
  ASSERT_TRUE(client.DeleteRun("c").ok());
  EXPECT_EQ(Ack(*d, testing::MakeBatch("d", 0, 1, 0, 0, 10, {})), "durable");
  EXPECT_EQ(Metric(*d, "opguard_batches_rejected_total{reason=\"limit\"}"), 5);
  StopCleanly(*d);
}

// 40 000 one-op batches after one missing seq (the run was removed while its
// job still sent) used to cost 23 s of daemon CPU against 1 s in order: every
// group rewrote every seq applied above the gap.
TEST_F(LimitsTest, DedupAfterAMissingSeqCostsAboutWhatInOrderCosts) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  constexpr uint64_t kBatches = 40000;
  const auto deadline = Clock::now() + 240s;
  double cpu = testing::ProcessCpuSeconds(d->pid());
  testing::RankSender in_order(d->ingest(), "in-order", 0, 1, 1);
  ASSERT_TRUE(in_order.Run(kBatches, deadline, 64).ok());
  const double in_order_cpu = testing::ProcessCpuSeconds(d->pid()) - cpu;

  testing::RankSender gapped(d->ingest(), "gapped", 0, 2, 1);
  ASSERT_TRUE(gapped.Run(10, deadline, 8).ok());
  DaemonClient client(d->query());
  ASSERT_TRUE(client.DeleteRun("gapped").ok());
  cpu = testing::ProcessCpuSeconds(d->pid());
  ASSERT_TRUE(gapped.Run(10 + kBatches, deadline, 64).ok());
  const double gapped_cpu = testing::ProcessCpuSeconds(d->pid()) - cpu;
  EXPECT_EQ(gapped.rejected(), 0u);
  EXPECT_LT(gapped_cpu, 4 * in_order_cpu + 1.0)
      << "in order " << in_order_cpu << " s, after a gap " << gapped_cpu << " s of daemon CPU";
  std::printf("daemon CPU for %llu one-op batches: in order %.2f s, after a missing seq %.2f s\n",
              static_cast<unsigned long long>(kBatches), in_order_cpu, gapped_cpu);

  // Within the window, resends are still dropped.
  const double duplicates = Metric(*d, "opguard_batches_total{result=\"duplicate\"}");
  for (uint64_t seq : {uint64_t{10}, uint64_t{20000}, 10 + kBatches - 1}) {
    EXPECT_EQ(Ack(*d, testing::MakeBatch("gapped", 0, 2, seq, seq, 1, {})), "durable");
  }
  EXPECT_EQ(Metric(*d, "opguard_batches_total{result=\"duplicate\"}"), duplicates + 3);
  EXPECT_EQ(Run(*d, "gapped")["ops"], kBatches);
  EXPECT_EQ(Metric(*d, "opguard_dedup_deferred_total"), 0);
  StopCleanly(*d);
}

// Senders that outrun the store fill the in-flight budget; the daemon then
// stops reading instead of holding more.
TEST_F(LimitsTest, IngestStopsReadingAtItsByteBudget) {
  constexpr uint64_t kBudget = 4u << 20;
  auto d = StartDaemon({"--ingest.max-inflight-bytes", "4MiB", "--ingest.hwm", "2"});
  ASSERT_TRUE(d->Running());
  constexpr uint32_t kRanks = 6, kBatches = 25, kOps = 2000;  // ~0.7 MiB per batch
  std::vector<std::unique_ptr<testing::RankSender>> senders;
  BatchOptions cheap;
  cheap.reuse_template = true;
  for (uint32_t r = 0; r < kRanks; ++r) {
    senders.push_back(std::make_unique<testing::RankSender>(d->ingest(), "budget", r, 100 + r, kOps, cheap));
  }
  std::vector<std::thread> threads;
  std::vector<Status> results(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = senders[r]->Run(kBatches, Clock::now() + 120s, 32); });
  }
  double most = 0;
  for (int i = 0;
       i < 2000 && Metric(*d, "opguard_batches_total{result=\"durable\"}") < kRanks * kBatches;
       ++i) {
    most = std::max(most, Metric(*d, "opguard_ingest_inflight_bytes"));
    std::this_thread::sleep_for(5ms);
  }
  for (auto& t : threads) t.join();
  for (const auto& st : results) ASSERT_TRUE(st.ok()) << st.message();
  const uint64_t batch_bytes = testing::MakeBatch("budget", 0, 100, 1, kOps, kOps, cheap).size();
  EXPECT_GT(most, 0);
  EXPECT_LE(most, static_cast<double>(kBudget + batch_bytes))
      << "the receiver read past its budget";
  EXPECT_GT(Metric(*d, "opguard_ingest_paused_seconds_total"), 0);
  EXPECT_EQ(Run(*d, "budget")["ops"], uint64_t{kRanks} * kBatches * kOps);
  StopCleanly(*d);
}

// `opguard status` names a pause at the in-flight budget, with its reason
// and start, while senders outrun the store, and no pause once they stop.
// With a 4 KiB budget every batch (~0.2 MiB) fills it until its group is
// durable, so the receiver is paused most of the time busy senders run.
TEST_F(LimitsTest, StatusShowsAPauseAtTheInflightBudgetUntilItFrees) {
  auto d = StartDaemon({"--ingest.max-inflight-bytes", "4KiB"});
  ASSERT_TRUE(d->Running());
  const std::string status = std::string(OPGUARD_CLI_PATH) + " status --daemon " + d->query();
  auto json_status = [&] {
    auto r = testing::RunCommand(status + " --json", 20);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  };
  ASSERT_TRUE(json_status()["ingest_paused"].empty());
  constexpr uint32_t kRanks = 2;
  BatchOptions cheap;
  cheap.reuse_template = true;
  std::vector<std::unique_ptr<testing::RankSender>> senders;
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::system_clock::now();
  for (uint32_t r = 0; r < kRanks; ++r) {
    senders.push_back(std::make_unique<testing::RankSender>(d->ingest(), "paused", r, 300 + r, 500, cheap));
    threads.emplace_back([&, r] { (void)senders[r]->Run(1000000, Clock::now() + 60s, 8); });
  }
  auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < 300; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  };
  nlohmann::json pause;
  EXPECT_TRUE(wait_for([&] {
    auto s = json_status();
    if (s["ingest_paused"].size() != 1) return false;
    pause = s["ingest_paused"][0];
    return true;
  })) << "no pause seen while the senders ran";
  std::string text;
  EXPECT_TRUE(wait_for([&] {
    text = testing::RunCommand(status, 20).output;
    return text.find("paused    at the in-flight byte budget since ") != std::string::npos;
  })) << text;
  for (auto& s : senders) s->Abort();
  for (auto& t : threads) t.join();
  EXPECT_EQ(pause["cause"], "inflight_budget") << pause.dump();
  EXPECT_NE(pause["reason"].get<std::string>().find("ingest.max_inflight_bytes (4096)"), std::string::npos)
      << pause.dump();
  const auto since = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::nanoseconds(pause["since_ns"].get<int64_t>())));
  EXPECT_GE(since, t0 - 1s);
  EXPECT_LE(since, std::chrono::system_clock::now());
  EXPECT_NE(text.find("ingest.max_inflight_bytes"), std::string::npos) << text;
  // What was received is durable once the senders stop: the pause ends.
  // (Batches still queued in the sockets when they stopped can fill the
  // budget once more after a first look shows none: wait until both the
  // text and the JSON show no pause.)
  EXPECT_TRUE(wait_for([&] {
    text = testing::RunCommand(status, 20).output;
    return text.find("paused") == std::string::npos && json_status()["ingest_paused"].empty();
  })) << text << json_status().dump();
  StopCleanly(*d);
}

// With 256 file descriptors, 300 idle HTTP connections used to take them all
// and the next training job's connect hit libzmq's EMFILE assertion.
TEST_F(LimitsTest, IdleHttpConnectionsDoNotStarveIngest) {
  rlimit own{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &own), 0);
  if (own.rlim_cur < 1024 && own.rlim_max >= 1024) {
    own.rlim_cur = 1024;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &own), 0);
  }
  ASSERT_GE(own.rlim_cur, 512u) << "this test opens 300 connections itself";
  const std::string wrapper = dir_.path() + "/opguardd-256";
  {
    std::ofstream script(wrapper);
    script << "#!/bin/sh\nexec prlimit --nofile=256:256 -- '" << Opguardd() << "' \"$@\"\n";
  }
  ASSERT_EQ(::chmod(wrapper.c_str(), 0755), 0);
  auto d = StartDaemon({}, wrapper);
  ASSERT_TRUE(d->Running());
  const auto colon = d->http().rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(d->http().substr(colon + 1))));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    // Connects complete in the kernel's backlog whether or not the daemon accepts.
    ::fcntl(fd, F_SETFL, O_NONBLOCK);
    (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(500ms);
  // A training job connects and sends.
  testing::RankSender job(d->ingest(), "job", 0, 7, 100);
  EXPECT_TRUE(job.Run(20, Clock::now() + 60s, 4).ok());
  EXPECT_EQ(job.rejected(), 0u);
  ASSERT_TRUE(d->Running()) << "the daemon died with 300 idle HTTP connections";
  for (int fd : idle) ::close(fd);
  // HTTP serves again once the idle connections are gone.
  std::optional<Result<testing::HttpResult>> metrics;
  for (int i = 0; i < 50; ++i) {
    auto m = testing::HttpGet(d->http(), "/metrics", 2s);
    if (m.ok()) {
      metrics = std::move(m);
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(metrics.has_value());
  EXPECT_GT(Metric(*d, "opguard_http_accept_backoffs_total"), 0);
  EXPECT_EQ(Run(*d, "job")["ops"], 20u * 100);
  StopCleanly(*d);
}

// One-rank runs of `ops` identical ops each: a diff of two reads and aligns
// 2 x `ops` records.
void RecordTwinRuns(testing::DaemonProcess& d, uint64_t ops,
                    std::initializer_list<const char*> runs = {"ref", "sus"}) {
  BatchOptions o;
  o.reuse_template = true;
  o.announce = o.definitions = true;
  o.world_size = 1;
  constexpr uint32_t kOpsPerBatch = 1000;
  for (const char* run : runs) {
    testing::RankSender sender(d.ingest(), run, 0, 1, kOpsPerBatch, o);
    ASSERT_TRUE(sender.Run(ops / kOpsPerBatch, Clock::now() + 120s, 16).ok()) << run;
  }
}

// Sends an HTTP GET and closes the connection at once, without reading:
// a client that went away, by construction rather than by a short timeout.
void SendAndHangUp(const std::string& host_port, const std::string& target) {
  const auto colon = host_port.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string request =
      "GET " + target + " HTTP/1.1\r\nHost: " + host_port + "\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  ::close(fd);
}

// 20 abandoned /api/diff requests used to be computed to the end, one after
// another on the two aligner workers, and a diff asked after them waited for
// all of them. Each is now cancelled when its connection closes. Counted, not
// timed: every client hangs up right after sending, and with the trace cache
// off every diff reads both 300 000-op runs from the store, so none is
// answered before the daemon sees its client gone; all of them must count as
// cancelled, and their daemon CPU must stay far below computing them.
TEST_F(LimitsTest, AbandonedDiffsAreCancelledAndDoNotDelayTheNextOne) {
  auto d = StartDaemon({"--query.trace-cache-bytes", "0"});
  ASSERT_TRUE(d->Running());
  RecordTwinRuns(*d, 300000, {"ref", "sus", "other"});
  auto diff = [&] {
    auto r = testing::HttpGet(d->http(), "/api/diff?reference=ref&suspect=sus", 300s);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(nlohmann::json::parse(r->body)["status"], "identical") << r->body;
  };
  const double alone_cpu0 = testing::ProcessCpuSeconds(d->pid());
  diff();
  const double alone_cpu = testing::ProcessCpuSeconds(d->pid()) - alone_cpu0;

  constexpr int kAbandoned = 20;
  const std::string cancelled = "opguard_queries_cancelled_total{reason=\"client_gone\"}";
  const double cpu0 = testing::ProcessCpuSeconds(d->pid());
  for (int i = 0; i < kAbandoned; ++i) SendAndHangUp(d->http(), "/api/diff?reference=ref&suspect=other");
  for (int i = 0; i < 600 && Metric(*d, cancelled) < kAbandoned; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Metric(*d, cancelled), kAbandoned);
  // The diff asked after them is answered, and correctly.
  diff();
  const double flood_cpu = testing::ProcessCpuSeconds(d->pid()) - cpu0;
  std::printf("one diff %.2f s daemon CPU; %d abandoned ones and one more diff %.2f s\n", alone_cpu,
              kAbandoned, flood_cpu);
  // Computed to the end they would cost about kAbandoned + 1 diffs.
  EXPECT_LT(flood_cpu, kAbandoned * alone_cpu / 4 + alone_cpu + 0.5) << "the abandoned diffs were computed";

  // A ZeroMQ client that goes away (the CLI timed out or was interrupted)
  // disconnects: its diff stops too.
  {
    zmq::context_t context;
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 5000);  // the request leaves before the socket closes
    dealer.connect(d->query());
    flatbuffers::FlatBufferBuilder b;
    wire::FinishEnvelope(b, wire::CreateDiffRequest(b, b.CreateString("ref"), b.CreateString("other"), -1,
                                                    false, 0, 0));
    ASSERT_TRUE(dealer.send(zmq::const_buffer(b.GetBufferPointer(), b.GetSize()), zmq::send_flags::none));
  }  // closed without reading the answer
  for (int i = 0; i < 100 && Metric(*d, "opguard_queries_cancelled_total{reason=\"client_gone\"}") < kAbandoned + 1; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(Metric(*d, "opguard_queries_cancelled_total{reason=\"client_gone\"}"), kAbandoned + 1);
  EXPECT_EQ(Metric(*d, "opguard_queries_cancelled_total{reason=\"time_budget\"}"), 0);
  StopCleanly(*d);
}

// A query that runs past query.time_budget stops with an error that names
// the budget, on every face; the daemon goes on answering.
TEST_F(LimitsTest, AQueryPastItsTimeBudgetStopsWithAClearError) {
  auto d = StartDaemon({"--query.time-budget", "1ms"});
  ASSERT_TRUE(d->Running());
  RecordTwinRuns(*d, 100000);
  auto r = testing::HttpGet(d->http(), "/api/diff?reference=ref&suspect=sus", 60s);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"], "query exceeded its time budget of 1 ms") << r->body;

  DaemonClient client(d->query(), 60s);
  flatbuffers::FlatBufferBuilder diff;
  wire::FinishEnvelope(diff, wire::CreateDiffRequest(diff, diff.CreateString("ref"), diff.CreateString("sus"),
                                                     -1, false, 0, 0));
  auto answer = client.Call(diff);
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().message(), "query exceeded its time budget of 1 ms");
  // Counted once the aligner job has answered: the answer can arrive first.
  for (int i = 0; i < 100 && Metric(*d, "opguard_queries_cancelled_total{reason=\"time_budget\"}") < 2; ++i) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(Metric(*d, "opguard_queries_cancelled_total{reason=\"time_budget\"}"), 2);
  EXPECT_EQ(Metric(*d, "opguard_queries_cancelled_total{reason=\"client_gone\"}"), 0);
  EXPECT_TRUE(client.Status().ok());
  StopCleanly(*d);
}

// What a client saw on one HTTP connection: the status of each answer and
// whether (and after how long) the daemon closed it.
struct Exchange {
  std::string bytes;
  std::vector<int> statuses;
  bool closed = false;
  double seconds = 0;
};

// Reads from `fd` into `*exchange` until the daemon closes, `answers`
// answers have come (0: wait for the close), or `limit` passes.
void ReadAnswers(int fd, size_t answers, std::chrono::milliseconds limit, Exchange* exchange) {
  const auto start = Clock::now(), deadline = start + limit;
  std::string& bytes = exchange->bytes;
  char buf[16384];
  while (answers == 0 || exchange->statuses.size() < answers) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      exchange->closed = true;
      break;
    }
    bytes.append(buf, static_cast<size_t>(n));
    // Every answer starts with its status line (the bodies are JSON).
    exchange->statuses.clear();
    for (size_t at = bytes.find("HTTP/1.1 "); at != std::string::npos;
         at = bytes.find("HTTP/1.1 ", at + 1)) {
      if (at + 12 <= bytes.size()) exchange->statuses.push_back(std::stoi(bytes.substr(at + 9, 3)));
    }
  }
  exchange->seconds = std::chrono::duration<double>(Clock::now() - start).count();
}

// A client may half-close its connection once it has sent its request and
// still read the answer (the HTTP fuzzer does). On a request the aligner
// answers, the daemon's hang-up watch read that end of stream; the session
// then either dropped the answer (when it was ready first) or wrote it and
// waited for another request that could never come: Asio reports an end of
// stream once, so the next read sat until the 30 s idle timeout. Each such
// connection now gets its answer and is closed at once.
TEST_F(LimitsTest, AHalfClosedConnectionGetsItsAnswerAndIsClosed) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  const std::string diff =
      "GET /api/diff?reference=ref&suspect=missing HTTP/1.1\r\nHost: localhost\r\n\r\n";
  const std::string status = "GET /api/status HTTP/1.1\r\nHost: localhost\r\n\r\n";

  // Keep-alive: a watched request answered with an error, then another
  // request on the same connection, answered at once.
  {
    const int fd = testing::ConnectTcp(d->http());
    ASSERT_GE(fd, 0);
    Exchange e;
    ASSERT_EQ(::send(fd, diff.data(), diff.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(diff.size()));
    ReadAnswers(fd, 1, 5s, &e);
    ASSERT_EQ(e.statuses, std::vector<int>{404});
    ASSERT_EQ(::send(fd, status.data(), status.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(status.size()));
    ReadAnswers(fd, 2, 5s, &e);
    ::close(fd);
    EXPECT_EQ(e.statuses, (std::vector<int>{404, 200}));
    EXPECT_FALSE(e.closed);
  }

  // Half-closed: the answer and the close, well before the idle timeout.
  // The query's answer and the watch's end of stream race; many connections
  // see both orders.
  int answered = 0, closed_soon = 0;
  constexpr int kConnections = 60;
  for (int i = 0; i < kConnections; ++i) {
    const std::string bytes =
        i % 2 == 0 ? diff : diff + status;  // odd ones pipeline a second request
    const int fd = testing::ConnectTcp(d->http());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    ::shutdown(fd, SHUT_WR);
    Exchange e;
    ReadAnswers(fd, 0, 5s, &e);
    ::close(fd);
    answered += !e.statuses.empty();
    // The diff's own answer, or the error of the query the end of stream
    // cancelled (the client may have gone).
    const bool result = !e.statuses.empty() && e.statuses.front() == 404;
    const bool cancelled = !e.statuses.empty() && e.statuses.front() == 503 &&
                           e.bytes.find("query cancelled: its client went away") != std::string::npos;
    EXPECT_TRUE(result || cancelled) << e.bytes;
    closed_soon += e.closed;
    EXPECT_TRUE(e.closed) << "connection " << i << " still open after " << e.seconds << " s";
  }
  EXPECT_EQ(answered, kConnections) << "half-closed connections whose diff was not answered";
  EXPECT_EQ(closed_soon, kConnections);
  // The daemon serves on.
  auto r = testing::HttpGet(d->http(), "/api/status", 5s);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 200);
  StopCleanly(*d);
}

// Sends `request` on a fresh connection to the daemon's HTTP port and
// returns what comes back until the daemon closes (or 10 s pass).
std::string RawHttp(testing::DaemonProcess& d, const std::string& request) {
  const int fd = testing::ConnectTcp(d.http());
  if (fd < 0) return "no connection";
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the daemon may answer and close before reading it all
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string reply;
  const auto deadline = Clock::now() + 10s;
  char buffer[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return reply;
}

int StatusOf(const std::string& reply) {
  return reply.rfind("HTTP/1.", 0) == 0 && reply.size() > 12 ? std::atoi(reply.c_str() + 9) : -1;
}

// A page of another site whose name was made to resolve to 127.0.0.1 (DNS
// rebinding) reached the tokenless loopback API: any Host was answered.
// Now only addresses, localhost, this node's name and http.host_names are.
TEST_F(LimitsTest, HttpAnswersOnlyHostsThatNameTheDaemon) {
  auto d = StartDaemon({"--http.host-names", "viewer.internal"});
  ASSERT_TRUE(d->Running());
  const std::string port = d->http().substr(d->http().rfind(':') + 1);
  auto get = [&](const std::string& host_line) {
    return StatusOf(RawHttp(*d, "GET /api/runs HTTP/1.1\r\n" + host_line + "Connection: close\r\n\r\n"));
  };
  for (const std::string& host : std::vector<std::string>{"evil.example", "evil.example:" + port, "EVIL.example.", "localhost.evil.example",
                                 "127.0.0.1.nip.io:" + port, "[::1", "localhost:http"}) {
    EXPECT_EQ(get("Host: " + host + "\r\n"), 421) << host;
  }
  for (const std::string& host : std::vector<std::string>{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST", "[::1]:" + port,
                                 "viewer.internal:" + port, "Viewer.Internal", "app.localhost"}) {
    EXPECT_EQ(get("Host: " + host + "\r\n"), 200) << host;
  }
  EXPECT_EQ(StatusOf(RawHttp(*d, "GET /api/runs HTTP/1.0\r\n\r\n")), 200) << "no Host: not a browser";
  const std::string reply = RawHttp(*d, "GET /metrics HTTP/1.1\r\nHost: rebound.example\r\n\r\n");
  EXPECT_EQ(StatusOf(reply), 421);
  EXPECT_NE(reply.find("does not name this daemon"), std::string::npos) << reply;
  EXPECT_EQ(Metric(*d, "opguard_http_misdirected_total"), 8);
  StopCleanly(*d);
}

// An oversized URL or header used to close the connection with no answer.
TEST_F(LimitsTest, OversizedUrlsAndHeadersAreAnswered) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  const std::string host = "Host: " + d->http() + "\r\n";
  EXPECT_EQ(StatusOf(RawHttp(*d, "GET /api/runs?x=" + std::string(20000, 'a') + " HTTP/1.1\r\n" + host + "\r\n")),
            414);
  EXPECT_EQ(StatusOf(RawHttp(*d, "GET /api/runs HTTP/1.1\r\n" + host + "X-Big: " + std::string(20000, 'b') +
                                     "\r\n\r\n")),
            431);
  EXPECT_EQ(StatusOf(RawHttp(*d, "GET /api/runs HTTP/1.1\r\n" + host + "Connection: close\r\n\r\n")), 200);
  StopCleanly(*d);
}

// A 60 MB source file sent over ingest used to be stored whole. Source
// files above ingest.max_source_bytes (1 MiB, the shim's default) are not
// stored; the rest of their batch is, and the answer is Durable.
TEST_F(LimitsTest, SourceFilesOverTheLimitAreNotStoredButTheirBatchIs) {
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  BatchOptions o;
  o.announce = o.definitions = true;
  o.sources = {{"/src/huge.py", std::string(2u << 20, '#')}, {"/src/small.py", "x = 1\n"}};
  EXPECT_EQ(Ack(*d, testing::MakeBatch("sources", 0, 1, 0, 0, 10, o)), "durable");
  EXPECT_EQ(Run(*d, "sources")["ops"], 10);
  auto source = [&](const std::string& run, const std::string& file) {
    auto r = testing::HttpGet(d->http(), "/api/source?run=" + run + "&file=%2Fsrc%2F" + file);
    return r.ok() ? r->status : -1;
  };
  EXPECT_EQ(source("sources", "huge.py"), 404);
  EXPECT_EQ(source("sources", "small.py"), 200);
  EXPECT_EQ(Metric(*d, "opguard_sources_refused_total"), 1);
  StopCleanly(*d);
  // The limit is a setting.
  d = StartDaemon({"--ingest.max-source-bytes", "4MiB"});
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(Ack(*d, testing::MakeBatch("sources2", 0, 1, 0, 0, 10, o)), "durable");
  EXPECT_EQ(source("sources2", "huge.py"), 200);
  StopCleanly(*d);
}

// 20 connections trickling a request a byte at a time (slowloris) against
// 8 connection slots used to hold every slot for 30 s, and /healthz waited
// in the kernel's backlog behind them. At the cap the connection that has
// waited longest for its request is now closed, and a request must arrive
// whole within 10 s.
TEST_F(LimitsTest, SlowlorisConnectionsDoNotKeepHealthzWaiting) {
  auto d = StartDaemon({"--http.max-connections", "8"});
  ASSERT_TRUE(d->Running());
  std::vector<int> slow;
  for (int i = 0; i < 20; ++i) {
    const int fd = testing::ConnectTcp(d->http());
    ASSERT_GE(fd, 0);
    const std::string start = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
    (void)::send(fd, start.data(), start.size(), MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (int round = 0; round < 120 && !done; ++round) {  // at most 12 s
      for (int fd : slow) (void)::send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(100ms);
    }
  });
  int answered = 0;
  for (int i = 0; i < 5; ++i) {
    auto health = testing::HttpGet(d->http(), "/healthz", 5s);
    answered += health.ok() && health->status == 200;
  }
  done = true;
  trickle.join();
  for (int fd : slow) ::close(fd);
  EXPECT_EQ(answered, 5) << "/healthz waited behind trickling connections";
  EXPECT_GT(Metric(*d, "opguard_http_evicted_total"), 0);
  StopCleanly(*d);
}

}  // namespace
}  // namespace opguard::daemon
