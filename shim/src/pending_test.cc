// Pending fingerprints: the handle table, the device harvest logic over a
// host-memory stand-in for the GPU (testing/test_device.h: the test decides
// when each stream's work runs), the host fingerprint thread, and the core
// holding records until their fingerprints resolve, against a fake daemon
// over real ZeroMQ sockets.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "fake_daemon.h"
#include "fp_backends.h"
#include "opguard/fingerprint/fingerprint.h"
#include "pending_table.h"
#include "shim_core.h"
#include "test_device.h"

namespace opguard::shim {
namespace {

using testing::FakeDaemon;
using testing::Received;
using testing::TestDevice;

// The CPU engine's fingerprint of a float32 vector (what the device must match).
fingerprint::Fingerprint CpuFp(const std::vector<float>& v) {
  int64_t n = static_cast<int64_t>(v.size());
  fingerprint::TensorView view;
  view.data = v.data();
  view.dtype = fingerprint::DType::kFloat32;
  view.shape = std::span<const int64_t>(&n, 1);
  return fingerprint::FingerprintHost(view, 1);
}

// ---------------------------------------------------------------------------
// PendingTable

TEST(PendingTableTest, LimitCountsOnlyUnresolvedHandles) {
  PendingTable t(/*max_pending=*/2, /*keep_settled=*/8);
  uint64_t a = t.Begin(), b = t.Begin();
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(t.Begin(), 0u) << "third unresolved handle over the limit";
  EXPECT_TRUE(t.Resolve(a, FpResult{1, 2, 0, {}}));
  EXPECT_FALSE(t.Resolve(a, FpResult{}));  // settled once
  EXPECT_FALSE(t.Fail(a, "late"));
  uint64_t c = t.Begin();
  EXPECT_NE(c, 0u);
  EXPECT_TRUE(t.Fail(b, "boom"));
  EXPECT_EQ(t.pending(), 1u);
  EXPECT_EQ(t.resolved(), 1u);
  EXPECT_EQ(t.failed(), 1u);
  ASSERT_NE(t.Find(b), nullptr);
  EXPECT_EQ(t.Find(b)->reason, "boom");
  EXPECT_EQ(t.Find(999), nullptr);
}

TEST(PendingTableTest, SettledHandlesExpireUnlessReferenced) {
  PendingTable t(/*max_pending=*/100, /*keep_settled=*/2);
  uint64_t a = t.Begin(), b = t.Begin(), c = t.Begin();
  t.AddRef(t.Find(a));  // a held record waits on a
  t.Resolve(a, FpResult{10, 0, 0, {}});
  t.Resolve(b, FpResult{20, 0, 0, {}});
  t.Resolve(c, FpResult{30, 0, 0, {}});  // a leaves the keep window
  EXPECT_EQ(t.Find(a), nullptr) << "expired for new records";
  ASSERT_NE(t.Peek(a), nullptr) << "still there for the record that waits on it";
  EXPECT_EQ(t.Peek(a)->result.lo, 10u);
  t.Unref(a);
  EXPECT_EQ(t.Peek(a), nullptr);
  ASSERT_NE(t.Find(c), nullptr);
  uint64_t d = t.BeginFailed("limit");
  EXPECT_EQ(t.Find(d)->state, PendingTable::State::kFailed);
  EXPECT_EQ(t.pending(), 0u);
  EXPECT_EQ(t.size(), 2u);  // c and d; b expired unreferenced
}

// ---------------------------------------------------------------------------
// DeviceFingerprinter over the stand-in

struct SinkLog final : FpSink {
  struct Event {
    uint64_t handle;
    bool ok;
    uint64_t lo;
    std::string why;
  };
  void ResolveFp(uint64_t h, const FpResult& r) override { events.push_back({h, true, r.lo, {}}); }
  void FailFp(uint64_t h, std::string_view why) override { events.push_back({h, false, 0, std::string(why)}); }
  std::vector<Event> events;
};

opguard_device_tensor DeviceTensor(const std::vector<float>& v, const int64_t* shape) {
  return opguard_device_tensor{v.data(), shape, 1, OPGUARD_DTYPE_FLOAT32, 0};
}

TEST(DeviceFingerprinterTest, HarvestsEachStreamInLaunchOrderWhateverOrderStreamsFinish) {
  TestDevice dev(8);
  DeviceFingerprinter fps(dev.Ops());
  void* s1 = dev.Stream(1);
  void* s2 = dev.Stream(2);
  std::vector<float> a(100, 1.0f), b(33, 2.0f), c(7, 3.0f);
  int64_t na = 100, nb = 33, nc = 7;
  ASSERT_EQ(fps.Launch(1, DeviceTensor(a, &na), s1), "");
  ASSERT_EQ(fps.Launch(2, DeviceTensor(b, &nb), s2), "");
  ASSERT_EQ(fps.Launch(3, DeviceTensor(c, &nc), s1), "");
  SinkLog log;
  EXPECT_EQ(fps.Harvest(log), 3u);
  EXPECT_TRUE(log.events.empty()) << "nothing ran on the device yet";
  dev.RunStream(s2);  // the second stream finishes first
  EXPECT_EQ(fps.Harvest(log), 2u);
  dev.RunStream(s1, 1);
  EXPECT_EQ(fps.Harvest(log), 1u);
  dev.RunStream(s1);
  EXPECT_EQ(fps.Harvest(log), 0u);
  ASSERT_EQ(log.events.size(), 3u);
  EXPECT_EQ(log.events[0].handle, 2u);
  EXPECT_EQ(log.events[1].handle, 1u);
  EXPECT_EQ(log.events[2].handle, 3u);
  EXPECT_EQ(log.events[0].lo, CpuFp(b).digest.lo);
  EXPECT_EQ(log.events[1].lo, CpuFp(a).digest.lo);
  EXPECT_EQ(log.events[2].lo, CpuFp(c).digest.lo);
}

TEST(DeviceFingerprinterTest, ReusesSlotsOnlyAfterHarvestAndRefusesWhenAllAreBusy) {
  TestDevice dev(2);
  SinkLog log;
  {
    DeviceFingerprinter fps(dev.Ops());
    void* s = dev.Stream(0);
    std::vector<float> v(16, 0.5f);
    int64_t n = 16;
    ASSERT_EQ(fps.Launch(1, DeviceTensor(v, &n), s), "");
    ASSERT_EQ(fps.Launch(2, DeviceTensor(v, &n), s), "");
    EXPECT_EQ(fps.Launch(3, DeviceTensor(v, &n), s), "pending fingerprint limit");
    dev.RunStream(s);
    EXPECT_EQ(fps.Launch(3, DeviceTensor(v, &n), s), "pending fingerprint limit")
        << "a landed slot is free only once harvested";
    fps.Harvest(log);
    for (uint64_t h = 3; h < 10; ++h) {
      ASSERT_EQ(fps.Launch(h, DeviceTensor(v, &n), s), "");
      dev.RunStream(s);
      fps.Harvest(log);
    }
    EXPECT_EQ(log.events.size(), 9u);
    EXPECT_EQ(dev.max_slots_in_use(), 2u);
  }
  EXPECT_TRUE(dev.closed());
}

TEST(DeviceFingerprinterTest, LaunchAndResultFailuresCarryTheirReason) {
  TestDevice dev(4);
  DeviceFingerprinter fps(dev.Ops());
  void* s = dev.Stream(0);
  std::vector<float> v(4, 1.0f);
  int64_t n = 4;
  dev.SetCapturing(s, true);
  EXPECT_EQ(fps.Launch(1, DeviceTensor(v, &n), s), "cuda graph capture");
  dev.SetCapturing(s, false);
  ASSERT_EQ(fps.Launch(2, DeviceTensor(v, &n), s), "");
  dev.FailNextResult("an illegal memory access was encountered");
  dev.RunStream(s);
  SinkLog log;
  EXPECT_EQ(fps.Harvest(log), 0u);
  ASSERT_EQ(log.events.size(), 1u);
  EXPECT_FALSE(log.events[0].ok);
  EXPECT_EQ(log.events[0].why, "an illegal memory access was encountered");
}

// ---------------------------------------------------------------------------
// The core: held records through a fake daemon

class PendingCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/opguard-pending-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    endpoint_ = "ipc://" + dir_ + "/ingest.sock";
    config_.enabled = true;
    config_.run = "pending-test";
    config_.endpoint = endpoint_;
    config_.batch_interval_ms = 5;
    config_.ack_timeout_ms = 200;
    SetLogLevel(LogLevel::kError);
    daemon_ = std::make_unique<FakeDaemon>(endpoint_);
    ASSERT_TRUE(daemon_->Start());
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Core> StartCore(TestDevice* dev) {
    Core::DeviceLoader loader = [dev](uint32_t, std::string* why) -> std::unique_ptr<DeviceFingerprinter> {
      if (dev == nullptr) {
        *why = "no driver in this test";
        return nullptr;
      }
      return std::make_unique<DeviceFingerprinter>(dev->Ops());
    };
    auto core = Core::Start(config_, loader);
    EXPECT_TRUE(core.ok()) << core.status().message();
    return core.ok() ? std::move(core).value() : nullptr;
  }

