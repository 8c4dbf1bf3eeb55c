// Diff of two traces of N ops per rank: the suspect has 1% inserted ops and
// 1% locally reordered (adjacent swapped) ops and one divergence 90% of the
// way in, so the whole prefix is aligned and walked. Single-threaded.
//
//   aligner_bench                                  # 100k, 1M, 10M
//   aligner_bench --benchmark_filter=DiffRank/1000000
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>

#include "opguard/aligner/diff.h"

namespace opguard::aligner {
namespace {

struct Pairing {
  RankTrace ref, sus;
};

// Layers of 41 structures with an odd op now and then, like a transformer
// step: keys repeat with a short period, which is the hard case for anchors.
std::unique_ptr<Pairing> Generate(size_t n) {
  auto out = std::make_unique<Pairing>();
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> pct(0, 9999);
  auto& ref = out->ref.lanes.emplace_back().ops;
  auto& sus = out->sus.lanes.emplace_back().ops;
  ref.reserve(n);
  sus.reserve(n + n / 50);
  for (size_t i = 0; i < n; ++i) {
    OpEvent e;
    e.key = (i % 97 == 50) ? 1000 + i % 7 : 1 + i % 41;
    e.name = e.key;
    e.site = e.key;
    e.op_index = i;
    e.step = i / 100000;
    e.outputs = Fp128{i * 0x9e3779b97f4a7c15ULL, i};
    e.inputs = Fp128{i, 0};
    ref.push_back(e);
  }
  const size_t pivot = n - n / 10;
  uint64_t fresh = uint64_t{1} << 40;
  for (size_t i = 0; i < n; ++i) {
    if (pct(rng) < 100) {  // 1% inserted
      OpEvent x;
      x.key = x.name = x.site = fresh++;
      sus.push_back(x);
    }
    if (pct(rng) < 100 && i + 1 < n && i != pivot && i + 1 != pivot && ref[i].key != ref[i + 1].key) {
      sus.push_back(ref[i + 1]);  // 1% reordered (each swap moves two ops)
      sus.push_back(ref[i]);
      ++i;
      continue;
    }
    sus.push_back(ref[i]);
    if (i == pivot) sus.back().outputs.hi ^= 1;
  }
  for (size_t k = 0; k < sus.size(); ++k) sus[k].op_index = k;
  return out;
}

void BM_DiffRank(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::unique_ptr<Pairing> p = Generate(n);
  uint64_t windows = 0;
  for (auto _ : state) {
    Result<RankDiff> d = DiffRank(p->ref, p->sus, {});
    if (!d.ok() || d->status != DiffStatus::kDiverged ||
        d->first_divergence->reference.op_index != n - n / 10) {
      state.SkipWithError("wrong pivot");
      break;
    }
    windows = d->lanes[0].largest_window;
    benchmark::DoNotOptimize(d);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.counters["largest_window"] = static_cast<double>(windows);
}

BENCHMARK(BM_DiffRank)->Name("DiffRank")->Arg(100000)->Iterations(20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiffRank)->Name("DiffRank")->Arg(1000000)->Iterations(5)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiffRank)->Name("DiffRank")->Arg(10000000)->Iterations(2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace opguard::aligner

BENCHMARK_MAIN();
