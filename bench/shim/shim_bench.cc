// shim_bench: what a record costs the training thread, and how many records
// per second reach a receiving peer on this machine. Uses the real C API of
// libopguard_shim.so with OPGUARD=1 and a fake daemon (ZeroMQ ROUTER that
// verifies, stores counts and acknowledges) on an ipc:// endpoint.
//
// Reported:
//   BM_RecordOp          median_ns: median per-record cost on the calling
//                        thread (blocks of 32 calls timed, fingerprint
//                        already computed); items_per_second: calling-thread rate
//   BM_EndToEnd          items_per_second: records recorded, sent, stored and
//                        acknowledged per second
//   BM_RecordOpWithoutDaemon  worst_us: the slowest single call while the
//                        daemon is down (records queue, then drop; no call
//                        may wait on the network)
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "fake_daemon.h"
#include "opguard/shim.h"

namespace {

using Clock = std::chrono::steady_clock;
std::unique_ptr<opguard::shim::testing::FakeDaemon> g_daemon;

// A typical op: one tensor input, one scalar, one output with stats.
struct SampleOp {
  int64_t shape[3] = {8, 128, 1024};
  opguard_value in[2] = {};
  opguard_tensor out = {};
  opguard_op op = {};
  SampleOp() {
    in[0].kind = OPGUARD_VALUE_TENSOR;
    in[0].tensor.fp_lo = 0x1234;
    in[0].tensor.fp_hi = 0x5678;
    in[0].tensor.shape = shape;
    in[0].tensor.ndim = 3;
    in[0].tensor.dtype = OPGUARD_DTYPE_BFLOAT16;
    in[1].kind = OPGUARD_VALUE_SCALAR;
    in[1].scalar_dtype = OPGUARD_DTYPE_FLOAT32;
    in[1].scalar_bits = 0x3F800000;
    out = in[0].tensor;
    out.has_stats = 1;
    out.stats.max = 3.5;
    op.struct_size = sizeof(op);
    op.op_index = OPGUARD_AUTO;
    op.name = opguard_intern("aten::linear", 12);
    op.site = opguard_site("model.py", 80, "Attention.forward");
    op.num_inputs = 2;
    op.inputs = in;
    op.num_outputs = 1;
    op.outputs = &out;
  }
};

void BM_RecordOp(benchmark::State& state) {
  SampleOp s;
  s.op.lane = static_cast<uint32_t>(state.thread_index());
  constexpr int kBlock = 32;
  std::vector<double> block_ns;
  block_ns.reserve(1 << 20);
  uint64_t n = 0;
  int bad = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    for (int i = 0; i < kBlock; ++i) {
      s.out.fp_lo = n + i;
      bad += opguard_record_op(&s.op, nullptr) != OPGUARD_OK;
    }
    auto t1 = Clock::now();
    block_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / kBlock);
    n += kBlock;
  }
  std::nth_element(block_ns.begin(), block_ns.begin() + block_ns.size() / 2, block_ns.end());
  state.counters["median_ns"] = block_ns.empty() ? 0 : block_ns[block_ns.size() / 2];
  state.counters["not_ok"] = bad;
  state.SetItemsProcessed(static_cast<int64_t>(n));
  if (state.thread_index() == 0) opguard_flush(30000);  // drain before the next benchmark
}
BENCHMARK(BM_RecordOp)->MinTime(2.0)->UseRealTime();
BENCHMARK(BM_RecordOp)->MinTime(2.0)->Threads(2)->UseRealTime();

void BM_EndToEnd(benchmark::State& state) {
  SampleOp s;
  const int64_t per_iteration = state.range(0);
  uint64_t records = 0;
  int not_acked = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < per_iteration; ++i) {
      s.out.fp_lo = records + i;
      opguard_record_op(&s.op, nullptr);
    }
    // Counted as done only once the peer acknowledged everything.
    not_acked += opguard_flush(60000) != OPGUARD_OK;
    records += per_iteration;
  }
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  opguard_get_counters(&c);
  state.counters["not_acked"] = not_acked;
  state.counters["dropped"] = static_cast<double>(c.records_dropped);
  state.counters["bytes_per_record"] =
      c.records_sent ? static_cast<double>(c.bytes_sent) / static_cast<double>(c.records_sent) : 0;
  state.SetItemsProcessed(static_cast<int64_t>(records));
}
BENCHMARK(BM_EndToEnd)->Arg(200000)->MinTime(3.0)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_RecordOpWithoutDaemon(benchmark::State& state) {
  SampleOp s;
  g_daemon->Stop();
  Clock::duration worst{};
  uint64_t n = 0;
  for (auto _ : state) {
    s.out.fp_lo = n++;
    auto t0 = Clock::now();
    benchmark::DoNotOptimize(opguard_record_op(&s.op, nullptr));
    worst = std::max(worst, Clock::now() - t0);
  }
  state.counters["worst_us"] = std::chrono::duration<double, std::micro>(worst).count();
  state.SetItemsProcessed(static_cast<int64_t>(n));
  g_daemon->Start();
  opguard_flush(60000);
}
BENCHMARK(BM_RecordOpWithoutDaemon)->Iterations(200000)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  char tmpl[] = "/tmp/opguard-shim-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  std::string endpoint = std::string("ipc://") + tmpl + "/ingest.sock";
  opguard::shim::testing::FakeDaemonOptions options;
  options.keep_records = false;
  g_daemon = std::make_unique<opguard::shim::testing::FakeDaemon>(endpoint, options);
  if (!g_daemon->Start()) return 1;
  // The shim reads its configuration on the first call.
  setenv("OPGUARD", "1", 1);
  setenv("OPGUARD_RUN", "shim-bench", 1);
  setenv("OPGUARD_ENDPOINT", endpoint.c_str(), 1);
  setenv("OPGUARD_BUFFER_MB", "2048", 0);
  if (opguard_init() != 1) return 1;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  opguard_shutdown(10000);
  g_daemon->Stop();
  std::filesystem::remove_all(tmpl);
  return 0;
}
