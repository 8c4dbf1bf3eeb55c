// libopguard_nccl.so recording (OPGUARD=1) in front of the stand-in
// libnccl.so.2, in one process, against a fake daemon that keeps every
// record: what each call records, sequence numbers, group semantics,
// communicator identities, refused calls. Several ranks in separate
// processes are tested against a real daemon in tests/integration/nccl.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "fake_daemon.h"
#include "identity.h"
#include "opguard/shim.h"

namespace opguard::nccl {
namespace {

using shim::testing::FakeDaemon;
using shim::testing::ReceivedCollective;

FakeDaemon* daemon = nullptr;

class Environment : public ::testing::Environment {
 public:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("opguard-nccl-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::string endpoint = "ipc://" + (dir_ / "ingest.sock").string();
    daemon = new FakeDaemon(endpoint);
    ASSERT_TRUE(daemon->Start());
    ::setenv("OPGUARD", "1", 1);
    ::setenv("OPGUARD_ENDPOINT", endpoint.c_str(), 1);
    ::setenv("OPGUARD_RUN", "nccl-unit", 1);
    ::setenv("OPGUARD_BATCH_INTERVAL_MS", "5", 1);
    ASSERT_EQ(opguard_init(), 1);
  }
  void TearDown() override {
    opguard_shutdown(2000);
    daemon->Stop();
    delete daemon;
    std::filesystem::remove_all(dir_);
  }

 private:
  std::filesystem::path dir_;
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new Environment);

uint64_t FingerprintLo(const void* data, uint8_t dtype, int64_t elements) {
  opguard_tensor t{};
  EXPECT_EQ(opguard_fingerprint_host(data, dtype, &elements, 1, nullptr, &t), OPGUARD_OK);
  return t.fp_lo;
}

// Every record of `communicator` the daemon has, once `expected` arrived.
std::vector<ReceivedCollective> RecordsOf(uint64_t communicator, size_t expected) {
  EXPECT_EQ(opguard_flush(5000), OPGUARD_OK);
  std::vector<ReceivedCollective> out;
  daemon->WaitFor(
      [&](const shim::testing::Received& r) {
        out.clear();
        for (const auto& c : r.collectives) {
          if (c.communicator == communicator) out.push_back(c);
        }
        return out.size() >= expected;
      },
      5000);
  return out;
}

// A communicator of one rank: every collective runs at once.
struct Solo {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  uint64_t identity = 0;
  Solo() {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
    identity = IdentityOfUniqueIds(&id, sizeof(id));
  }
  ~Solo() { EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess); }
};

TEST(NcclRecording, TheTestLinksTheInterposerAheadOfLibnccl) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&ncclAllReduce), &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find("libopguard_nccl.so"), std::string::npos)
      << info.dli_fname;
}

TEST(NcclRecording, EachCallIsRecordedEnteredThenCompletedWithItsArgumentsAndFingerprints) {
  Solo solo;
  std::vector<float> in(100), out(100, 0.0f);
  for (int i = 0; i < 100; ++i) in[i] = 0.5f * float(i);
  std::vector<int32_t> ints(33, 7), ints_out(33, 0);
  ASSERT_EQ(ncclAllReduce(in.data(), out.data(), 100, ncclFloat32, ncclMax, solo.comm, nullptr),
            ncclSuccess);
  ASSERT_EQ(ncclBroadcast(ints.data(), ints_out.data(), 33, ncclInt32, 0, solo.comm, nullptr),
            ncclSuccess);
  ASSERT_EQ(ncclReduceScatter(in.data(), out.data(), 100, ncclFloat32, ncclSum, solo.comm, nullptr),
            ncclSuccess);

  auto records = RecordsOf(solo.identity, 6);
  ASSERT_EQ(records.size(), 6u);
  struct Expected {
    uint8_t kind, dtype, reduce_op;
    uint64_t count;
    int32_t root;
    uint64_t in_lo, out_lo;
  };
  const Expected expected[] = {
      {OPGUARD_COLL_ALL_REDUCE, OPGUARD_DTYPE_FLOAT32, 2, 100, -1,
       FingerprintLo(in.data(), OPGUARD_DTYPE_FLOAT32, 100),
       FingerprintLo(in.data(), OPGUARD_DTYPE_FLOAT32, 100)},
      {OPGUARD_COLL_BROADCAST, OPGUARD_DTYPE_INT32, 255, 33, 0,
       FingerprintLo(ints.data(), OPGUARD_DTYPE_INT32, 33),
       FingerprintLo(ints.data(), OPGUARD_DTYPE_INT32, 33)},
      {OPGUARD_COLL_REDUCE_SCATTER, OPGUARD_DTYPE_FLOAT32, 0, 100, -1,
       FingerprintLo(in.data(), OPGUARD_DTYPE_FLOAT32, 100),
       FingerprintLo(in.data(), OPGUARD_DTYPE_FLOAT32, 100)},
  };
  for (size_t i = 0; i < records.size(); ++i) {
    const ReceivedCollective& r = records[i];
    const Expected& e = expected[i / 2];
    SCOPED_TRACE(i);
    EXPECT_EQ(r.seq, i / 2);
    EXPECT_EQ(r.phase, i % 2 == 0 ? OPGUARD_PHASE_ENTERED : OPGUARD_PHASE_COMPLETED);
    EXPECT_EQ(r.kind, e.kind);
    EXPECT_EQ(r.dtype, e.dtype);
    EXPECT_EQ(r.reduce_op, e.reduce_op);
    EXPECT_EQ(r.count, e.count);
    EXPECT_EQ(r.root, e.root);
    EXPECT_EQ(r.inputs, 1u);
    EXPECT_EQ(r.in_lo, e.in_lo);
    EXPECT_EQ(r.outputs, i % 2 == 0 ? 0u : 1u);
    if (i % 2 == 1) {
      EXPECT_EQ(r.out_lo, e.out_lo);
    }
  }
  EXPECT_EQ(daemon->Snapshot().communicators.count(solo.identity), 1u);
}

