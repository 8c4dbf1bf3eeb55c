// Kernel attribution through the shim core: op records held until their
// kernel names are final, then sent with the names in launch order. CUPTI is
// the stand-in libcupti (cupti/testing/standin_cupti.cc, built from the real
// cupti_activity.h structs) loaded through OPGUARD_CUPTI_LIBRARY, the device
// the host-memory stand-in (testing/test_device.h) whose streams run when the
// test says, the daemon a fake one over real ZeroMQ sockets.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fake_daemon.h"
#include "shim_core.h"
#include "test_device.h"

namespace opguard::shim {
namespace {

using testing::FakeDaemon;
using testing::Received;
using testing::TestDevice;

// The stand-in's controls, from the copy the core loads (same path, same handle).
struct StandinCupti {
  void (*launch)(const char*) = nullptr;
  void (*drop)(size_t) = nullptr;
  size_t (*depth)() = nullptr;
  StandinCupti() {
    void* h = dlopen(OPGUARD_STANDIN_CUPTI, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return;
    launch = reinterpret_cast<void (*)(const char*)>(dlsym(h, "opguard_standin_cupti_launch"));
    drop = reinterpret_cast<void (*)(size_t)>(dlsym(h, "opguard_standin_cupti_drop"));
    depth = reinterpret_cast<size_t (*)()>(dlsym(h, "opguard_standin_cupti_depth"));
  }
};

class KernelsCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(cupti_.launch, nullptr) << "cannot load " << OPGUARD_STANDIN_CUPTI;
    char tmpl[] = "/tmp/opguard-kernels-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    config_.enabled = true;
    config_.run = "kernels-test";
    config_.endpoint = "ipc://" + dir_ + "/ingest.sock";
    config_.batch_interval_ms = 5;
    config_.ack_timeout_ms = 200;
    config_.kernels = true;
    config_.cupti_library = OPGUARD_STANDIN_CUPTI;
    SetLogLevel(LogLevel::kError);
    daemon_ = std::make_unique<FakeDaemon>(config_.endpoint);
    ASSERT_TRUE(daemon_->Start());
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
    EXPECT_EQ(cupti_.depth(), 0u) << "every external correlation id pushed was popped";
  }

  std::unique_ptr<Core> StartCore() {
    Core::DeviceLoader loader = [this](uint32_t, std::string*) {
      return std::make_unique<DeviceFingerprinter>(dev_.Ops());
    };
    auto core = Core::Start(config_, loader);
    EXPECT_TRUE(core.ok()) << core.status().message();
    return core.ok() ? std::move(core).value() : nullptr;
  }

  // One op as the adapter records it: inputs fingerprinted before begin,
  // `kernels` launched between begin and end, its output fingerprinted on
  // `stream` behind them, then the record.
  int Op(Core& core, const std::vector<const char*>& kernels, void* stream,
         uint64_t* key_out = nullptr) {
    uint64_t key = 0;
    const bool on = core.KernelsBegin(&key) == OPGUARD_OK;
    for (const char* k : kernels) cupti_.launch(k);
    if (on) core.KernelsEnd(key);
    if (key_out != nullptr) *key_out = key;
    opguard_tensor out{};
    out.shape = &n_;
    out.ndim = 1;
    out.dtype = OPGUARD_DTYPE_FLOAT32;
    out.device = -1;
    if (stream != nullptr) {
      uint64_t handle = 0;
      opguard_device_tensor t{v_.data(), &n_, 1, OPGUARD_DTYPE_FLOAT32, 0};
      EXPECT_EQ(core.FingerprintDeviceAsync(t, true, stream, &handle), OPGUARD_OK);
      opguard_tensor_set_pending(&out, handle);
      out.device = 0;
    } else {
      out.fp_lo = 42;
    }
    opguard_op op{};
    op.struct_size = sizeof(op);
    op.op_index = OPGUARD_AUTO;
    op.num_outputs = 1;
    op.outputs = &out;
    op.kernels_key = key;
    return core.RecordOp(op, nullptr);
  }