  std::string dir_;
  std::string endpoint_;
  Config config_;
  std::unique_ptr<FakeDaemon> daemon_;
  // A small tensor's bytes ("device memory" for the stand-in).
  std::vector<float> v_ = std::vector<float>(8, 2.0f);
  int64_t n_ = 8;
};

// An op with one output tensor `out` (and the same tensor as input when `in`).
int RecordOp(Core& core, uint32_t lane, const opguard_tensor& out, const opguard_tensor* in = nullptr) {
  opguard_value v{};
  if (in != nullptr) {
    v.kind = OPGUARD_VALUE_TENSOR;
    v.tensor = *in;
  }
  opguard_op op{};
  op.struct_size = sizeof(op);
  op.lane = lane;
  op.op_index = OPGUARD_AUTO;
  op.num_inputs = in != nullptr ? 1 : 0;
  op.inputs = in != nullptr ? &v : nullptr;
  op.num_outputs = 1;
  op.outputs = &out;
  return core.RecordOp(op, nullptr);
}

opguard_tensor Plain(uint64_t lo, const int64_t* shape) {
  opguard_tensor t{};
  t.fp_lo = lo;
  t.fp_hi = ~lo;
  t.shape = shape;
  t.ndim = 1;
  t.dtype = OPGUARD_DTYPE_FLOAT32;
  t.device = -1;
  return t;
}

opguard_tensor OnDevice(Core& core, const std::vector<float>& v, const int64_t* shape, void* stream) {
  opguard_tensor t{};
  uint64_t handle = 0;
  EXPECT_EQ(core.FingerprintDeviceAsync(DeviceTensor(v, shape), true, stream, &handle), OPGUARD_OK);
  opguard_tensor_set_pending(&t, handle);
  t.shape = shape;
  t.ndim = 1;
  t.dtype = OPGUARD_DTYPE_FLOAT32;
  t.device = 0;
  return t;
}

opguard_counters Counters(Core& core) {
  opguard_counters c{};
  c.struct_size = sizeof(c);
  core.GetCounters(&c);
  return c;
}

std::vector<uint64_t> LaneOrder(const Received& r, uint32_t lane) {
  std::vector<uint64_t> order;
  for (const auto& op : r.ops) {
    if (op.lane == lane) order.push_back(op.op_index);
  }
  return order;
}

TEST_F(PendingCoreTest, HeldRecordsArriveCompleteAndInRecordOrder) {
  TestDevice dev(16);
  auto core = StartCore(&dev);
  ASSERT_TRUE(core);
  void* s1 = dev.Stream(1);
  void* s2 = dev.Stream(2);
  std::vector<float> x(1000), y(257);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.25f;
  for (size_t i = 0; i < y.size(); ++i) y[i] = -static_cast<float>(i);
  int64_t nx = 1000, ny = 257;
  // Lane 0: op 0 waits on stream 1, op 1 has plain bits, op 2 waits on
  // stream 2; lane 1: op 0 plain (recorded after lane 0's held op 0).
  opguard_tensor tx = OnDevice(*core, x, &nx, s1);
  ASSERT_EQ(RecordOp(*core, 0, tx), OPGUARD_OK);
  ASSERT_EQ(RecordOp(*core, 0, Plain(77, &nx)), OPGUARD_OK);
  opguard_tensor ty = OnDevice(*core, y, &ny, s2);
  ASSERT_EQ(RecordOp(*core, 0, ty, &tx), OPGUARD_OK);  // tx again, as an input
  ASSERT_EQ(RecordOp(*core, 1, Plain(88, &ny)), OPGUARD_OK);
  opguard_counters c = Counters(*core);
  EXPECT_EQ(c.fp_pending, 2u);
  EXPECT_EQ(c.records_held, 4u);

  // Stream 2 finishes first: op 2's bits are in, but op 0 still waits, and
  // everything recorded after it waits too.
  dev.RunStream(s2);
  EXPECT_EQ(core->Flush(100), OPGUARD_ERR_TIMEOUT);
  EXPECT_EQ(daemon_->Snapshot().records, 0u);
  dev.RunStream(s1);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.ops.size(), 4u);
  EXPECT_EQ(LaneOrder(r, 0), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(LaneOrder(r, 1), (std::vector<uint64_t>{0}));
  auto fx = CpuFp(x), fy = CpuFp(y);
  EXPECT_EQ(r.ops[0].out_lo, fx.digest.lo);
  EXPECT_EQ(r.ops[0].out_hi, fx.digest.hi);
  EXPECT_TRUE(r.ops[0].out_has_stats);
  EXPECT_EQ(r.ops[1].out_lo, 77u);
  EXPECT_EQ(r.ops[2].out_lo, fy.digest.lo);
  EXPECT_EQ(r.ops[2].in_lo, fx.digest.lo);
  EXPECT_TRUE(r.gaps.empty());
  c = Counters(*core);
  EXPECT_EQ(c.fp_pending, 0u);
  EXPECT_EQ(c.fp_resolved, 2u);
  EXPECT_EQ(c.records_held, 0u);
  EXPECT_EQ(c.records_acked, 4u);
}

TEST_F(PendingCoreTest, FingerprintReadsTheOpResultBeforeTheAllocatorReusesTheMemory) {
  TestDevice dev(4);
  auto core = StartCore(&dev);
  ASSERT_TRUE(core);
  void* s = dev.Stream(0);
  std::vector<float> block(64, 0.0f);  // one caching-allocator block
  int64_t n = 64;
  dev.Enqueue(s, [&] { std::fill(block.begin(), block.end(), 1.5f); });  // the op
  ASSERT_EQ(RecordOp(*core, 0, OnDevice(*core, block, &n, s)), OPGUARD_OK);
  // The block is freed and handed to the next op on the same stream.
  dev.Enqueue(s, [&] { std::fill(block.begin(), block.end(), -7.0f); });
  ASSERT_EQ(RecordOp(*core, 0, OnDevice(*core, block, &n, s)), OPGUARD_OK);
  dev.RunStream(s);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.ops.size(), 2u);
  EXPECT_EQ(r.ops[0].out_lo, CpuFp(std::vector<float>(64, 1.5f)).digest.lo);
  EXPECT_EQ(r.ops[1].out_lo, CpuFp(std::vector<float>(64, -7.0f)).digest.lo);
}

