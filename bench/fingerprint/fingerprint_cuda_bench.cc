// GPU fingerprint throughput beside a device-to-device copy, and the batched
// launch of 1000 tensors of 4 KiB (issue 3 targets: >= 85% of read bandwidth
// for tensors >= 64 MiB; the batch in under 20 us). Times are CUDA-event
// times of the work on the stream (UseManualTime). Needs a GPU.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "opguard/fingerprint/fingerprint_cuda.h"

namespace {

namespace fp = opguard::fingerprint;

struct Device {
  bool ok = false;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::unique_ptr<fp::cuda::Fingerprinter> fingerprinter;
  fp::cuda::ResultSlot* slots = nullptr;
  Device() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return;
    cudaError_t e;
    fingerprinter = fp::cuda::Fingerprinter::Create(&e);
    ok = fingerprinter && cudaStreamCreate(&stream) == cudaSuccess &&
         cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess &&
         cudaMalloc(reinterpret_cast<void**>(&slots), sizeof(fp::cuda::ResultSlot) * 4096) ==
             cudaSuccess;
  }
};

Device& Dev() {
  static Device* d = new Device();
  return *d;
}

// Times `body` (enqueued on the stream) with events; one iteration each.
template <typename Body>
void Timed(benchmark::State& state, Body body) {
  Device& d = Dev();
  for (auto _ : state) {
    cudaEventRecord(d.start, d.stream);
    body();
    cudaEventRecord(d.stop, d.stream);
    cudaEventSynchronize(d.stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, d.start, d.stop);
    state.SetIterationTime(ms / 1e3);
  }
}

void BM_DeviceCopy(benchmark::State& state) {
  if (!Dev().ok) return state.SkipWithError("no CUDA device");
  const size_t size = state.range(0);
  void *a = nullptr, *b = nullptr;
  cudaMalloc(&a, size);
  cudaMalloc(&b, size);
  cudaMemset(a, 1, size);
  Timed(state, [&] { cudaMemcpyAsync(b, a, size, cudaMemcpyDeviceToDevice, Dev().stream); });
  // A copy reads and writes each byte: report bytes read, as for the hash.
  state.SetBytesProcessed(state.iterations() * size);
  state.counters["read+write GB/s"] =
      benchmark::Counter(2.0 * size * state.iterations(), benchmark::Counter::kIsRate);
  cudaFree(a);
  cudaFree(b);
}

void BM_GpuFingerprint(benchmark::State& state) {
  if (!Dev().ok) return state.SkipWithError("no CUDA device");
  const size_t size = state.range(0);
  const auto dtype = static_cast<fp::DType>(state.range(1));
  void* a = nullptr;
  cudaMalloc(&a, size);
  cudaMemset(a, 0x3c, size);
  const int64_t shape[] = {static_cast<int64_t>(size / fp::DTypeSize(dtype))};
  const fp::TensorView view{a, dtype, shape, {}};
  Timed(state, [&] { Dev().fingerprinter->Enqueue(view, Dev().slots, Dev().stream); });
  state.SetBytesProcessed(state.iterations() * size);
  state.SetLabel(std::string(fp::DTypeName(dtype)));
  cudaFree(a);
}

void BM_GpuBatch1000x4KiB(benchmark::State& state) {
  if (!Dev().ok) return state.SkipWithError("no CUDA device");
  constexpr int kTensors = 1000;
  constexpr size_t kBytes = 4096;
  void* a = nullptr;
  cudaMalloc(&a, kTensors * kBytes);
  cudaMemset(a, 0x5a, kTensors * kBytes);
  const int64_t shape[] = {kBytes / 4};
  std::vector<fp::TensorView> views;
  for (int i = 0; i < kTensors; ++i) {
    views.push_back({static_cast<uint8_t*>(a) + i * kBytes, fp::DType::kFloat32, shape, {}});
  }
  Timed(state, [&] { Dev().fingerprinter->EnqueueBatch(views, Dev().slots, Dev().stream); });
  state.SetBytesProcessed(state.iterations() * kTensors * kBytes);
  cudaFree(a);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t size : {int64_t{64} << 20, int64_t{1} << 30}) b->Arg(size);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void FpSizes(benchmark::internal::Benchmark* b) {
  for (int64_t size : {int64_t{64} << 20, int64_t{1} << 30}) {
    for (auto d : {fp::DType::kUInt8, fp::DType::kFloat32, fp::DType::kBFloat16}) {
      b->Args({size, static_cast<int64_t>(d)});
    }
  }
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_DeviceCopy)->Apply(Sizes);
BENCHMARK(BM_GpuFingerprint)->Apply(FpSizes);
BENCHMARK(BM_GpuBatch1000x4KiB)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
