// The kernel ledger fed with activity buffers laid out from the real
// cupti_activity.h record structs (CUpti_ActivityKernel10 and
// CUpti_ActivityExternalCorrelation, the versions CUDA 13's header defines),
// delivered in several buffers, out of launch order, across ops and streams,
// as CUPTI's completion callback would hand them over.
#include "kernel_ledger.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace opguard::shim::cupti {
namespace {

// A buffer of activity records, each 8-byte aligned as CUPTI lays them out.
class ActivityBuffer {
 public:
  void Kernel(uint32_t correlation_id, const char* name, uint32_t stream) {
    CUpti_ActivityKernel10 k{};
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.correlationId = correlation_id;
    k.streamId = stream;
    k.name = name;
    Append(k);
  }
  void External(uint64_t key, uint32_t correlation_id,
                CUpti_ExternalCorrelationKind kind = kOpCorrelationKind) {
    CUpti_ActivityExternalCorrelation x{CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, kind, key, correlation_id, 0};
    Append(x);
  }
  // An API record: CUPTI emits one per runtime/driver call; the ledger skips it.
  void Api(uint32_t correlation_id) {
    CUpti_ActivityAPI a{};
    a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    a.correlationId = correlation_id;
    Append(a);
  }
  // What a completion callback does with it: every record, in buffer order.
  void DeliverTo(KernelLedger& ledger) const {
    size_t offset = 0;
    while (offset < bytes_.size()) {
      const auto* record = reinterpret_cast<const CUpti_Activity*>(bytes_.data() + offset);
      ledger.OnRecord(record);
      offset += RecordSize(record->kind);
    }
  }

