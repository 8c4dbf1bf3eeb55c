// CPU fingerprint throughput on 64 MiB and 1 GiB buffers, with memcpy and
// XXH3_128bits on the same buffers in the same run as the yardsticks
// (issue 3: >= 0.8x XXH3 single-threaded, near memory bandwidth with threads).
//   fingerprint_bench --benchmark_min_time=0.3
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fingerprint_internal.h"
#include "opguard/fingerprint/fingerprint.h"
#if OPGUARD_HAVE_XXHASH
#include <xxhash.h>
#endif

namespace {

using opguard::fingerprint::DType;

constexpr int64_t k1MiB = int64_t{1} << 20;
constexpr int64_t k64MiB = int64_t{64} << 20;
constexpr int64_t k1GiB = int64_t{1} << 30;

// One buffer per size, filled once with non-trivial bytes (pages touched).
const uint8_t* Buffer(int64_t size) {
  static std::map<int64_t, std::unique_ptr<uint8_t[]>> buffers;
  auto& b = buffers[size];
  if (!b) {
    b.reset(new uint8_t[size]);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < size; i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(b.get() + i, &x, 8);
    }
  }
  return b.get();
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t size = state.range(0);
  const uint8_t* src = Buffer(size);
  std::unique_ptr<uint8_t[]> dst(new uint8_t[size]);
  std::memset(dst.get(), 1, size);
  for (auto _ : state) {
    std::memcpy(dst.get(), src, size);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * size);
}

#if OPGUARD_HAVE_XXHASH
void BM_XXH3_128(benchmark::State& state) {
  const int64_t size = state.range(0);
  const uint8_t* src = Buffer(size);
  for (auto _ : state) {
    XXH128_hash_t h = XXH3_128bits(src, size);
    benchmark::DoNotOptimize(h);
  }
  state.SetBytesProcessed(state.iterations() * size);
}
#endif

// Fingerprints `size` bytes at `src` as float32 for as long as `state`
// asks. `isa`: 0 = the widest path the CPU runs (AVX-512 where it has it),
// 1 = scalar, 2 = AVX2.
void FingerprintLoop(benchmark::State& state, const uint8_t* src, int64_t size, int threads,
                     bool stats, int64_t isa) {
  const int64_t shape[] = {size / 4};
  opguard::fingerprint::internal::HostOptions o;
  o.threads = threads;
  o.stats = stats;
  using opguard::fingerprint::internal::Isa;
  constexpr Isa kIsas[] = {Isa::kAuto, Isa::kScalar, Isa::kAvx2};
  o.isa = kIsas[isa];
  for (auto _ : state) {
    auto f =
        opguard::fingerprint::internal::FingerprintHostWith({src, DType::kFloat32, shape, {}}, o);
    benchmark::DoNotOptimize(f);
  }
  state.SetBytesProcessed(state.iterations() * size);
}

// range(0): bytes of random bits; range(1): threads (0 = all cores);
// range(2): 1 = with statistics (fp32), 0 = digest only; range(3): the path.
void BM_Fingerprint(benchmark::State& state) {
  FingerprintLoop(state, Buffer(state.range(0)), state.range(0), static_cast<int>(state.range(1)),
                  state.range(2) != 0, state.range(3));
}

// Finite float32 values of a training tensor's magnitudes (the random bits
// above are full of NaNs and denormals, which take the statistics' slow
// path): what the adapter hashes each step, mostly from cache. range(0):
// bytes; range(1): 1 = with statistics; range(2): the path, as above.
const uint8_t* TrainingFloats(int64_t size) {
  static std::map<int64_t, std::unique_ptr<float[]>> buffers;
  auto& b = buffers[size];
  if (!b) {
    b.reset(new float[size / 4]);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int64_t i = 0; i < size / 4; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b[i] = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 - 0.5) * 0.02f;
    }
  }
  return reinterpret_cast<const uint8_t*>(b.get());
}

void BM_FingerprintTrainingFloats(benchmark::State& state) {
  FingerprintLoop(state, TrainingFloats(state.range(0)), state.range(0), /*threads=*/1,
                  state.range(1) != 0, state.range(2));
}

void TrainingArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "stats", "isa"});
  for (int64_t size : {int64_t{64} << 10, k1MiB, k64MiB}) {
    for (int64_t isa : {0, 2}) {
      b->Args({size, 0, isa});
      b->Args({size, 1, isa});
    }
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->Arg(k64MiB)->Arg(k1GiB)->Unit(benchmark::kMillisecond)->UseRealTime();
}

void FpArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "threads", "stats", "isa"});
  // 1 MiB stays in cache, as most tensors a training step hashes do: the
  // hash and the statistics alone, without memory's bound.
  for (int64_t isa : {0, 2}) {
    b->Args({k1MiB, 1, 0, isa});
    b->Args({k1MiB, 1, 1, isa});
  }
  for (int64_t size : {k64MiB, k1GiB}) {
    b->Args({size, 1, 0, 0});  // digest, one thread: the XXH3 comparison
    b->Args({size, 1, 0, 1});  // scalar path, for reference
    b->Args({size, 1, 1, 0});  // digest + fp32 statistics
    b->Args({size, 0, 0, 0});  // all cores
    b->Args({size, 0, 1, 0});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Memcpy)->Apply(Sizes);
#if OPGUARD_HAVE_XXHASH
BENCHMARK(BM_XXH3_128)->Apply(Sizes);
#endif
BENCHMARK(BM_Fingerprint)->Apply(FpArgs);
BENCHMARK(BM_FingerprintTrainingFloats)->Apply(TrainingArgs);

}  // namespace

BENCHMARK_MAIN();