  static std::vector<std::string> Names(const Received& r, size_t op) {
    std::vector<std::string> names;
    for (uint64_t id : r.ops.at(op).kernels) {
      auto it = r.strings.find(id);
      names.push_back(it == r.strings.end() ? "<string " + std::to_string(id) + " never sent>"
                                            : it->second);
    }
    return names;
  }

  static opguard_counters Counters(Core& core) {
    opguard_counters c{};
    c.struct_size = sizeof(c);
    core.GetCounters(&c);
    return c;
  }

  StandinCupti cupti_;
  TestDevice dev_{64};
  std::string dir_;
  Config config_;
  std::unique_ptr<FakeDaemon> daemon_;
  std::vector<float> v_ = std::vector<float>(8, 1.5f);
  int64_t n_ = 8;
};

// Mangled as CUDA C++ kernels are; reported demangled.
constexpr const char* kGemm = "_Z12gemm_128x128PKfS0_Pfi";
constexpr const char* kRelu = "_Z4reluPfi";
constexpr const char* kReduce = "reduce_kernel";

TEST_F(KernelsCoreTest, OpsCarryTheirKernelsInLaunchOrderOnceTheirDeviceWorkIsDone) {
  auto core = StartCore();
  ASSERT_TRUE(core);
  void* s1 = dev_.Stream(1);
  void* s2 = dev_.Stream(2);
  ASSERT_EQ(Op(*core, {kGemm, kRelu, kGemm}, s1), OPGUARD_OK);
  ASSERT_EQ(Op(*core, {kReduce}, s2), OPGUARD_OK);
  ASSERT_EQ(Op(*core, {}, s1), OPGUARD_OK);  // launched nothing
  cupti_.launch(kReduce);                    // outside any op: nobody's
  EXPECT_EQ(Counters(*core).records_held, 3u);
  // Stream 2 done, stream 1 not: the first op has neither its bits nor its
  // final kernel list, and the others wait behind it.
  dev_.RunStream(s2);
  EXPECT_EQ(core->Flush(100), OPGUARD_ERR_TIMEOUT);
  EXPECT_EQ(daemon_->Snapshot().records, 0u);
  dev_.RunStream(s1);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.ops.size(), 3u);
  EXPECT_EQ(Names(r, 0),
            (std::vector<std::string>{"gemm_128x128(float const*, float const*, float*, int)",
                                      "relu(float*, int)",
                                      "gemm_128x128(float const*, float const*, float*, int)"}));
  EXPECT_EQ(Names(r, 1), (std::vector<std::string>{"reduce_kernel"}));
  EXPECT_TRUE(r.ops[2].kernels.empty());
  EXPECT_NE(r.ops[0].out_lo, 0u) << "the fingerprint was filled in as well";
  opguard_counters c = Counters(*core);
  EXPECT_EQ(c.kernel_names, 4u);
  EXPECT_EQ(c.kernel_lists_unavailable, 0u);
  EXPECT_EQ(c.records_held, 0u);
}

TEST_F(KernelsCoreTest, OpsWithHostOutputsOnlyAreNotHeldLongerThanAFlush) {
  auto core = StartCore();
  ASSERT_TRUE(core);
  for (int i = 0; i < 50; ++i)
    ASSERT_EQ(Op(*core, {i % 2 == 0 ? kGemm : kRelu}, nullptr), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.ops.size(), 50u);
  for (size_t i = 0; i < r.ops.size(); ++i) {
    EXPECT_EQ(r.ops[i].op_index, i);
    ASSERT_EQ(r.ops[i].kernels.size(), 1u) << "op " << i;
    EXPECT_EQ(Names(r, i)[0], i % 2 == 0 ? "gemm_128x128(float const*, float const*, float*, int)"
                                         : "relu(float*, int)");
  }
}

