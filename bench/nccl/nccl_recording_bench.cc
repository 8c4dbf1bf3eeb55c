// The cost of recording an NCCL call: the same all-reduce through the
// interposer with OPGUARD=1 (records and host fingerprints of its buffers,
// sent to a fake daemon in this process) and directly (pncclAllReduce, not
// interposed), on the stand-in libnccl.so.2 with one rank, for 1 float and
// for 1 MiB. Separate from nccl_bench because the environment is read once
// per process.
#include <benchmark/benchmark.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "fake_daemon.h"
#include "opguard/shim.h"

namespace {

ncclComm_t Comm() {
  static ncclComm_t comm = [] {
    ncclUniqueId id;
    ncclComm_t c = nullptr;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&c, 1, id, 0) != ncclSuccess) {
      std::abort();
    }
    return c;
  }();
  return comm;
}

template <bool kInterposed>
void BM_AllReduce(benchmark::State& state) {
  auto all_reduce = kInterposed ? &ncclAllReduce : &pncclAllReduce;
  std::vector<float> in(static_cast<size_t>(state.range(0)), 1.5f), out(in.size());
  ncclComm_t comm = Comm();
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        all_reduce(in.data(), out.data(), in.size(), ncclFloat32, ncclSum, comm, nullptr));
  }
  state.SetBytesProcessed(state.iterations() * int64_t(in.size() * sizeof(float)));
  if (kInterposed) {
    opguard_counters c{};
    c.struct_size = sizeof(c);
    opguard_get_counters(&c);
    state.counters["dropped"] = double(c.records_dropped);
  }
}

BENCHMARK(BM_AllReduce<false>)->Name("AllReduce/direct")->Arg(1)->Arg(262144);
BENCHMARK(BM_AllReduce<true>)->Name("AllReduce/recording")->Arg(1)->Arg(262144);

}  // namespace

int main(int argc, char** argv) {
  auto dir = std::filesystem::temp_directory_path() /
             ("opguard-nccl-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string endpoint = "ipc://" + (dir / "ingest.sock").string();
  opguard::shim::testing::FakeDaemonOptions options;
  options.keep_records = false;
  opguard::shim::testing::FakeDaemon daemon(endpoint, options);
  if (!daemon.Start()) return 1;
  ::setenv("OPGUARD", "1", 1);
  ::setenv("OPGUARD_ENDPOINT", endpoint.c_str(), 1);
  ::setenv("OPGUARD_RUN", "nccl-bench", 1);
  ::setenv("OPGUARD_LOG_LEVEL", "error", 1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  opguard_shutdown(5000);
  daemon.Stop();
  std::filesystem::remove_all(dir);
  return 0;
}
