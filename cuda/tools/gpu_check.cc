// GPU check of the fingerprint, built and run by scripts/gpu-check.sh on a
// machine with a GPU (no CMake, GoogleTest or benchmark library needed):
//   1. the committed vectors (fingerprint/testdata/vectors.txt) on the GPU;
//   2. GPU == CPU bits on random tensors of every dtype, 0 B to 1 GiB, at
//      aligned and misaligned addresses, single and batched launches;
//   3. a bandwidth table: GPU fingerprint vs device-to-device copy, the batch
//      of 1000 x 4 KiB tensors, and the CPU path beside XXH3-free memcpy.
// Exit status 0 only if every comparison matched.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fingerprint_testgen.h"
#include "fingerprint_vectors.h"
#include "opguard/fingerprint/fingerprint.h"
#include "opguard/fingerprint/fingerprint_cuda.h"

namespace fp = opguard::fingerprint;
using fp::cuda::ResultSlot;

namespace {

int failures = 0;
#define CUDA_OK(expr)                                                                             \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

struct Gpu {
  cudaStream_t stream;
  std::unique_ptr<fp::cuda::Fingerprinter> f;
  std::unique_ptr<fp::cuda::ResultCollector> c;
  ResultSlot* slots;
  uint8_t* buf;  // 1 GiB + 64
  size_t cap;
};

// Fills the device buffer with SplitMix64(seed) bytes, generated in parallel
// on the host in 64 MiB pieces (each piece its own seed: seed + piece).
void FillHost(std::vector<uint8_t>& h, uint64_t seed) {
  const uint64_t piece = 64u << 20;
  const uint64_t pieces = (h.size() + piece - 1) / piece;
  std::vector<std::thread> ts;
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned t = 0; t < n; ++t) {
    ts.emplace_back([&, t] {
      for (uint64_t p = t; p < pieces; p += n) {
        fp::testgen::FillBytes(seed + p, h.data() + p * piece,
                               std::min(piece, h.size() - p * piece));
      }
    });
  }
  for (auto& th : ts) th.join();
}

fp::Fingerprint OnGpu(Gpu& g, const fp::TensorView& v) {
  CUDA_OK(g.f->Enqueue(v, g.slots, g.stream));
  CUDA_OK(g.c->Collect(g.slots, 1, g.stream));
  CUDA_OK(g.c->Wait());
  return fp::cuda::ToFingerprint(g.c->results()[0]);
}

// Digest, counts, min and max must be identical; sum and l2 are fp64 folds
// in another order (docs/fingerprint.md), so only close — and not compared
// at all once squares overflowed (random fp64 bytes reach 1e308).
bool StatsClose(const fp::Stats& a, const fp::Stats& b) {
  if (!std::isfinite(b.l2)) return true;
  return std::fabs(a.sum - b.sum) <= 1e-4 * (1 + b.l2) &&
         std::fabs(a.l2 - b.l2) <= 1e-9 * (1 + b.l2);
}

bool Compare(const fp::Fingerprint& gpu, const fp::Fingerprint& cpu, const std::string& what) {
  const bool ok = gpu.digest == cpu.digest && gpu.stats.nan_count == cpu.stats.nan_count &&
                  gpu.stats.inf_count == cpu.stats.inf_count && gpu.stats.min == cpu.stats.min &&
                  gpu.stats.max == cpu.stats.max && StatsClose(gpu.stats, cpu.stats);
  if (!ok) {
    ++failures;
    std::printf(
        "MISMATCH %s: gpu %s nan %llu inf %llu min %g max %g sum %.17g l2 %.17g\n"
        "             cpu %s nan %llu inf %llu min %g max %g sum %.17g l2 %.17g\n",
        what.c_str(), gpu.digest.Hex().c_str(), (unsigned long long)gpu.stats.nan_count,
        (unsigned long long)gpu.stats.inf_count, gpu.stats.min, gpu.stats.max, gpu.stats.sum,
        gpu.stats.l2, cpu.digest.Hex().c_str(), (unsigned long long)cpu.stats.nan_count,
        (unsigned long long)cpu.stats.inf_count, cpu.stats.min, cpu.stats.max, cpu.stats.sum,
        cpu.stats.l2);
  }
  return ok;
}