TEST(NcclRecording, GroupedCallsAreRecordedWhenTheOutermostGroupEndIssuesThem) {
  Solo solo;
  std::vector<float> buf(64, 2.0f), gathered(64);
  const uint64_t before = FingerprintLo(buf.data(), OPGUARD_DTYPE_FLOAT32, 64);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), 64, ncclFloat32, ncclSum, solo.comm, nullptr),
            ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllGather(buf.data(), gathered.data(), 64, ncclFloat32, solo.comm, nullptr),
            ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  // Nothing was issued yet, so nothing is recorded yet.
  ASSERT_EQ(opguard_flush(5000), OPGUARD_OK);
  for (const auto& c : daemon->Snapshot().collectives) EXPECT_NE(c.communicator, solo.identity);
  // The application may still write its buffers before the group ends.
  std::fill(buf.begin(), buf.end(), 3.0f);
  const uint64_t issued = FingerprintLo(buf.data(), OPGUARD_DTYPE_FLOAT32, 64);
  ASSERT_NE(before, issued);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);

  auto records = RecordsOf(solo.identity, 4);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].kind, OPGUARD_COLL_ALL_REDUCE);
  EXPECT_EQ(records[0].seq, 0u);
  EXPECT_EQ(records[0].in_lo, issued);  // the input as issued, not as it was at the call
  EXPECT_EQ(records[1].out_lo, issued);
  EXPECT_EQ(records[2].kind, OPGUARD_COLL_ALL_GATHER);
  EXPECT_EQ(records[2].seq, 1u);
  EXPECT_EQ(records[3].out_lo, FingerprintLo(gathered.data(), OPGUARD_DTYPE_FLOAT32, 64));
  // Entered carries the time of the call, Completed the time after GroupEnd.
  EXPECT_LE(records[0].time_ns, records[2].time_ns);
  EXPECT_LE(records[2].time_ns, records[3].time_ns);
}

TEST(NcclRecording, RefusedCallsReturnNcclsOwnCodeAndAreNotRecordedOrNumbered) {
  Solo solo;
  std::vector<float> a(8, 1.0f), b(8);
  struct Case {
    const char* what;
    ncclResult_t interposed, direct;
  };
  const Case cases[] = {
      {"NULL comm", ncclAllReduce(a.data(), b.data(), 8, ncclFloat32, ncclSum, nullptr, nullptr),
       pncclAllReduce(a.data(), b.data(), 8, ncclFloat32, ncclSum, nullptr, nullptr)},
      {"bad dtype",
       ncclAllReduce(a.data(), b.data(), 8, ncclDataType_t(99), ncclSum, solo.comm, nullptr),
       pncclAllReduce(a.data(), b.data(), 8, ncclDataType_t(99), ncclSum, solo.comm, nullptr)},
      {"bad op",
       ncclAllReduce(a.data(), b.data(), 8, ncclFloat32, ncclRedOp_t(77), solo.comm, nullptr),
       pncclAllReduce(a.data(), b.data(), 8, ncclFloat32, ncclRedOp_t(77), solo.comm, nullptr)},
      {"root out of range",
       ncclBroadcast(a.data(), b.data(), 8, ncclFloat32, 3, solo.comm, nullptr),
       pncclBroadcast(a.data(), b.data(), 8, ncclFloat32, 3, solo.comm, nullptr)},
      {"NULL buffer", ncclAllGather(nullptr, b.data(), 8, ncclFloat32, solo.comm, nullptr),
       pncclAllGather(nullptr, b.data(), 8, ncclFloat32, solo.comm, nullptr)},
      {"peer out of range", ncclSend(a.data(), 8, ncclFloat32, 1, solo.comm, nullptr),
       pncclSend(a.data(), 8, ncclFloat32, 1, solo.comm, nullptr)},
      {"GroupEnd without GroupStart", ncclGroupEnd(), pncclGroupEnd()},
  };
  for (const Case& c : cases) {
    EXPECT_NE(c.interposed, ncclSuccess) << c.what;
    EXPECT_EQ(c.interposed, c.direct) << c.what;
  }
  ASSERT_EQ(ncclAllReduce(a.data(), b.data(), 8, ncclFloat32, ncclSum, solo.comm, nullptr),
            ncclSuccess);
  auto records = RecordsOf(solo.identity, 2);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].seq, 0u);
  EXPECT_EQ(records[1].seq, 0u);
}