TEST_F(PendingCoreTest, FailedFingerprintsBecomeGapsWithTheirReason) {
  TestDevice dev(4);
  auto core = StartCore(&dev);
  ASSERT_TRUE(core);
  void* s = dev.Stream(0);
  auto& v = v_;
  int64_t& n = n_;
  dev.SetCapturing(s, true);
  ASSERT_EQ(RecordOp(*core, 0, OnDevice(*core, v, &n, s)), OPGUARD_OK);  // op 0
  dev.SetCapturing(s, false);
  opguard_tensor late = OnDevice(*core, v, &n, s);
  ASSERT_EQ(RecordOp(*core, 0, late), OPGUARD_OK);  // op 1: its result fails
  ASSERT_EQ(RecordOp(*core, 0, Plain(5, &n)), OPGUARD_OK);  // op 2
  // A collective whose output fingerprint fails: a collective gap.
  opguard_collective coll{};
  coll.struct_size = sizeof(coll);
  coll.phase = OPGUARD_PHASE_COMPLETED;
  coll.kind = OPGUARD_COLL_ALL_REDUCE;
  coll.communicator = 42;
  coll.seq = 3;
  coll.op_index = OPGUARD_AUTO;
  coll.step = OPGUARD_AUTO;
  coll.num_outputs = 1;
  coll.outputs = &late;  // the same failing handle
  ASSERT_EQ(core->RecordCollective(coll, nullptr), OPGUARD_OK);
  opguard_tensor unknown = Plain(0, &n);
  opguard_tensor_set_pending(&unknown, 123456789);
  ASSERT_EQ(RecordOp(*core, 0, unknown), OPGUARD_OK);  // op 3
  dev.FailNextResult("an illegal memory access was encountered");
  dev.RunStream(s);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.ops.size(), 1u);
  EXPECT_EQ(r.ops[0].op_index, 2u);
  EXPECT_TRUE(r.collectives.empty());
  ASSERT_EQ(r.gaps.size(), 4u);
  EXPECT_EQ(r.gaps[0].first_op, 0u);
  EXPECT_EQ(r.gaps[0].reason, "missing fingerprint: cuda graph capture");
  EXPECT_EQ(r.gaps[1].first_op, 1u);
  EXPECT_EQ(r.gaps[1].reason, "missing fingerprint: an illegal memory access was encountered");
  EXPECT_EQ(r.gaps[2].communicator, 42u);
  EXPECT_EQ(r.gaps[2].first_seq, 3u);
  EXPECT_EQ(r.gaps[2].reason, "missing fingerprint: an illegal memory access was encountered");
  EXPECT_EQ(r.gaps[3].first_op, 3u);
  EXPECT_EQ(r.gaps[3].reason, "missing fingerprint: unknown handle");
  opguard_counters c = Counters(*core);
  EXPECT_EQ(c.fp_failed, 2u);
  EXPECT_EQ(c.ops_missing, 3u);
}