void CheckVectors(Gpu& g, const std::string& path) {
  std::vector<fp::testgen::Vector> vectors;
  if (!fp::testgen::ReadVectors(path, &vectors) || vectors.empty()) {
    std::printf("MISMATCH cannot read %s\n", path.c_str());
    ++failures;
    return;
  }
  int bad = 0;
  for (const auto& v : vectors) {
    const auto bytes = fp::testgen::VectorBytes(v);
    fp::DType dtype{};
    fp::ParseDType(v.dtype, &dtype);
    CUDA_OK(cudaMemcpy(g.buf, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    const auto got = OnGpu(g, {g.buf, dtype, v.shape, {}}).digest.Hex();
    if (got != v.hex) {
      ++bad;
      std::printf("MISMATCH vector seed %llu %s [%s]: gpu %s want %s\n", (unsigned long long)v.seed,
                  v.dtype.c_str(), fp::testgen::ShapeText(v.shape).c_str(), got.c_str(),
                  v.hex.c_str());
    }
  }
  failures += bad;
  std::printf("vectors: %zu checked, %d mismatched\n", vectors.size(), bad);
}

void CheckRandom(Gpu& g) {
  const uint64_t kSizes[] = {0,
                             1,
                             2,
                             7,
                             8,
                             9,
                             15,
                             16,
                             17,
                             31,
                             32,
                             33,
                             511,
                             512,
                             513,
                             2047,
                             2048,
                             2049,
                             4095,
                             4096,
                             6144 + 8,
                             65535,
                             65536,
                             65537,
                             (1u << 20) + 3,
                             (16u << 20) + 5,
                             64u << 20,
                             (256u << 20) + 24,
                             1u << 30};
  std::vector<uint8_t> host(size_t{1} << 30);
  FillHost(host, 2024);
  int checked = 0, ok = 0;
  for (uint64_t size : kSizes) {
    for (int d = 1; d <= static_cast<int>(fp::DType::kComplex128); ++d) {
      const auto dtype = static_cast<fp::DType>(d);
      const uint64_t es = fp::DTypeSize(dtype);
      // Full dtype sweep up to 256 MiB; at 1 GiB three representative dtypes.
      if (size >= (1u << 30) && dtype != fp::DType::kUInt8 && dtype != fp::DType::kFloat32 &&
          dtype != fp::DType::kBFloat16) {
        continue;
      }
      if (size >= (256u << 20) && d % 4 != 2 && dtype != fp::DType::kUInt8) continue;
      const uint64_t n = size / es;
      const uint64_t bytes = n * es;
      for (uint64_t offset : {uint64_t{0}, es % 16 ? es : uint64_t{8}, uint64_t{1}}) {
        if (offset + bytes > g.cap) continue;
        if (size > (64u << 20) && offset != 0) continue;  // misaligned: the slow path, sampled
        const uint8_t* src = host.data();
        CUDA_OK(cudaMemcpy(g.buf + offset, src, bytes, cudaMemcpyHostToDevice));
        const int64_t shape[] = {static_cast<int64_t>(n)};
        const auto gpu = OnGpu(g, {g.buf + offset, dtype, shape, {}});
        const auto cpu = fp::FingerprintHost({src, dtype, shape, {}}, 0);
        ++checked;
        ok += Compare(gpu, cpu,
                      std::string(fp::DTypeName(dtype)) + " " + std::to_string(bytes) +
                          " B offset " + std::to_string(offset));
      }
    }
  }
  std::printf(
      "random tensors: %d checked (every dtype, 0 B .. 1 GiB, aligned/misaligned), %d matched\n",
      checked, ok);

  // Batched launch: 3000 small tensors of mixed dtypes at odd offsets.
  constexpr int kTensors = 3000;
  std::vector<std::vector<int64_t>> shapes(kTensors);
  std::vector<fp::TensorView> dev(kTensors), cpu(kTensors);
  uint64_t at = 0;
  CUDA_OK(cudaMemcpy(g.buf, host.data(), 64u << 20, cudaMemcpyHostToDevice));
  for (int i = 0; i < kTensors; ++i) {
    const auto dtype = static_cast<fp::DType>(1 + i % 17);
    const uint64_t es = fp::DTypeSize(dtype);
    const uint64_t n = (uint64_t(i) * 7919) % 9000 / es;
    shapes[i] = {static_cast<int64_t>(n)};
    at = (at + es - 1) / es * es + (i % 5 == 0 ? 1 : 0);
    dev[i] = {g.buf + at, dtype, shapes[i], {}};
    cpu[i] = {host.data() + at, dtype, shapes[i], {}};
    at += n * es;
  }
  std::unique_ptr<fp::cuda::Fingerprinter> batcher;
  cudaError_t e;
  batcher = fp::cuda::Fingerprinter::Create(&e, kTensors);
  CUDA_OK(e);
  ResultSlot* slots;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&slots), sizeof(ResultSlot) * kTensors));
  auto collector = fp::cuda::ResultCollector::Create(&e, kTensors);
  CUDA_OK(e);
  CUDA_OK(batcher->EnqueueBatch(dev, slots, g.stream));
  CUDA_OK(collector->Collect(slots, kTensors, g.stream));
  CUDA_OK(collector->Wait());
  int bok = 0;
  for (int i = 0; i < kTensors; ++i) {
    bok += Compare(fp::cuda::ToFingerprint(collector->results()[i]), fp::FingerprintHost(cpu[i]),
                   "batch tensor " + std::to_string(i));
  }
  std::printf("batched launch: %d tensors, %d matched\n", kTensors, bok);
  cudaFree(slots);
}