TEST(NcclRecording, SplitsAndPointToPointChannelsGetIdentitiesEveryMemberDerivesAlike) {
  Solo solo;
  ncclComm_t first = nullptr, none = nullptr, third = nullptr;
  ASSERT_EQ(ncclCommSplit(solo.comm, 3, 0, &first, nullptr), ncclSuccess);
  ASSERT_EQ(ncclCommSplit(solo.comm, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr), ncclSuccess);
  ASSERT_EQ(none, nullptr);
  ASSERT_EQ(ncclCommSplit(solo.comm, 3, 0, &third, nullptr), ncclSuccess);
  int32_t x = 5, y = 0;
  ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, first, nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, third, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(&x, 1, ncclInt32, 0, third, nullptr), ncclSuccess);
  ASSERT_EQ(ncclRecv(&y, 1, ncclInt32, 0, third, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(y, 5);

  const uint64_t first_id = IdentityOfSplit(solo.identity, 3, 0);
  const uint64_t third_id = IdentityOfSplit(solo.identity, 3, 2);  // the NOCOLOR split counts too
  EXPECT_EQ(RecordsOf(first_id, 2).size(), 2u);
  EXPECT_EQ(RecordsOf(third_id, 2).size(), 2u);
  // A send and the receive it matches share a channel and a number.
  auto channel = RecordsOf(IdentityOfChannel(third_id, 0, 0), 4);
  ASSERT_EQ(channel.size(), 4u);
  EXPECT_EQ(channel[0].kind, OPGUARD_COLL_SEND);
  EXPECT_EQ(channel[2].kind, OPGUARD_COLL_RECV);
  EXPECT_EQ(channel[0].seq, 0u);
  EXPECT_EQ(channel[2].seq, 0u);
  EXPECT_EQ(channel[0].in_lo, channel[3].out_lo);  // what was sent is what was received
  EXPECT_EQ(ncclCommDestroy(first), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(third), ncclSuccess);
}

TEST(NcclRecording, ConfiguredAndScalableInitsTakeTheirIdentityFromAllTheirIds) {
  ncclUniqueId ids[2];
  ASSERT_EQ(ncclGetUniqueId(&ids[0]), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&ids[1]), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = "tp0";
  ncclComm_t configured = nullptr, scalable = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&configured, 1, ids[0], 0, &config), ncclSuccess);
  ASSERT_EQ(ncclCommInitRankScalable(&scalable, 1, 0, 2, ids, nullptr), ncclSuccess);
  int8_t x = 3, y = 0;
  ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt8, ncclSum, configured, nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt8, ncclSum, scalable, nullptr), ncclSuccess);
  EXPECT_EQ(RecordsOf(IdentityOfUniqueIds(&ids[0], sizeof(ids[0])), 2).size(), 2u);
  EXPECT_EQ(RecordsOf(IdentityOfUniqueIds(ids, sizeof(ids)), 2).size(), 2u);
  EXPECT_EQ(ncclCommDestroy(configured), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(scalable), ncclSuccess);
}

TEST(NcclRecording, OnlyOneMemberOfACommunicatorIsRecordedPerProcess) {
  ncclComm_t comms[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess);
  std::vector<double> a(16, 1.0), b(16, 2.0), ra(16), rb(16);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(a.data(), ra.data(), 16, ncclFloat64, ncclSum, comms[0], nullptr),
            ncclSuccess);
  ASSERT_EQ(ncclAllReduce(b.data(), rb.data(), 16, ncclFloat64, ncclSum, comms[1], nullptr),
            ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ra[0], 3.0);
  EXPECT_EQ(rb[15], 3.0);
  ASSERT_EQ(opguard_flush(5000), OPGUARD_OK);
  const uint64_t a_lo = FingerprintLo(a.data(), OPGUARD_DTYPE_FLOAT64, 16);
  size_t entered = 0;
  for (const auto& c : daemon->Snapshot().collectives) {
    if (c.kind == OPGUARD_COLL_ALL_REDUCE && c.dtype == OPGUARD_DTYPE_FLOAT64 &&
        c.phase == OPGUARD_PHASE_ENTERED) {
      ++entered;
      EXPECT_EQ(c.in_lo, a_lo);  // the first member's
    }
  }
  EXPECT_EQ(entered, 1u);
  EXPECT_EQ(ncclCommDestroy(comms[0]), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
}

}  // namespace
}  // namespace opguard::nccl