TEST_F(PendingCoreTest, NoDeviceMeansGapsNotErrors) {
  auto core = StartCore(nullptr);
  ASSERT_TRUE(core);
  auto& v = v_;
  int64_t& n = n_;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(RecordOp(*core, 0, OnDevice(*core, v, &n, nullptr)), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  EXPECT_TRUE(r.ops.empty());
  ASSERT_EQ(r.gaps.size(), 3u);
  for (const auto& g : r.gaps) EXPECT_EQ(g.reason, "missing fingerprint: no CUDA device");
}

TEST_F(PendingCoreTest, DeviceLimitTurnsTheOverflowIntoAGapWithoutWaiting) {
  config_.max_pending_fp = 2;
  TestDevice dev(2);
  auto core = StartCore(&dev);
  ASSERT_TRUE(core);
  void* s = dev.Stream(0);
  auto& v = v_;
  int64_t& n = n_;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(RecordOp(*core, 0, OnDevice(*core, v, &n, s)), OPGUARD_OK);
  opguard_counters c = Counters(*core);
  EXPECT_EQ(c.fp_pending, 2u);
  EXPECT_EQ(c.fp_refused, 1u);
  dev.RunStream(s);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  EXPECT_EQ(LaneOrder(r, 0), (std::vector<uint64_t>{0, 1}));
  ASSERT_EQ(r.gaps.size(), 1u);
  EXPECT_EQ(r.gaps[0].first_op, 2u);
  EXPECT_EQ(r.gaps[0].reason, "missing fingerprint: pending fingerprint limit");
}

struct Released {
  std::atomic<int> count{0};
  static void Release(void* self) { static_cast<Released*>(self)->count.fetch_add(1); }
};

TEST_F(PendingCoreTest, HostBuffersAreFingerprintedOffTheCallingThread) {
  auto core = StartCore(nullptr);
  ASSERT_TRUE(core);
  std::vector<float> v(4096);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) - 3.0f;
  int64_t n = 4096;
  Released released;
  HostFingerprinter::Job job;
  job.data = v.data();
  job.dtype = OPGUARD_DTYPE_FLOAT32;
  job.shape = {n};
  job.release = &Released::Release;
  job.release_context = &released;
  uint64_t handle = 0;
  ASSERT_EQ(core->FingerprintHostAsync(job, &handle), OPGUARD_OK);
  opguard_tensor t = Plain(0, &n);
  opguard_tensor_set_pending(&t, handle);
  ASSERT_EQ(RecordOp(*core, 0, t), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);
  Received r = daemon_->Snapshot();
  ASSERT_EQ(r.ops.size(), 1u);
  EXPECT_EQ(r.ops[0].out_lo, CpuFp(v).digest.lo);
  EXPECT_EQ(r.ops[0].out_hi, CpuFp(v).digest.hi);
  EXPECT_EQ(released.count.load(), 1);
}