TEST_F(KernelsCoreTest, DroppedActivityRecordsSendOpsWithoutNamesAndTurnAttributionOff) {
  auto core = StartCore();
  ASSERT_TRUE(core);
  void* s = dev_.Stream(0);
  ASSERT_EQ(Op(*core, {kGemm}, s), OPGUARD_OK);
  cupti_.drop(3);  // CUPTI had no buffer for some record: lists may miss a kernel
  dev_.RunStream(s);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.ops.size(), 1u);
  EXPECT_TRUE(r.ops[0].kernels.empty()) << "no list rather than a list that may be short";
  EXPECT_EQ(Counters(*core).kernel_lists_unavailable, 1u);
  uint64_t key = 0;
  EXPECT_EQ(core->KernelsBegin(&key), OPGUARD_ERR_UNSUPPORTED) << "attribution is off from then on";
  ASSERT_EQ(Op(*core, {kGemm}, nullptr), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  EXPECT_EQ(daemon_->Snapshot().ops.size(), 2u) << "recording goes on without kernel names";
}

TEST_F(KernelsCoreTest, OpsThatBecomeGapsOrAreDiscardedDoNotHoldLaterOps) {
  auto core = StartCore();
  ASSERT_TRUE(core);
  void* s = dev_.Stream(0);
  dev_.FailNextResult("an illegal memory access was encountered");
  ASSERT_EQ(Op(*core, {kGemm}, s), OPGUARD_OK);  // its fingerprint fails: a gap
  uint64_t key = 0;
  ASSERT_EQ(core->KernelsBegin(&key), OPGUARD_OK);
  cupti_.launch(kRelu);
  core->KernelsEnd(key);
  core->KernelsDiscard(key);  // the caller records nothing for this one
  ASSERT_EQ(Op(*core, {kReduce}, nullptr), OPGUARD_OK);
  dev_.RunStream(s);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.gaps.size(), 1u);
  EXPECT_EQ(r.gaps[0].reason, "missing fingerprint: an illegal memory access was encountered");
  ASSERT_EQ(r.ops.size(), 1u);
  EXPECT_EQ(Names(r, 0), (std::vector<std::string>{"reduce_kernel"}));
}

TEST_F(KernelsCoreTest, ShutdownSendsOpsStillWaitingWithoutNames) {
  auto core = StartCore();
  ASSERT_TRUE(core);
  void* s = dev_.Stream(0);
  ASSERT_EQ(Op(*core, {kGemm}, s), OPGUARD_OK);  // its stream never runs
  EXPECT_EQ(core->Shutdown(400), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  EXPECT_TRUE(r.ops.empty());
  ASSERT_EQ(r.gaps.size(), 1u) << "the fingerprint never came: a gap, as without kernels";
}

TEST_F(KernelsCoreTest, OffUnlessAskedForAndWhenCuptiCannotBeLoaded) {
  config_.kernels = false;
  {
    auto core = StartCore();
    ASSERT_TRUE(core);
    uint64_t key = 0;
    EXPECT_EQ(core->KernelsBegin(&key), OPGUARD_ERR_UNSUPPORTED);
    ASSERT_EQ(Op(*core, {kGemm}, nullptr), OPGUARD_OK);
    ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
    ASSERT_EQ(daemon_->Snapshot().ops.size(), 1u);
    EXPECT_TRUE(daemon_->Snapshot().ops[0].kernels.empty());
  }
  config_.kernels = true;
  config_.cupti_library = dir_ + "/no-such-libcupti.so";
  auto core = StartCore();
  ASSERT_TRUE(core) << "recording starts without kernel names";
  uint64_t key = 0;
  EXPECT_EQ(core->KernelsBegin(&key), OPGUARD_ERR_UNSUPPORTED);
  ASSERT_EQ(Op(*core, {kGemm}, nullptr), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  EXPECT_EQ(daemon_->Snapshot().ops.size(), 2u);
}

}  // namespace
}  // namespace opguard::shim