 private:
  static size_t RecordSize(CUpti_ActivityKind kind) {
    switch (kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return Aligned(sizeof(CUpti_ActivityKernel10));
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return Aligned(sizeof(CUpti_ActivityExternalCorrelation));
      default: return Aligned(sizeof(CUpti_ActivityAPI));
    }
  }
  static size_t Aligned(size_t n) { return (n + 7) & ~size_t{7}; }
  template <typename Record>
  void Append(const Record& record) {
    size_t at = bytes_.size();
    bytes_.resize(at + Aligned(sizeof record), 0);
    std::memcpy(bytes_.data() + at, &record, sizeof record);
  }
  std::vector<uint8_t> bytes_;  // operator new: aligned for any record
};

// One forced flush: CUPTI hands over `buffers` inside it.
void Flush(KernelLedger& ledger, const std::vector<const ActivityBuffer*>& buffers, size_t dropped = 0) {
  ledger.FlushStarted();
  for (const ActivityBuffer* b : buffers) b->DeliverTo(ledger);
  ledger.FlushDelivered(dropped);
}

// Two flushes that deliver nothing: a kernel record still without its
// external record after them counts as unattributed.
void FlushTwiceEmpty(KernelLedger& ledger) {
  Flush(ledger, {});
  Flush(ledger, {});
}

std::vector<std::string> Names(const KernelList& list) {
  return std::vector<std::string>(list.names.begin(), list.names.end());
}

// Kernel names CUPTI would give: mangled C++ and an extern "C" one.
constexpr const char* kGemm = "_Z12gemm_128x128PKfS0_Pfi";   // gemm_128x128(float const*, float const*, float*, int)
constexpr const char* kRelu = "_Z4reluPfi";                  // relu(float*, int)
constexpr const char* kReduce = "reduce_kernel";

TEST(KernelLedger, OpsAcrossStreamsAndBuffersGetTheirKernelsInLaunchOrder) {
  KernelLedger ledger;
  const uint64_t a = OpKey(0, 5), b = OpKey(0, 6), c = OpKey(1, 2);
  // Launch order (correlation ids): a: 100 gemm (stream 7), 101 relu
  // (stream 13), 102 a cudaMemsetAsync (no kernel), 103 reduce (stream 7);
  // c (another thread): 104 relu; b: 105 gemm, 106 gemm.
  ActivityBuffer first, second, third;
  first.External(a, 100);
  first.Api(100);
  first.External(a, 101);
  first.Api(101);
  first.External(a, 102);
  first.Api(102);
  first.Kernel(101, kRelu, 13);  // finished before the gemm launched earlier
  second.External(a, 103);
  second.External(c, 104);
  second.External(b, 105);
  second.Kernel(103, kReduce, 7);
  second.Kernel(100, kGemm, 7);
  second.Kernel(105, kGemm, 7);
  third.External(b, 106);
  third.Kernel(106, kGemm, 13);
  third.Kernel(104, kRelu, 13);

  Flush(ledger, {&first, &second});
  // Records arrived, but nobody said the GPU work completed: not final.
  EXPECT_EQ(ledger.KernelsFor(a).state, KernelsState::kPending);
  ledger.GpuWorkDone(a);
  ledger.GpuWorkDone(b);
  ledger.GpuWorkDone(c);
  EXPECT_TRUE(ledger.waiting_for_flush());
  // Done, but no flush since: still not final.
  EXPECT_EQ(ledger.KernelsFor(a).state, KernelsState::kPending);
  Flush(ledger, {&third});
  EXPECT_FALSE(ledger.waiting_for_flush());

  KernelList la = ledger.KernelsFor(a);
  ASSERT_EQ(la.state, KernelsState::kReady);
  EXPECT_EQ(Names(la), (std::vector<std::string>{"gemm_128x128(float const*, float const*, float*, int)",
                                                 "relu(float*, int)", "reduce_kernel"}));
  KernelList lb = ledger.KernelsFor(b);
  ASSERT_EQ(lb.state, KernelsState::kReady);
  EXPECT_EQ(lb.names.size(), 2u);
  KernelList lc = ledger.KernelsFor(c);
  ASSERT_EQ(lc.state, KernelsState::kReady);
  EXPECT_EQ(Names(lc), (std::vector<std::string>{"relu(float*, int)"}));
  // Handed out once, then forgotten.
  EXPECT_EQ(ledger.KernelsFor(a).state, KernelsState::kPending);
  LedgerCounters n = ledger.counters();
  EXPECT_EQ(n.kernels, 6u);
  EXPECT_EQ(n.ops_ready, 3u);
  EXPECT_EQ(n.unattributed, 0u);
  EXPECT_EQ(n.flushes, 2u);
}

TEST(KernelLedger, KernelRecordBeforeItsExternalRecordIsJoined) {
  KernelLedger ledger;
  const uint64_t op = OpKey(3, 40);
  ActivityBuffer kernels_first, externals_later;
  kernels_first.Kernel(7, kRelu, 1);
  externals_later.External(op, 7);
  ledger.GpuWorkDone(op);
  Flush(ledger, {&kernels_first, &externals_later});
  KernelList l = ledger.KernelsFor(op);
  ASSERT_EQ(l.state, KernelsState::kReady);
  EXPECT_EQ(Names(l), (std::vector<std::string>{"relu(float*, int)"}));
  EXPECT_EQ(ledger.counters().unattributed, 0u);
}

TEST(KernelLedger, GpuWorkDoneDuringAFlushWaitsForTheNextFlush) {
  KernelLedger ledger;
  const uint64_t op = OpKey(0, 1);
  ActivityBuffer early, late;
  early.External(op, 10);
  early.Kernel(10, kGemm, 7);
  late.External(op, 11);
  late.Kernel(11, kRelu, 7);
  ledger.FlushStarted();
  early.DeliverTo(ledger);
  ledger.GpuWorkDone(op);  // observed while that flush was being delivered
  ledger.FlushDelivered(0);
  EXPECT_EQ(ledger.KernelsFor(op).state, KernelsState::kPending);
  EXPECT_TRUE(ledger.waiting_for_flush());
  Flush(ledger, {&late});
  KernelList l = ledger.KernelsFor(op);
  ASSERT_EQ(l.state, KernelsState::kReady);
  EXPECT_EQ(l.names.size(), 2u);
}

TEST(KernelLedger, OpWithoutKernelsIsReadyWithAnEmptyList) {
  KernelLedger ledger;
  const uint64_t copy_only = OpKey(0, 8), host_only = OpKey(0, 9);
  ActivityBuffer buf;
  buf.External(copy_only, 50);  // a cudaMemcpyAsync: external record, no kernel
  buf.Api(50);
  ledger.GpuWorkDone(copy_only);
  ledger.GpuWorkDone(host_only);
  Flush(ledger, {&buf});
  KernelList l = ledger.KernelsFor(copy_only);
  EXPECT_EQ(l.state, KernelsState::kReady);
  EXPECT_TRUE(l.names.empty());
  EXPECT_EQ(ledger.KernelsFor(host_only).state, KernelsState::kReady);
}

TEST(KernelLedger, UnknownCorrelationIdsAreCountedNotAttributed) {
  KernelLedger ledger;
  const uint64_t op = OpKey(2, 3);
  ActivityBuffer buf;
  buf.External(op, 20);
  buf.Kernel(20, kGemm, 7);
  // Launched outside any op (no external record at all).
  buf.Kernel(21, kRelu, 7);
  // Inside torch.profiler's annotation (kind CUSTOM0), not an OpGuard op.
  buf.External(999, 22, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0);
  buf.Kernel(22, kReduce, 13);
  ledger.GpuWorkDone(op);
  Flush(ledger, {&buf});
  KernelList l = ledger.KernelsFor(op);
  ASSERT_EQ(l.state, KernelsState::kReady);
  EXPECT_EQ(l.names.size(), 1u);
  // The profiler's id is no OpGuard op.
  EXPECT_EQ(ledger.KernelsFor(999).state, KernelsState::kPending);
  // Unmatched kernels wait two flushes for a late external record, then count.
  EXPECT_EQ(ledger.counters().unattributed, 0u);
  FlushTwiceEmpty(ledger);
  EXPECT_EQ(ledger.counters().unattributed, 2u);
  EXPECT_EQ(ledger.counters().kernels, 1u);
}

TEST(KernelLedger, DroppedRecordsMakeOpsNotYetFinalUnavailable) {
  KernelLedger ledger;
  const uint64_t finished = OpKey(0, 1), in_flight = OpKey(0, 2), later = OpKey(0, 3);
  ActivityBuffer buf1, buf2;
  buf1.External(finished, 1);
  buf1.Kernel(1, kGemm, 7);
  buf2.External(in_flight, 2);
  buf2.Kernel(2, kRelu, 7);
  ledger.GpuWorkDone(finished);
  Flush(ledger, {&buf1});
  ledger.GpuWorkDone(in_flight);
  // CUPTI had no buffer for 3 records during this flush: they may be
  // in_flight's, so its list cannot be called complete.
  Flush(ledger, {&buf2}, 3);
  EXPECT_TRUE(ledger.off());
  EXPECT_NE(ledger.off_reason().find("dropped 3"), std::string::npos);
  // Final before the drop: complete, still handed out.
  KernelList f = ledger.KernelsFor(finished);
  ASSERT_EQ(f.state, KernelsState::kReady);
  EXPECT_EQ(Names(f), (std::vector<std::string>{"gemm_128x128(float const*, float const*, float*, int)"}));
  EXPECT_EQ(ledger.KernelsFor(in_flight).state, KernelsState::kUnavailable);
  ledger.GpuWorkDone(later);
  EXPECT_EQ(ledger.KernelsFor(later).state, KernelsState::kUnavailable);
  EXPECT_EQ(ledger.counters().dropped_records, 3u);
  EXPECT_EQ(ledger.counters().ops_unavailable, 1u);
}

TEST(KernelLedger, LaunchOrderSurvivesCorrelationIdWrap) {
  KernelLedger ledger;
  const uint64_t op = OpKey(0, 77);
  ActivityBuffer buf;
  buf.External(op, 0xffffffffu);
  buf.External(op, 0u);
  buf.External(op, 0xfffffffeu);
  buf.Kernel(0u, kReduce, 7);
  buf.Kernel(0xffffffffu, kRelu, 7);
  buf.Kernel(0xfffffffeu, kGemm, 7);
  ledger.GpuWorkDone(op);
  Flush(ledger, {&buf});
  KernelList l = ledger.KernelsFor(op);
  ASSERT_EQ(l.state, KernelsState::kReady);
  EXPECT_EQ(Names(l), (std::vector<std::string>{"gemm_128x128(float const*, float const*, float*, int)",
                                                "relu(float*, int)", "reduce_kernel"}));
}

TEST(KernelLedger, ForgottenOpsReleaseTheirCorrelations) {
  KernelLedger ledger;
  const uint64_t dropped = OpKey(0, 4);
  ActivityBuffer before, after;
  before.External(dropped, 30);
  after.Kernel(30, kGemm, 7);  // its kernel, after the caller gave up on it
  ledger.Forget(dropped);
  ledger.GpuWorkDone(dropped);
  ledger.Forget(dropped);
  Flush(ledger, {&before});
  ledger.Forget(dropped);
  Flush(ledger, {&after});
  FlushTwiceEmpty(ledger);
  EXPECT_EQ(ledger.counters().kernels, 0u);
  EXPECT_EQ(ledger.counters().unattributed, 1u);
}

TEST(KernelLedger, TooManyOpenOpsTurnItOff) {
  KernelLedger ledger;
  for (uint64_t i = 0; i <= KernelLedger::kMaxOpenOps; ++i) ledger.GpuWorkDone(OpKey(0, i));
  EXPECT_TRUE(ledger.off());
  EXPECT_NE(ledger.off_reason().find("ops wait"), std::string::npos);
  EXPECT_EQ(ledger.KernelsFor(OpKey(0, 1)).state, KernelsState::kUnavailable);
}

TEST(KernelLedger, NamesAreDemangledWhenTheyCanBe) {
  EXPECT_EQ(ReportedKernelName("_ZN2at6native4fillEPfi"), "at::native::fill(float*, int)");
  EXPECT_EQ(ReportedKernelName("ampere_sgemm_128x64_nn"), "ampere_sgemm_128x64_nn");
  EXPECT_EQ(ReportedKernelName("_Znot-a-valid-name"), "_Znot-a-valid-name");
  EXPECT_EQ(ReportedKernelName(nullptr), "?");
  std::string deep = "_Z1fIiEvT_";  // void f<int>(int)
  // f<int, int, ...>(int): demangled longer than the limit, so kept mangled.
  std::string huge = "_Z1f" + std::string("I") + std::string(3000, 'i') + "EvT_";
  EXPECT_EQ(ReportedKernelName(huge.c_str()), huge);
  EXPECT_EQ(ReportedKernelName(deep.c_str()), "void f<int>(int)");
  std::string enormous(KernelLedger::kMaxNameBytes + 100, 'k');
  EXPECT_EQ(ReportedKernelName(enormous.c_str()).size(), KernelLedger::kMaxNameBytes);
}

TEST(KernelLedger, ANameAddressReusedForAnotherKernelIsNotConfused) {
  KernelLedger ledger;
  char name[32];
  std::strcpy(name, "first_kernel");
  const uint64_t one = OpKey(0, 1), two = OpKey(0, 2);
  ActivityBuffer b1, b2;
  b1.External(one, 1);
  b1.Kernel(1, name, 7);
  ledger.GpuWorkDone(one);
  Flush(ledger, {&b1});
  // The module holding `name` is unloaded, another one's name lands there.
  std::strcpy(name, "second_kernel");
  b2.External(two, 2);
  b2.Kernel(2, name, 7);
  ledger.GpuWorkDone(two);
  Flush(ledger, {&b2});
  EXPECT_EQ(Names(ledger.KernelsFor(one)), (std::vector<std::string>{"first_kernel"}));
  EXPECT_EQ(Names(ledger.KernelsFor(two)), (std::vector<std::string>{"second_kernel"}));
}

}  // namespace
}  // namespace opguard::shim::cupti