TEST_F(PendingCoreTest, HostLimitRefusesWithoutTakingTheBuffer) {
  config_.max_pending_fp = 1;
  auto core = StartCore(nullptr);
  ASSERT_TRUE(core);
  uint64_t blocker = 0;
  ASSERT_EQ(core->PendingBegin(&blocker), OPGUARD_OK);  // never resolved by the test until later
  std::vector<float> v(16, 1.0f);
  Released released;
  HostFingerprinter::Job job;
  job.data = v.data();
  job.dtype = OPGUARD_DTYPE_FLOAT32;
  job.shape = {16};
  job.release = &Released::Release;
  job.release_context = &released;
  uint64_t handle = 0;
  EXPECT_EQ(core->FingerprintHostAsync(job, &handle), OPGUARD_ERR_DROPPED);
  EXPECT_EQ(released.count.load(), 0) << "nothing taken: the caller fingerprints inline";
  uint64_t again = 0;
  EXPECT_EQ(core->PendingBegin(&again), OPGUARD_ERR_DROPPED);
  opguard_counters c = Counters(*core);
  EXPECT_EQ(c.fp_refused, 2u);
  EXPECT_EQ(core->PendingResolve(blocker, FpResult{1, 2, 0, {}}), OPGUARD_OK);
  EXPECT_EQ(core->PendingResolve(blocker, FpResult{1, 2, 0, {}}), OPGUARD_ERR_INVALID);
  EXPECT_EQ(core->FingerprintHostAsync(job, &handle), OPGUARD_OK);
  ASSERT_EQ(core->Flush(5000), OPGUARD_OK);  // nothing recorded; the worker is done at its pace
  for (int i = 0; i < 500 && released.count.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(released.count.load(), 1);
}

TEST_F(PendingCoreTest, ShutdownSendsWhatNeverResolvedAsGapsWithinItsDeadline) {
  TestDevice dev(4);
  auto core = StartCore(&dev);
  ASSERT_TRUE(core);
  void* s = dev.Stream(0);
  auto& v = v_;
  int64_t& n = n_;
  ASSERT_EQ(RecordOp(*core, 3, Plain(1, &n)), OPGUARD_OK);
  ASSERT_EQ(RecordOp(*core, 3, OnDevice(*core, v, &n, s)), OPGUARD_OK);  // the stream never runs
  ASSERT_EQ(RecordOp(*core, 3, Plain(2, &n)), OPGUARD_OK);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(core->Shutdown(1000), OPGUARD_OK);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500));
  Received r = daemon_->Snapshot();
  EXPECT_EQ(LaneOrder(r, 3), (std::vector<uint64_t>{0, 2}));
  ASSERT_EQ(r.gaps.size(), 1u);
  EXPECT_EQ(r.gaps[0].first_op, 1u);
  EXPECT_EQ(r.gaps[0].reason, "missing fingerprint: shutdown before the fingerprint was ready");
  EXPECT_EQ(r.end_of_run, 1u);
}

}  // namespace
}  // namespace opguard::shim
