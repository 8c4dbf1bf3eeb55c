// The cost of libopguard_nccl.so with OPGUARD unset. The binary links the
// interposer ahead of the stand-in libnccl.so.2 (as LD_PRELOAD would put it),
// so ncclX goes through the interposer while pncclX, NCCL's profiling name
// of the very same function, does not: each pair of cases is the same call
// with and without the interposer, measured in the same run.
//   interposed/direct for AllReduce (one float, one rank: the stand-in's
//   cheapest collective) and for an empty GroupStart/GroupEnd pair (almost
//   nothing but the call itself: the worst case for the ratio).
#include <benchmark/benchmark.h>
#include <nccl.h>

#include <cstdlib>

namespace {

ncclComm_t Comm() {
  static ncclComm_t comm = [] {
    ncclUniqueId id;
    ncclComm_t c = nullptr;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&c, 1, id, 0) != ncclSuccess)
      std::abort();
    return c;
  }();
  return comm;
}

template <bool kInterposed>
void BM_AllReduce(benchmark::State& state) {
  if (std::getenv("OPGUARD") != nullptr) state.SkipWithError("run with OPGUARD unset");
  auto all_reduce = kInterposed ? &ncclAllReduce : &pncclAllReduce;
  float x = 1.0f, y = 0.0f;
  ncclComm_t comm = Comm();
  for (auto _ : state) {
    benchmark::DoNotOptimize(all_reduce(&x, &y, 1, ncclFloat32, ncclSum, comm, nullptr));
  }
}

template <bool kInterposed>
void BM_EmptyGroup(benchmark::State& state) {
  auto start = kInterposed ? &ncclGroupStart : &pncclGroupStart;
  auto end = kInterposed ? &ncclGroupEnd : &pncclGroupEnd;
  for (auto _ : state) {
    benchmark::DoNotOptimize(start());
    benchmark::DoNotOptimize(end());
  }
}

BENCHMARK(BM_AllReduce<false>)->Name("AllReduce/direct")->MinTime(1.0);
BENCHMARK(BM_AllReduce<true>)->Name("AllReduce/interposed_off")->MinTime(1.0);
BENCHMARK(BM_EmptyGroup<false>)->Name("EmptyGroup/direct")->MinTime(1.0);
BENCHMARK(BM_EmptyGroup<true>)->Name("EmptyGroup/interposed_off")->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
