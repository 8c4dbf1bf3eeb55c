// The shim's CUDA backend (libopguard_shim_cuda.so) on a real device: results
// land without any synchronisation by the caller and equal the CPU path's
// bits, several streams and reused slots included, and a capturing stream is
// refused with its reason. Where no CUDA device is usable, opening the backend
// must fail cleanly with a reason and every device test is skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "device_ops.h"
#include "opguard/fingerprint/fingerprint.h"

extern "C" int opguard_shim_cuda_open(uint32_t slots, opguard_device_ops* ops, char* why,
                                      size_t why_len);

namespace {

namespace fp = opguard::fingerprint;

bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(ShimCudaBackend, WithoutADeviceOpeningFailsWithAReason) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is present";
  opguard_device_ops ops{};
  char why[256] = {};
  EXPECT_NE(opguard_shim_cuda_open(8, &ops, why, sizeof(why)), 0);
  EXPECT_NE(std::string(why).find("no CUDA device"), std::string::npos) << why;
}

class ShimCudaBackendDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no usable CUDA device (checked on the GPU machine)";
    char why[256] = {};
    ASSERT_EQ(opguard_shim_cuda_open(4, &ops_, why, sizeof(why)), 0) << why;
  }
  void TearDown() override {
    if (ops_.close != nullptr) ops_.close(ops_.self);
  }
  // Polls (as the shim's sender thread does) until the slot's result lands.
  opguard_tensor Harvest(uint32_t slot) {
    opguard_tensor out{};
    char why[256] = {};
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int state = 0;
    while ((state = ops_.poll(ops_.self, slot, &out, why, sizeof(why))) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    EXPECT_EQ(state, 1) << why;
    return out;
  }
  opguard_device_ops ops_{};
};

TEST_F(ShimCudaBackendDevice, ResultsEqualTheCpuPathOnSeveralStreamsWithReusedSlots) {
  cudaStream_t streams[2];
  for (auto& s : streams) ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (int round = 0; round < 3; ++round) {  // slots 0..3 reused each round
    for (uint32_t slot = 0; slot < 4; ++slot) {
      int64_t n = 1000 + 777 * slot + round;
      std::vector<float> host(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>((i * 31 + slot) % 1013) * 0.25f;
      void* dev = nullptr;
      ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
      cudaStream_t s = streams[slot % 2];
      ASSERT_EQ(cudaMemcpyAsync(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, s),
                cudaSuccess);
      opguard_device_tensor t{dev, &n, 1, OPGUARD_DTYPE_FLOAT32, 0};
      char why[256] = {};
      ASSERT_EQ(ops_.launch(ops_.self, slot, &t, s, why, sizeof(why)), 0) << why;
      opguard_tensor got = Harvest(slot);
      fp::TensorView view;
      view.data = host.data();
      view.dtype = fp::DType::kFloat32;
      view.shape = std::span<const int64_t>(&n, 1);
      fp::Fingerprint cpu = fp::FingerprintHost(view, 1);
      EXPECT_EQ(got.fp_lo, cpu.digest.lo) << "round " << round << " slot " << slot;
      EXPECT_EQ(got.fp_hi, cpu.digest.hi);
      EXPECT_EQ(got.stats.sum, cpu.stats.sum);
      cudaFree(dev);
    }
  }
  for (auto& s : streams) cudaStreamDestroy(s);
}

TEST_F(ShimCudaBackendDevice, CapturingStreamIsRefusedAndTheGraphStaysClean) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64), cudaSuccess);
  int64_t n = 16;
  opguard_device_tensor t{dev, &n, 1, OPGUARD_DTYPE_FLOAT32, 0};
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  char why[256] = {};
  EXPECT_NE(ops_.launch(ops_.self, 0, &t, s, why, sizeof(why)), 0);
  EXPECT_EQ(std::string(why), "cuda graph capture");
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  size_t nodes = 99;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0u) << "nothing of OpGuard's was captured";
  cudaGraphDestroy(graph);
  cudaFree(dev);
  cudaStreamDestroy(s);
}

}  // namespace
