// libopguard_nccl.so with OPGUARD unset, in front of the stand-in
// libnccl.so.2: every call is forwarded with its arguments and returns
// NCCL's own result, and nothing else happens: the shim is not even loaded,
// no thread starts.
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

int Threads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Two ranks on two threads of this process.
struct Pair {
  ncclComm_t comms[2] = {nullptr, nullptr};
  Pair() {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::thread other([&] { EXPECT_EQ(ncclCommInitRank(&comms[1], 2, id, 1), ncclSuccess); });
    EXPECT_EQ(ncclCommInitRank(&comms[0], 2, id, 0), ncclSuccess);
    other.join();
  }
  ~Pair() {
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  // Runs f(rank, comm) on both ranks at once.
  template <typename F>
  void Both(F f) {
    std::thread other([&] { f(1, comms[1]); });
    f(0, comms[0]);
    other.join();
  }
};

TEST(NcclForwarding, TheTestLinksTheInterposerAheadOfLibnccl) {
  ASSERT_EQ(std::getenv("OPGUARD"), nullptr) << "run without OPGUARD";
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&ncclAllReduce), &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find("libopguard_nccl.so"), std::string::npos)
      << info.dli_fname;
}

TEST(NcclForwarding, CollectivesComputeAndNothingElseStarts) {
  const int threads = Threads();
  {
    Pair pair;
    pair.Both([](int rank, ncclComm_t comm) {
      std::vector<int64_t> in(10, rank + 1), out(10), gathered(20);
      EXPECT_EQ(ncclAllReduce(in.data(), out.data(), 10, ncclInt64, ncclProd, comm, nullptr),
                ncclSuccess);
      EXPECT_EQ(out[9], 2);
      EXPECT_EQ(ncclGroupStart(), ncclSuccess);
      EXPECT_EQ(ncclAllGather(in.data(), gathered.data(), 10, ncclInt64, comm, nullptr),
                ncclSuccess);
      EXPECT_EQ(ncclSend(in.data(), 10, ncclInt64, 1 - rank, comm, nullptr), ncclSuccess);
      EXPECT_EQ(ncclRecv(out.data(), 10, ncclInt64, 1 - rank, comm, nullptr), ncclSuccess);
      EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
      EXPECT_EQ(gathered[0], 1);
      EXPECT_EQ(gathered[19], 2);
      EXPECT_EQ(out[0], 2 - rank);
      ncclComm_t half = nullptr;
      EXPECT_EQ(ncclCommSplit(comm, rank, 0, &half, nullptr), ncclSuccess);
      int size = 0;
      EXPECT_EQ(ncclCommCount(half, &size), ncclSuccess);
      EXPECT_EQ(size, 1);
      EXPECT_EQ(ncclCommDestroy(half), ncclSuccess);
    });
  }
  EXPECT_EQ(Threads(), threads);
  EXPECT_EQ(dlopen("libopguard_shim.so.1", RTLD_LAZY | RTLD_NOLOAD), nullptr);
}

TEST(NcclForwarding, ErrorsAreNcclsOwn) {
  Pair pair;
  float a[4] = {1, 2, 3, 4}, b[4];
  EXPECT_EQ(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, nullptr, nullptr),
            pncclAllReduce(a, b, 4, ncclFloat32, ncclSum, nullptr, nullptr));
  EXPECT_EQ(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(a, b, 4, ncclFloat32, 2, pair.comms[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclRecv(b, 4, ncclDataType_t(-1), 1, pair.comms[0], nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  ncclComm_t comm = nullptr;
  ncclUniqueId id{};
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 5), pncclCommInitRank(&comm, 2, id, 5));
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 5), ncclInvalidArgument);
  EXPECT_EQ(ncclCommSplit(nullptr, 0, 0, &comm, nullptr),
            pncclCommSplit(nullptr, 0, 0, &comm, nullptr));
  EXPECT_EQ(ncclCommDestroy(nullptr), pncclCommDestroy(nullptr));
}

}  // namespace