template <typename Body>
double MedianMs(cudaStream_t s, int reps, Body body) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  body();  // warm-up
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    body();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void Bandwidth(Gpu& g) {
  std::printf("\n%-40s %12s %10s\n", "GPU (median of 20, CUDA events)", "time", "GB/s");
  uint8_t* other;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&other), size_t{1} << 30));
  for (uint64_t size : {uint64_t{64} << 20, uint64_t{1} << 30}) {
    const double copy = MedianMs(g.stream, 20, [&] {
      cudaMemcpyAsync(other, g.buf, size, cudaMemcpyDeviceToDevice, g.stream);
    });
    std::printf("%-40s %9.3f ms %10.1f  (read+write %.1f)\n",
                ("d2d copy " + std::to_string(size >> 20) + " MiB").c_str(), copy,
                size / copy / 1e6, 2 * size / copy / 1e6);
    for (auto dtype : {fp::DType::kUInt8, fp::DType::kFloat32, fp::DType::kBFloat16}) {
      const int64_t shape[] = {static_cast<int64_t>(size / fp::DTypeSize(dtype))};
      const fp::TensorView v{g.buf, dtype, shape, {}};
      const double ms = MedianMs(g.stream, 20, [&] { g.f->Enqueue(v, g.slots, g.stream); });
      std::printf("%-40s %9.3f ms %10.1f  (%.0f%% of copy read+write rate)\n",
                  ("fingerprint " + std::string(fp::DTypeName(dtype)) + " " +
                   std::to_string(size >> 20) + " MiB")
                      .c_str(),
                  ms, size / ms / 1e6, 100.0 * (size / ms) / (2 * size / copy));
    }
  }
  cudaFree(other);
  std::vector<std::vector<int64_t>> shapes(1000, std::vector<int64_t>{1024});
  std::vector<fp::TensorView> views;
  for (int i = 0; i < 1000; ++i)
    views.push_back({g.buf + i * 4096, fp::DType::kFloat32, shapes[i], {}});
  const double batch = MedianMs(g.stream, 50, [&] { g.f->EnqueueBatch(views, g.slots, g.stream); });
  std::printf("%-40s %9.1f us  (target < 20 us)\n", "batch 1000 x 4 KiB float32", batch * 1e3);

  // CPU path on this machine, for the record.
  std::vector<uint8_t> h(size_t{1} << 30);
  FillHost(h, 1);
  std::printf("\n%-40s %12s %10s\n", "CPU (this machine, best of 3)", "time", "GB/s");
  for (uint64_t size : {uint64_t{64} << 20, uint64_t{1} << 30}) {
    const int64_t shape[] = {static_cast<int64_t>(size)};
    for (int threads : {1, 0}) {
      double best = 1e30;
      for (int r = 0; r < 3; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        volatile auto d = fp::DigestHost({h.data(), fp::DType::kUInt8, shape, {}}, threads).lo;
        (void)d;
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("%-40s %9.3f ms %10.1f\n",
                  ("digest " + std::to_string(size >> 20) + " MiB, " +
                   (threads ? "1 thread" : "all threads"))
                      .c_str(),
                  best * 1e3, size / best / 1e9);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string vectors = argc > 1 ? argv[1] : "fingerprint/testdata/vectors.txt";
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "gpu_check: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  Gpu g;
  cudaError_t e;
  CUDA_OK(cudaStreamCreate(&g.stream));
  g.f = fp::cuda::Fingerprinter::Create(&e);
  CUDA_OK(e);
  g.c = fp::cuda::ResultCollector::Create(&e, 1);
  CUDA_OK(e);
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&g.slots), sizeof(ResultSlot) * 4096));
  g.cap = (size_t{1} << 30) + 64;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&g.buf), g.cap));
  CheckVectors(g, vectors);
  CheckRandom(g);
  Bandwidth(g);
  std::printf("\n%s: %d mismatch(es)\n", failures ? "FAIL" : "OK", failures);
  return failures ? 1 : 0;
}
