// opguard-nccl-rank: one rank of a small NCCL program without PyTorch, for
// the interposer's integration tests and benchmark. It links libnccl (the
// stand-in in tests); the interposer comes in with LD_PRELOAD, as it would
// into any NCCL job. Every result is checked against what it must be, so a
// call the interposer changed fails the program.
//
//   opguard-nccl-rank --rank R --nranks N --rendezvous DIR [--scenario S] [--iterations K]
//
// Rank 0 writes the ncclUniqueId to DIR/id; the others wait for it (30 s).
// Scenarios:
//   all    every collective and point-to-point call, groups (nested), two
//          splits (even/odd ranks; all but rank 0), a shrink (all but the
//          last rank), then destroys them
//   steps  K all-reduces of 1024 floats on the world communicator
//   bench  K all-reduces of 1 float; prints "ns_per_call X"
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int rank = 0, nranks = 0;
int failures = 0;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: wrong result: %s\n", rank, what);
    ++failures;
  }
}

#define NCCL_OK(call)                                                                        \
  do {                                                                                       \
    ncclResult_t r_ = (call);                                                                \
    if (r_ != ncclSuccess) {                                                                 \
      std::fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, ncclGetErrorString(r_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

ncclUniqueId Rendezvous(const std::string& dir) {
  ncclUniqueId id;
  std::string path = dir + "/id";
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof(id.internal));
    std::rename(tmp.c_str(), path.c_str());
    return id;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(id.internal, sizeof(id.internal))) return id;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "rank %d: no id in %s\n", rank, path.c_str());
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Rank r's contribution: element i is r * 1000 + i (exact in float).
std::vector<float> Contribution(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(r * 1000 + int(i));
  return v;
}

void AllCalls(ncclComm_t world) {
  const size_t n = 256;
  const int N = nranks;
  auto mine = Contribution(rank, n);
  std::vector<float> out(n), big(n * N);
  float sum0 = 0;  // element 0 summed over ranks
  for (int r = 0; r < N; ++r) sum0 += float(r * 1000);

  NCCL_OK(ncclAllReduce(mine.data(), out.data(), n, ncclFloat32, ncclSum, world, nullptr));
  Check(out[0] == sum0 && out[5] == sum0 + 5 * N, "all_reduce sum");

  const int root = N - 1;
  NCCL_OK(ncclBroadcast(mine.data(), out.data(), n, ncclFloat32, root, world, nullptr));
  Check(out[3] == float(root * 1000 + 3), "broadcast");

  std::fill(out.begin(), out.end(), -1.0f);
  NCCL_OK(ncclReduce(mine.data(), out.data(), n, ncclFloat32, ncclMax, 0, world, nullptr));
  Check(rank != 0 || out[7] == float((N - 1) * 1000 + 7), "reduce max at root");
  Check(rank == 0 || out[7] == -1.0f, "reduce leaves non-roots alone");

  NCCL_OK(ncclAllGather(mine.data(), big.data(), n, ncclFloat32, world, nullptr));
  Check(big[n * (N - 1) + 2] == float((N - 1) * 1000 + 2), "all_gather");

  std::vector<float> shards(n * N);
  for (size_t i = 0; i < shards.size(); ++i) shards[i] = float(i);
  NCCL_OK(ncclReduceScatter(shards.data(), out.data(), n, ncclFloat32, ncclSum, world, nullptr));
  Check(out[1] == float((rank * n + 1) * N), "reduce_scatter");

  std::vector<int32_t> to_all(n * N), from_all(n * N);
  for (int r = 0; r < N; ++r)
    to_all[r * n] = rank * 100 + r;  // first element of block r: "from me to r"
  NCCL_OK(ncclAlltoAll(to_all.data(), from_all.data(), n, ncclInt32, world, nullptr));
  Check(from_all[(N - 1) * n] == (N - 1) * 100 + rank, "all_to_all");

  NCCL_OK(ncclGather(mine.data(), big.data(), n, ncclFloat32, 0, world, nullptr));
  Check(rank != 0 || N < 2 || big[n + 4] == float(1000 + 4), "gather at root");

  NCCL_OK(ncclScatter(shards.data(), out.data(), n, ncclFloat32, 1 % N, world, nullptr));
  Check(out[0] == float(rank * n), "scatter");

  std::vector<double> buff(n, rank == 0 ? 2.5 : 0.0);
  NCCL_OK(ncclBcast(buff.data(), n, ncclFloat64, 0, world, nullptr));
  Check(buff[n - 1] == 2.5, "bcast in place");

  // Nested groups: nothing runs before the outermost GroupEnd.
  std::vector<float> in_place = Contribution(rank, n);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(in_place.data(), in_place.data(), n, ncclFloat32, ncclSum, world, nullptr));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllGather(mine.data(), big.data(), n, ncclFloat32, world, nullptr));
  NCCL_OK(ncclGroupEnd());
  Check(in_place[0] == float(rank * 1000), "group runs at the outermost GroupEnd");
  NCCL_OK(ncclGroupEnd());
  Check(in_place[0] == sum0, "grouped all_reduce in place");

  // A ring of sends and receives in one group.
  std::vector<int64_t> token(16, rank), got(16, -1);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(token.data(), token.size(), ncclInt64, (rank + 1) % N, world, nullptr));
  NCCL_OK(ncclRecv(got.data(), got.size(), ncclInt64, (rank + N - 1) % N, world, nullptr));
  NCCL_OK(ncclGroupEnd());
  Check(got[15] == (rank + N - 1) % N, "send/recv ring");

  // Split by parity (key reverses the order), then everyone but rank 0.
  ncclComm_t parity = nullptr, rest = nullptr;
  NCCL_OK(ncclCommSplit(world, rank % 2, -rank, &parity, nullptr));
  int prank = -1, psize = 0;
  NCCL_OK(ncclCommUserRank(parity, &prank));
  NCCL_OK(ncclCommCount(parity, &psize));
  Check(psize == (N + 1 - rank % 2) / 2, "split size");
  std::vector<int32_t> one(4, 1), count(4, 0);
  NCCL_OK(ncclAllReduce(one.data(), count.data(), 4, ncclInt32, ncclSum, parity, nullptr));
  Check(count[0] == psize, "all_reduce on a split");

  NCCL_OK(ncclCommSplit(world, rank == 0 ? NCCL_SPLIT_NOCOLOR : 0, rank, &rest, nullptr));
  Check((rank == 0) == (rest == nullptr), "NOCOLOR gets no communicator");
  if (rest != nullptr) {
    NCCL_OK(ncclAllReduce(one.data(), count.data(), 4, ncclInt32, ncclSum, rest, nullptr));
    Check(count[0] == N - 1, "all_reduce on the second split");
    NCCL_OK(ncclCommDestroy(rest));
  }
  NCCL_OK(ncclCommDestroy(parity));

  // Shrink away the last rank (it does not take part).
  if (rank != N - 1) {
    ncclComm_t shrunk = nullptr;
    int last = N - 1;
    NCCL_OK(ncclCommShrink(world, &last, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT));
    NCCL_OK(ncclAllReduce(one.data(), count.data(), 4, ncclInt32, ncclSum, shrunk, nullptr));
    Check(count[0] == N - 1, "all_reduce on a shrunk communicator");
    NCCL_OK(ncclCommDestroy(shrunk));
  }
}

