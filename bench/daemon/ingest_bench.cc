// daemon_ingest: sustained ingest into a real opguardd (local mode,
// RocksDB with synced group commits) from N sending ranks on this machine.
// Prints records/s, bytes on disk per record and the daemon's peak RSS.
//
//   daemon_ingest [--ranks 8] [--seconds 20] [--ops-per-batch 1024]
//                       [--window 32] [--opguardd PATH] [--cheap-senders]
//                       [--daemon-arg ARG]... [--json]
//   daemon_ingest --loadgen PATH [--loadgen-ops N] [--loadgen-rate R] [--null-sink] [--json]
//
// By default the senders build every batch (like the shim or opguard-loadgen
// would) on the same cores as the daemon, so the figure is end-to-end for one
// node. --cheap-senders patches one prebuilt batch per rank instead, which
// leaves (nearly) both cores to the daemon: its own capacity. --loadgen PATH
// drives the daemon with opguard-loadgen (the real shim) instead; with
// --null-sink no daemon runs at all: this process acknowledges every batch as
// it arrives (no verification, no storage), which measures what the loadgen
// ranks and their shims cost on their own (their CPU seconds are printed in
// every --loadgen mode). --loadgen-rate R paces each rank at R ops/s (as a
// training job would) instead of recording all its ops at once: then the
// question is whether the offered rate is acknowledged in time, and the shims'
// staging buffers stay small (a burst makes every rank stage its whole trace,
// and first-touching that memory is a large part of the loadgen CPU).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <nlohmann/json.hpp>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

using namespace opguard::daemon;
using namespace std::chrono;

namespace {
// CPU seconds of the terminated and waited-for descendants of this process.
double ChildrenCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// A stand-in for the daemon that stores nothing: acknowledges each batch
// Durable as soon as it arrives, so the senders run as fast as their own CPU
// allows. The envelope is trusted (our own loadgen), not verified.
class NullSink {
 public:
  explicit NullSink(const std::string& endpoint) : socket_(context_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::rcvhwm, 1000);
    socket_.set(zmq::sockopt::sndhwm, 100000);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~NullSink() {
    stop_ = true;
    thread_.join();
  }

