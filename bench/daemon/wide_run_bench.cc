// daemon_wide_run: ack latency of one rank's batches in a run with many
// ranks. A group commit publishes what it changed to the run registry; when
// that was a copy of the whole run, every batch paid for every rank
// (20 000 ranks: 10 -> 48 ms per ack).
//
//   daemon_wide_run [--ranks 20000] [--batches 200] [--opguardd PATH] [--daemon-arg ARG]...
//
// Fills run "wide" with one small batch per rank (pipelined), then sends
// `batches` one-op batches of rank 0 one at a time and prints the median and
// 90th percentile of send -> durable ack, and the daemon's CPU per batch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "opguard/daemon/testing/batch_maker.h"

using namespace opguard::daemon;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  uint32_t ranks = 20000, batches = 200;
  std::string opguardd = OPGUARDD_PATH;
  std::vector<std::string> daemon_args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--ranks")
      ranks = static_cast<uint32_t>(std::stoul(value));
    else if (a == "--batches")
      batches = static_cast<uint32_t>(std::stoul(value));
    else if (a == "--opguardd")
      opguardd = value;
    else if (a == "--daemon-arg")
      daemon_args.push_back(value);
    else {
      std::fprintf(stderr,
                   "usage: daemon_wide_run [--ranks N] [--batches N] [--opguardd PATH] "
                   "[--daemon-arg ARG]...\n");
      return 2;
    }
    ++i;
  }
  testing::TempDir dir;
  testing::DaemonProcess daemon(opguardd, dir.path(), daemon_args);
  if (auto st = daemon.Start(); !st.ok()) {
    std::fprintf(stderr, "daemon_wide_run: %s\n", st.message().c_str());
    return 1;
  }
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 30000);
  socket.connect(daemon.ingest());
  auto ack = [&socket]() {
    zmq::message_t reply;
    if (!socket.recv(reply)) return std::string("no ack within 30 s");
    return testing::DescribeAck(std::string(static_cast<const char*>(reply.data()), reply.size()));
  };

  // One batch per rank, at most 256 unacknowledged.
  uint32_t sent = 0, acked = 0;
  while (acked < ranks) {
    while (sent < ranks && sent - acked < 256) {
      (void)socket.send(zmq::buffer(testing::MakeBatch("wide", sent, 1000 + sent, 0, 0, 1, {})));
      ++sent;
    }
    if (std::string a = ack(); a != "durable") {
      std::fprintf(stderr, "daemon_wide_run: rank batch: %s\n", a.c_str());
      return 1;
    }
    ++acked;
  }

  std::vector<double> ms;
  const double cpu_before = testing::ProcessCpuSeconds(daemon.pid());
  for (uint32_t seq = 1; seq <= batches; ++seq) {
    const auto start = Clock::now();
    (void)socket.send(zmq::buffer(testing::MakeBatch("wide", 0, 1000, seq, seq, 1, {})));
    if (std::string a = ack(); a != "durable") {
      std::fprintf(stderr, "daemon_wide_run: batch %u: %s\n", seq, a.c_str());
      return 1;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  const double cpu = testing::ProcessCpuSeconds(daemon.pid()) - cpu_before;
  std::sort(ms.begin(), ms.end());
  std::printf("run of %u ranks, %u one-op batches of rank 0 one at a time:\n", ranks, batches);
  std::printf("  ack latency  median %.2f ms, p90 %.2f ms\n", ms[ms.size() / 2],
              ms[ms.size() * 9 / 10]);
  std::printf("  daemon CPU   %.2f ms per batch\n", cpu * 1e3 / batches);
  return daemon.Stop() == 0 ? 0 : 1;
}
