// GPU == CPU, bit for bit. Runs where a CUDA device is usable; elsewhere every
// test is skipped (GTEST_SKIP), never failed. scripts/gpu-check.sh runs the
// same comparison, at larger sizes, without CMake or GoogleTest.
#include "opguard/fingerprint/fingerprint_cuda.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fingerprint_testgen.h"
#include "opguard/fingerprint/fingerprint.h"

namespace opguard::fingerprint::cuda {
namespace {

class CudaFingerprint : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no usable CUDA device: " << cudaGetErrorString(e);
    }
    cudaError_t err;
    fp_ = Fingerprinter::Create(&err);
    ASSERT_NE(fp_, nullptr) << cudaGetErrorString(err);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::unique_ptr<Fingerprinter> fp_;
  cudaStream_t stream_ = nullptr;
};

void ExpectSame(const Fingerprint& gpu, const Fingerprint& cpu, const std::string& what) {
  EXPECT_EQ(gpu.digest.Hex(), cpu.digest.Hex()) << what;
  EXPECT_EQ(gpu.stats.nan_count, cpu.stats.nan_count) << what;
  EXPECT_EQ(gpu.stats.inf_count, cpu.stats.inf_count) << what;
  EXPECT_EQ(gpu.stats.min, cpu.stats.min) << what;
  EXPECT_EQ(gpu.stats.max, cpu.stats.max) << what;
  // fp64 sums fold in a different order on the GPU (docs/fingerprint.md);
  // once squares overflow (random fp64 bytes) the order decides inf vs NaN.
  if (std::isfinite(cpu.stats.l2)) {
    EXPECT_NEAR(gpu.stats.sum, cpu.stats.sum, 1e-4 * (1 + cpu.stats.l2)) << what;
    EXPECT_NEAR(gpu.stats.l2, cpu.stats.l2, 1e-9 * (1 + cpu.stats.l2)) << what;
  }
}

TEST_F(CudaFingerprint, EveryDTypeSizeAndAlignmentMatchesCpu) {
  const uint64_t kMax = (4u << 20) + 64;
  void* dev = nullptr;
  ResultSlot* slot = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kMax), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&slot), sizeof(ResultSlot)), cudaSuccess);
  cudaError_t err;
  auto collector = ResultCollector::Create(&err, 1);
  ASSERT_NE(collector, nullptr);
  for (int d = 1; d <= static_cast<int>(DType::kComplex128); ++d) {
    const auto dtype = static_cast<DType>(d);
    const uint64_t es = DTypeSize(dtype);
    for (uint64_t n : {0ull, 1ull, 3ull, 255ull, 257ull, 4099ull, 100003ull, (4ull << 20) / 16}) {
      for (uint64_t offset : {0ull, 8ull, es % 16 ? es : 16ull, 1ull}) {
        if (offset % es && offset != 1) continue;
        const auto bytes = testgen::Bytes(n * 7 + d, n * es);
        ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(dev) + offset, bytes.data(), bytes.size(),
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
        const int64_t shape[] = {static_cast<int64_t>(n)};
        const TensorView view{static_cast<uint8_t*>(dev) + offset, dtype, shape, {}};
        ASSERT_EQ(fp_->Enqueue(view, slot, stream_), cudaSuccess);
        ASSERT_EQ(collector->Collect(slot, 1, stream_), cudaSuccess);
        ASSERT_EQ(collector->Wait(), cudaSuccess);
        ASSERT_TRUE(collector->Ready());
        const Fingerprint cpu = FingerprintHost({bytes.data(), dtype, shape, {}});
        ExpectSame(ToFingerprint(collector->results()[0]), cpu,
                   std::string(DTypeName(dtype)) + " n=" + std::to_string(n) +
                       " offset=" + std::to_string(offset));
      }
    }
  }
  cudaFree(dev);
  cudaFree(slot);
}

TEST_F(CudaFingerprint, BatchOfSmallTensorsMatchesCpu) {
  constexpr int kTensors = 1000;
  std::vector<std::vector<uint8_t>> host(kTensors);
  std::vector<void*> dev(kTensors);
  std::vector<std::vector<int64_t>> shapes(kTensors);
  std::vector<TensorView> views(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    const auto dtype = static_cast<DType>(1 + i % 17);
    const uint64_t n = (i * 37) % 2000 / DTypeSize(dtype) + (i % 3);
    host[i] = testgen::Bytes(i, n * DTypeSize(dtype));
    shapes[i] = {static_cast<int64_t>(n)};
    ASSERT_EQ(cudaMalloc(&dev[i], host[i].size() + 1), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev[i], host[i].data(), host[i].size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    views[i] = {dev[i], dtype, shapes[i], {}};
  }
  ResultSlot* slots = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&slots), sizeof(ResultSlot) * kTensors),
            cudaSuccess);
  cudaError_t err;
  auto collector = ResultCollector::Create(&err, kTensors);
  ASSERT_NE(collector, nullptr);
  ASSERT_EQ(fp_->EnqueueBatch(views, slots, stream_), cudaSuccess);
  ASSERT_EQ(collector->Collect(slots, kTensors, stream_), cudaSuccess);
  ASSERT_EQ(collector->Wait(), cudaSuccess);
  for (int i = 0; i < kTensors; ++i) {
    const Fingerprint cpu = FingerprintHost({host[i].data(), views[i].dtype, shapes[i], {}});
    ExpectSame(ToFingerprint(collector->results()[i]), cpu, "tensor " + std::to_string(i));
    cudaFree(dev[i]);
  }
  cudaFree(slots);
}

}  // namespace
}  // namespace opguard::fingerprint::cuda