 private:
  void Loop() {
    std::vector<zmq::message_t> frames;
    opguard::wire::AlignedStorage aligned;
    while (!stop_) {
      zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      frames.clear();
      if (!zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait))
        continue;
      if (frames.size() < 2) continue;
      const auto& payload = frames.back();
      aligned.resize(payload.size() / 8 + 1);
      std::memcpy(aligned.data(), payload.data(), payload.size());
      const auto* batch = opguard::wire::GetEnvelope(aligned.data())->message_as_Batch();
      if (batch == nullptr) continue;
      flatbuffers::FlatBufferBuilder b(256);
      auto run = b.CreateString(batch->run() ? batch->run()->str() : std::string());
      opguard::wire::AckBuilder ab(b);
      ab.add_run(run);
      ab.add_rank(batch->rank());
      ab.add_session(batch->session());
      ab.add_seq(batch->seq());
      ab.add_code(opguard::wire::AckCode::Durable);
      opguard::wire::FinishEnvelope(b, ab.Finish());
      (void)socket_.send(frames[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      (void)socket_.send(zmq::const_buffer(b.GetBufferPointer(), b.GetSize()),
                         zmq::send_flags::dontwait);
    }
  }

  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  int ranks = 8, seconds = 20, window = 32;
  uint32_t ops_per_batch = 1024;
  std::string binary = OPGUARDD_PATH;
  bool json = false, cheap = false, null_sink = false;
  std::vector<std::string> daemon_args;
  std::string loadgen;
  uint64_t loadgen_ops = 200000;
  uint64_t loadgen_rate = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--ranks") ranks = std::stoi(next());
    else if (a == "--seconds") seconds = std::stoi(next());
    else if (a == "--ops-per-batch") ops_per_batch = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--window") window = std::stoi(next());
    else if (a == "--opguardd") binary = next();
    else if (a == "--json") json = true;
    else if (a == "--cheap-senders") cheap = true;
    else if (a == "--daemon-arg") daemon_args.push_back(next());
    else if (a == "--loadgen") loadgen = next();
    else if (a == "--loadgen-ops") loadgen_ops = std::stoull(next());
    else if (a == "--loadgen-rate") loadgen_rate = std::stoull(next());
    else if (a == "--null-sink") null_sink = true;
    else {
      std::fprintf(stderr, "usage: daemon_ingest [--ranks N] [--seconds S] [--ops-per-batch N] "
                           "[--window N] [--opguardd PATH] [--cheap-senders] [--daemon-arg ARG]... "
                           "[--loadgen PATH [--loadgen-ops N] [--loadgen-rate R] [--null-sink]] [--json]\n");
      return 2;
    }
  }
  const std::string loadgen_args =
      " --run bench --ranks " + std::to_string(ranks) + " --ops " + std::to_string(loadgen_ops) +
      (loadgen_rate != 0 ? " --rate " + std::to_string(loadgen_rate) : std::string()) +
      " --collective-every 500 --json 2>/dev/null";
  testing::TempDir dir;
  if (null_sink) {
    if (loadgen.empty()) {
      std::fprintf(stderr, "daemon_ingest: --null-sink needs --loadgen\n");
      return 2;
    }
    const std::string endpoint = "ipc://" + dir.path() + "/null.sock";
    testing::CommandResult out;
    const double cpu_before = ChildrenCpuSeconds();
    {
      NullSink sink(endpoint);
      out = testing::RunCommand(loadgen + " --endpoint " + endpoint + loadgen_args, 600);
    }
    const double loadgen_cpu = ChildrenCpuSeconds() - cpu_before;
    auto brace = out.output.find('{');
    auto doc = brace == std::string::npos
                   ? nlohmann::json()
                   : nlohmann::json::parse(out.output.substr(brace), nullptr, false);
    if (out.exit_code != 0 || doc.is_discarded() || !doc.contains("records_acked")) {
      std::fprintf(stderr, "daemon_ingest: opguard-loadgen failed (%d): %s\n", out.exit_code,
                   out.output.c_str());
      return 1;
    }
    const double records = doc["records_acked"].get<double>(), secs = doc["seconds"].get<double>();
    if (json) {
      std::printf(
          "{\"null_sink\": true, \"loadgen\": true, \"ranks\": %d, \"seconds\": %.2f, \"records\": "
          "%.0f, "
          "\"records_per_s\": %.0f, \"loadgen_cpu_s\": %.2f}\n",
          ranks, secs, records, secs > 0 ? records / secs : 0, loadgen_cpu);
    } else {
      std::printf(
          "opguard-loadgen into a null sink (%d ranks x %llu ops, every batch acked on arrival)\n",
          ranks, static_cast<unsigned long long>(loadgen_ops));
      std::printf("  records acked      %.0f in %.2f s\n", records, secs);
      std::printf("  records/s          %.0f\n", secs > 0 ? records / secs : 0);
      std::printf("  loadgen CPU        %.2f s (%.2f s per million records)\n", loadgen_cpu,
                  records > 0 ? loadgen_cpu * 1e6 / records : 0);
    }
    return 0;
  }
  testing::DaemonProcess daemon(binary, dir.path(), daemon_args);
  auto st = daemon.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "daemon_ingest: %s\n", st.message().c_str());
    return 1;
  }
  if (!loadgen.empty()) {
    // The real shim path: opguard-loadgen's forked ranks through libopguard_shim.
    const double loadgen_cpu_before = ChildrenCpuSeconds();
    auto out = testing::RunCommand(loadgen + " --endpoint " + daemon.ingest() + loadgen_args, 600);
    const double loadgen_cpu = ChildrenCpuSeconds() - loadgen_cpu_before;
    const uint64_t peak_rss = daemon.PeakRssBytes();
    const double cpu = testing::ProcessCpuSeconds(daemon.pid());
    auto metrics = testing::HttpGet(daemon.http(), "/metrics");
    auto metric = [&](const std::string& name) -> double {
      if (!metrics.ok()) return 0;
      auto pos = metrics->body.find("\n" + name + " ");
      return pos == std::string::npos ? 0 : std::strtod(metrics->body.c_str() + pos + name.size() + 2, nullptr);
    };
    const double batches = metric("opguard_batches_total{result=\"durable\"}");
    const double wire_bytes = metric("opguard_ingest_bytes_total");
    const int code = daemon.Stop();
    uint64_t disk = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(daemon.data_dir())) {
      if (e.is_regular_file()) disk += e.file_size();
    }
    auto brace = out.output.find('{');
    auto doc = brace == std::string::npos
                   ? nlohmann::json()
                   : nlohmann::json::parse(out.output.substr(brace), nullptr, false);
    const double dropped = doc.is_object() ? doc.value("records_dropped", 0.0) : 0.0;
    // A paced run whose shims had to drop records (buffers full: the offered
    // rate was not taken) is a result, reported below; anything else is not.
    if ((out.exit_code != 0 && dropped == 0) || doc.is_discarded() ||
        !doc.contains("records_acked")) {
      std::fprintf(stderr, "daemon_ingest: opguard-loadgen failed (%d): %s\n", out.exit_code,
                   out.output.c_str());
      return 1;
    }
    const double records = doc["records_acked"].get<double>(), seconds = doc["seconds"].get<double>();
    if (json) {
      std::printf("{\"cheap_senders\": false, \"loadgen\": true, \"ranks\": %d, \"seconds\": %.2f, "
                  "\"records\": %.0f, \"records_per_s\": %.0f, \"records_dropped\": %.0f, "
                  "\"bytes_per_record\": %.1f, "
                  "\"peak_rss_bytes\": %llu, \"daemon_cpu_s\": %.2f, \"loadgen_cpu_s\": %.2f, \"daemon_exit\": %d}\n",
                  ranks, seconds, records, seconds > 0 ? records / seconds : 0, dropped,
                  records > 0 ? disk / records : 0, static_cast<unsigned long long>(peak_rss), cpu,
                  loadgen_cpu, code);
      return code == 0 ? 0 : 1;
    }
    std::printf("daemon ingest via opguard-loadgen (%d ranks x %llu ops, durable acks)\n", ranks,
                static_cast<unsigned long long>(loadgen_ops));
    std::printf("  records acked      %.0f in %.2f s (%.0f batches, %.0f wire bytes/record)\n", records, seconds,
                batches, records > 0 ? wire_bytes / records : 0);
    std::printf("  records/s          %.0f   (target >= 1000000)\n", seconds > 0 ? records / seconds : 0);
    std::printf("  records dropped    %.0f (shim buffers full)\n", dropped);
    std::printf("  bytes on disk      %.1f per record (after flush)\n", records > 0 ? disk / records : 0);
    std::printf("  daemon peak RSS    %.1f MiB   (target < 1024)\n", peak_rss / 1048576.0);
    std::printf("  daemon CPU         %.2f s (%.2f s per million records)\n", cpu,
                records > 0 ? cpu * 1e6 / records : 0);
    std::printf("  loadgen CPU        %.2f s (%.2f s per million records)\n", loadgen_cpu,
                records > 0 ? loadgen_cpu * 1e6 / records : 0);
    return code == 0 ? 0 : 1;
  }
  std::vector<std::unique_ptr<testing::RankSender>> senders;
  for (int r = 0; r < ranks; ++r) {
    testing::BatchOptions options;
    options.steps_every = 1000;
    options.collectives_every = 500;
    options.reuse_template = cheap;
    senders.push_back(std::make_unique<testing::RankSender>(daemon.ingest(), "bench", r, 1000 + r,
                                                            ops_per_batch, options));
  }
  const auto start = steady_clock::now();
  const auto deadline = start + std::chrono::seconds(seconds);
  std::vector<std::thread> threads;
  for (auto& s : senders) {
    threads.emplace_back([&s, deadline, window] { (void)s->Run(UINT64_MAX / 2, deadline, window); });
  }
  for (auto& t : threads) t.join();
  const double elapsed = duration<double>(steady_clock::now() - start).count();
  uint64_t records = 0;
  for (auto& s : senders) records += s->ops_acked();
  const uint64_t peak_rss = daemon.PeakRssBytes();
  const double cpu = testing::ProcessCpuSeconds(daemon.pid());
  const int code = daemon.Stop();  // flushes memtables: what stays on disk is SSTs
  uint64_t disk = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(daemon.data_dir())) {
    if (e.is_regular_file()) disk += e.file_size();
  }
  const double rate = records / elapsed;
  const double per_record = records ? static_cast<double>(disk) / records : 0;
  if (json) {
    std::printf("{\"cheap_senders\": %s, \"ranks\": %d, \"seconds\": %.1f, \"records\": %llu, \"records_per_s\": %.0f, "
                "\"bytes_per_record\": %.1f, \"peak_rss_bytes\": %llu, \"daemon_cpu_s\": %.2f, \"daemon_exit\": %d}\n",
                cheap ? "true" : "false", ranks, elapsed, static_cast<unsigned long long>(records), rate, per_record,
                static_cast<unsigned long long>(peak_rss), cpu, code);
  } else {
    std::printf("daemon ingest (%d ranks, %u ops/batch, durable acks, %s senders, %.1f s)\n", ranks,
                ops_per_batch, cheap ? "template-patching" : "batch-building", elapsed);
    std::printf("  records acked      %llu\n", static_cast<unsigned long long>(records));
    std::printf("  records/s          %.0f   (target >= 1000000)\n", rate);
    std::printf("  bytes on disk      %.1f per record (%.1f MiB total, after flush)\n", per_record, disk / 1048576.0);
    std::printf("  daemon peak RSS    %.1f MiB   (target < 1024)\n", peak_rss / 1048576.0);
    std::printf("  daemon CPU         %.2f s (%.2f s per million records)\n", cpu,
                records ? cpu * 1e6 / static_cast<double>(records) : 0);
    std::printf("  daemon exit code   %d\n", code);
  }
  return code == 0 ? 0 : 1;
}
