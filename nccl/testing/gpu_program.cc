// opguard-nccl-gpu: one rank of a small NCCL program on a real GPU with the
// real libnccl, for scripts/gpu-check.sh (nccl/testing/gpu_check_nccl.sh):
// every call the interposer wraps, on device buffers and one stream, each
// result copied back and checked. Run under `opguard exec`, the interposer
// must record every call and change no result.
//
//   opguard-nccl-gpu        exit 0: all results right; 1: a wrong result or
//                           a failed call; 77: no CUDA device (skipped)
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

int failures = 0;

#define CHECK_CALL(call, ok_value, what)                                         \
  do {                                                                           \
    auto r_ = (call);                                                            \
    if (r_ != (ok_value)) {                                                      \
      std::fprintf(stderr, "opguard-nccl-gpu: %s failed (%d)\n", what, int(r_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)
#define CUDA(call) CHECK_CALL(call, cudaSuccess, #call)
#define NCCL(call) CHECK_CALL(call, ncclSuccess, #call)

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "opguard-nccl-gpu: wrong result: %s\n", what);
    ++failures;
  }
}

// A device buffer of `n` floats with host copies in and out.
struct Device {
  float* ptr = nullptr;
  size_t n;
  explicit Device(size_t count, float fill = 0.0f) : n(count) {
    CUDA(cudaMalloc(&ptr, n * sizeof(float)));
    std::vector<float> host(n, fill);
    for (size_t i = 0; i < n; ++i) host[i] = fill + float(i);
    CUDA(cudaMemcpy(ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~Device() { cudaFree(ptr); }
  std::vector<float> Host(cudaStream_t s) const {
    std::vector<float> host(n);
    CUDA(cudaStreamSynchronize(s));
    CUDA(cudaMemcpy(host.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
  }
};

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("opguard-nccl-gpu: skipped: no CUDA device\n");
    return 77;
  }
  CUDA(cudaSetDevice(0));
  cudaStream_t s;
  CUDA(cudaStreamCreate(&s));
  ncclUniqueId id;
  ncclComm_t comm;
  NCCL(ncclGetUniqueId(&id));
  NCCL(ncclCommInitRank(&comm, 1, id, 0));
  const size_t n = 1 << 16;  // one rank: every collective is a copy or the identity
  Device in(n, 1.0f), out(n), inout(n, 5.0f);

  NCCL(ncclAllReduce(in.ptr, out.ptr, n, ncclFloat32, ncclSum, comm, s));
  Check(out.Host(s)[7] == 8.0f, "all_reduce");
  NCCL(ncclBroadcast(in.ptr, out.ptr, n, ncclFloat32, 0, comm, s));
  Check(out.Host(s)[9] == 10.0f, "broadcast");
  NCCL(ncclReduce(in.ptr, out.ptr, n, ncclFloat32, ncclMax, 0, comm, s));
  Check(out.Host(s)[n - 1] == float(n), "reduce");
  NCCL(ncclAllGather(in.ptr, out.ptr, n, ncclFloat32, comm, s));
  Check(out.Host(s)[3] == 4.0f, "all_gather");
  NCCL(ncclReduceScatter(in.ptr, out.ptr, n, ncclFloat32, ncclSum, comm, s));
  Check(out.Host(s)[5] == 6.0f, "reduce_scatter");
  NCCL(ncclAlltoAll(in.ptr, out.ptr, n, ncclFloat32, comm, s));
  Check(out.Host(s)[11] == 12.0f, "all_to_all");
  NCCL(ncclGather(in.ptr, out.ptr, n, ncclFloat32, 0, comm, s));
  Check(out.Host(s)[13] == 14.0f, "gather");
  NCCL(ncclScatter(in.ptr, out.ptr, n, ncclFloat32, 0, comm, s));
  Check(out.Host(s)[15] == 16.0f, "scatter");
  NCCL(ncclBcast(inout.ptr, n, ncclFloat32, 0, comm, s));
  Check(inout.Host(s)[0] == 5.0f, "bcast");

  NCCL(ncclGroupStart());
  NCCL(ncclAllReduce(inout.ptr, inout.ptr, n, ncclFloat32, ncclSum, comm, s));
  NCCL(ncclGroupStart());
  NCCL(ncclAllGather(in.ptr, out.ptr, n, ncclFloat32, comm, s));
  NCCL(ncclGroupEnd());
  NCCL(ncclGroupEnd());
  Check(inout.Host(s)[1] == 6.0f && out.Host(s)[2] == 3.0f, "grouped calls");

  NCCL(ncclGroupStart());
  NCCL(ncclSend(in.ptr, n, ncclFloat32, 0, comm, s));
  NCCL(ncclRecv(out.ptr, n, ncclFloat32, 0, comm, s));
  NCCL(ncclGroupEnd());
  Check(out.Host(s)[17] == 18.0f, "send/recv to itself");

  ncclComm_t split;
  NCCL(ncclCommSplit(comm, 0, 0, &split, nullptr));
  NCCL(ncclAllReduce(in.ptr, out.ptr, n, ncclFloat32, ncclSum, split, s));
  Check(out.Host(s)[19] == 20.0f, "all_reduce on a split");

  // A refused call keeps NCCL's own code.
  CHECK_CALL(ncclAllReduce(in.ptr, out.ptr, n, ncclFloat32, ncclSum, nullptr, s),
             ncclInvalidArgument, "a call on a NULL communicator returning ncclInvalidArgument");

  NCCL(ncclCommDestroy(split));
  NCCL(ncclCommFinalize(comm));
  NCCL(ncclCommDestroy(comm));
  CUDA(cudaStreamDestroy(s));
  if (failures != 0) return 1;
  std::printf("opguard-nccl-gpu: 14 collectives on 3 communicators, every result right\n");
  return 0;
}