void Steps(ncclComm_t world, int iterations) {
  std::vector<float> grad(1024), avg(1024);
  for (int step = 0; step < iterations; ++step) {
    for (size_t i = 0; i < grad.size(); ++i)
      grad[i] = float(step) + float(rank) * 0.5f + float(i) * 0.25f;
    NCCL_OK(
        ncclAllReduce(grad.data(), avg.data(), grad.size(), ncclFloat32, ncclAvg, world, nullptr));
  }
}

void Bench(ncclComm_t world, int iterations) {
  float x = 1.0f, y = 0.0f;
  for (int i = 0; i < 1000; ++i)
    NCCL_OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, world, nullptr));
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i)
    NCCL_OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, world, nullptr));
  double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  std::printf("ns_per_call %.1f\n", ns / iterations);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, scenario = "all";
  int iterations = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--rank")
      rank = std::atoi(argv[i + 1]);
    else if (a == "--nranks")
      nranks = std::atoi(argv[i + 1]);
    else if (a == "--rendezvous")
      dir = argv[i + 1];
    else if (a == "--scenario")
      scenario = argv[i + 1];
    else if (a == "--iterations")
      iterations = std::atoi(argv[i + 1]);
  }
  if (nranks < 1 || rank < 0 || rank >= nranks || dir.empty()) {
    std::fprintf(stderr,
                 "usage: %s --rank R --nranks N --rendezvous DIR [--scenario all|steps|bench] "
                 "[--iterations K]\n",
                 argv[0]);
    return 2;
  }
  ncclUniqueId id = Rendezvous(dir);
  ncclComm_t world = nullptr;
  NCCL_OK(ncclCommInitRank(&world, nranks, id, rank));
  if (scenario == "all") {
    AllCalls(world);
  } else if (scenario == "steps") {
    Steps(world, iterations);
  } else if (scenario == "bench") {
    Bench(world, iterations);
  } else {
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  NCCL_OK(ncclCommFinalize(world));
  NCCL_OK(ncclCommDestroy(world));
  if (failures != 0) return 1;
  std::printf("rank %d ok\n", rank);
  return 0;
}
