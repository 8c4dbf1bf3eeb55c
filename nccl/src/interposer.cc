// libopguard_nccl.so: NCCL's collective, point-to-point, group and
// communicator calls, interposed with LD_PRELOAD (docs/nccl.md). Each
// function forwards to the real one with the same arguments and returns its
// result. With OPGUARD unset or 0 (or OPGUARD_NCCL=0) that is all it does:
// one cached flag test, nothing allocated. Only the nccl* functions below are
// exported (libopguard_nccl.map).
#include <dlfcn.h>
#include <sys/random.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "identity.h"
#include "log.h"
#include "real_nccl.h"
#include "recorder.h"
#include "shim_api.h"

namespace opguard::nccl {

void* ResolveReal(const char* name) {
  void* fn = dlsym(RTLD_NEXT, name);
  if (fn == nullptr) {
    if (void* lib = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD)) fn = dlsym(lib, name);
  }
  if (fn == nullptr) {
    static std::mutex mu;
    static std::set<std::string> logged;
    std::lock_guard<std::mutex> lock(mu);
    if (logged.insert(name).second)
      Log("libnccl's %s was not found; the call fails with ncclInternalError", name);
  }
  return fn;
}

namespace {

bool Wanted() {
  static const bool wanted = [] {
    const char* on = std::getenv("OPGUARD");
    const char* nccl = std::getenv("OPGUARD_NCCL");
    return on != nullptr && *on != '\0' && std::strcmp(on, "0") != 0 &&
           !(nccl != nullptr && std::strcmp(nccl, "0") == 0);
  }();
  return wanted;
}

// The shim decides (it may turn itself off, e.g. after fork or on failure).
bool Recording() {
  if (!Wanted()) return false;
  const ShimApi* shim = Shim();
  return shim != nullptr && shim->enabled() == 1;
}

std::string Hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
  return text;
}

// The communicator's name in reports: the application's commName when it
// gave one (ncclConfig_t, same on every member), else `otherwise`.
std::string NameOf(const ncclConfig_t* config, std::string otherwise) {
  constexpr size_t kNameEnd = offsetof(ncclConfig_t, commName) + sizeof(const char*);
  if (config != nullptr && config->size >= kNameEnd && config->commName != nullptr &&
      config->commName[0] != '\0') {
    return std::string("nccl:") + config->commName;
  }
  return otherwise;
}

bool Created(ncclResult_t r, const ncclComm_t* comm) {
  return (r == ncclSuccess || r == ncclInProgress) && comm != nullptr && *comm != nullptr;
}

void AddInitialised(ncclResult_t r, ncclComm_t* comm, uint64_t identity, const ncclConfig_t* config,
                    int nranks, int rank) {
  if (Created(r, comm)) {
    Recorder::Get().AddCommunicator(*comm, identity, NameOf(config, "nccl-" + Hex(identity)),
                                    nranks, rank);
  }
}

// A buffer of `count` elements, or count x communicator size (kByRanks);
// kRootOnly: only the root's is used.
enum BufferSize { kCount = 0, kByRanks = 1, kRootOnly = 2 };
Call::Buffer Buffer(const void* data, int size = kCount) {
  return {data, true, (size & kByRanks) != 0, (size & kRootOnly) != 0};
}

}  // namespace
}  // namespace opguard::nccl

using opguard::nccl::Call;
using opguard::nccl::Recorder;
using opguard::nccl::Created;
using opguard::nccl::NameOf;
using opguard::nccl::Recording;

#define OPGUARD_NCCL_API extern "C" __attribute__((visibility("default")))

// Resolves the real `fn` once; a libnccl without it fails the call.
#define REAL_OR_FAIL(fn)                   \
  const auto real = OPGUARD_REAL_NCCL(fn); \
  if (real == nullptr) return ncclInternalError

// ---- collectives and point-to-point ----------------------------------------------

// Forwards the call, and records it when recording.
#define FORWARD_COLLECTIVE(fn, make_call, ...) \
  REAL_OR_FAIL(fn);                            \
  if (!Recording()) return real(__VA_ARGS__);  \
  Call call = make_call;                       \
  call.caller = __builtin_return_address(0);   \
  return Recorder::Get().Collective(call, [&] { return real(__VA_ARGS__); })

namespace {
Call Make(uint8_t kind, ncclComm_t comm, ncclDataType_t type, size_t count, int root,
          cudaStream_t stream, Call::Buffer in, Call::Buffer out, bool reduces = false,
          ncclRedOp_t op = ncclSum) {
  Call c;
  c.kind = kind;
  c.comm = comm;
  c.type = type;
  c.count = count;
  c.root = root;
  c.stream = stream;
  c.input = in;
  c.output = out;
  c.reduces = reduces;
  c.op = op;
  return c;
}
}  // namespace

using opguard::nccl::Buffer;
using opguard::nccl::kByRanks;
using opguard::nccl::kRootOnly;

OPGUARD_NCCL_API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                                            ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclAllReduce,
                     Make(OPGUARD_COLL_ALL_REDUCE, comm, type, count, -1, stream, Buffer(send),
                          Buffer(recv), true, op),
                     send, recv, count, type, op, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclReduce(const void* send, void* recv, size_t count,
                                         ncclDataType_t type, ncclRedOp_t op, int root,
                                         ncclComm_t comm, cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclReduce,
                     Make(OPGUARD_COLL_REDUCE, comm, type, count, root, stream, Buffer(send),
                          Buffer(recv, kRootOnly), true, op),
                     send, recv, count, type, op, root, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                                            ncclDataType_t type, int root, ncclComm_t comm,
                                            cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclBroadcast,
                     Make(OPGUARD_COLL_BROADCAST, comm, type, count, root, stream,
                          Buffer(send, kRootOnly), Buffer(recv)),
                     send, recv, count, type, root, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t type, int root,
                                        ncclComm_t comm, cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclBcast,
                     Make(OPGUARD_COLL_BROADCAST, comm, type, count, root, stream,
                          Buffer(buff, kRootOnly), Buffer(buff)),
                     buff, count, type, root, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclAllGather(const void* send, void* recv, size_t count,
                                            ncclDataType_t type, ncclComm_t comm,
                                            cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclAllGather,
                     Make(OPGUARD_COLL_ALL_GATHER, comm, type, count, -1, stream, Buffer(send),
                          Buffer(recv, kByRanks)),
                     send, recv, count, type, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count,
                                                ncclDataType_t type, ncclRedOp_t op,
                                                ncclComm_t comm, cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclReduceScatter,
                     Make(OPGUARD_COLL_REDUCE_SCATTER, comm, type, count, -1, stream,
                          Buffer(send, kByRanks), Buffer(recv), true, op),
                     send, recv, count, type, op, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count,
                                           ncclDataType_t type, ncclComm_t comm,
                                           cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclAlltoAll,
                     Make(OPGUARD_COLL_ALL_TO_ALL, comm, type, count, -1, stream,
                          Buffer(send, kByRanks), Buffer(recv, kByRanks)),
                     send, recv, count, type, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclGather(const void* send, void* recv, size_t count,
                                         ncclDataType_t type, int root, ncclComm_t comm,
                                         cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclGather,
                     Make(OPGUARD_COLL_GATHER, comm, type, count, root, stream, Buffer(send),
                          Buffer(recv, kByRanks | kRootOnly)),
                     send, recv, count, type, root, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclScatter(const void* send, void* recv, size_t count,
                                          ncclDataType_t type, int root, ncclComm_t comm,
                                          cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclScatter,
                     Make(OPGUARD_COLL_SCATTER, comm, type, count, root, stream,
                          Buffer(send, kByRanks | kRootOnly), Buffer(recv)),
                     send, recv, count, type, root, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type,
                                       int peer, ncclComm_t comm, cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclSend,
                     Make(OPGUARD_COLL_SEND, comm, type, count, peer, stream, Buffer(send), {}),
                     send, count, type, peer, comm, stream);
}

OPGUARD_NCCL_API ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer,
                                       ncclComm_t comm, cudaStream_t stream) {
  FORWARD_COLLECTIVE(ncclRecv,
                     Make(OPGUARD_COLL_RECV, comm, type, count, peer, stream, {}, Buffer(recv)),
                     recv, count, type, peer, comm, stream);
}

// ---- groups -------------------------------------------------------------------------

OPGUARD_NCCL_API ncclResult_t ncclGroupStart() {
  REAL_OR_FAIL(ncclGroupStart);
  if (!Recording()) return real();
  return Recorder::Get().GroupStart(real);
}

OPGUARD_NCCL_API ncclResult_t ncclGroupEnd() {
  REAL_OR_FAIL(ncclGroupEnd);
  if (!Recording()) return real();
  return Recorder::Get().GroupEnd(real);
}

// ---- communicators --------------------------------------------------------------------

OPGUARD_NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                               int rank) {
  REAL_OR_FAIL(ncclCommInitRank);
  ncclResult_t r = real(comm, nranks, id, rank);
  if (Recording()) {
    uint64_t identity = opguard::nccl::IdentityOfUniqueIds(&id, sizeof(id));
    opguard::nccl::AddInitialised(r, comm, identity, nullptr, nranks, rank);
  }
  return r;
}

OPGUARD_NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                     int rank, ncclConfig_t* config) {
  REAL_OR_FAIL(ncclCommInitRankConfig);
  ncclResult_t r = real(comm, nranks, id, rank, config);
  if (Recording()) {
    uint64_t identity = opguard::nccl::IdentityOfUniqueIds(&id, sizeof(id));
    opguard::nccl::AddInitialised(r, comm, identity, config, nranks, rank);
  }
  return r;
}

OPGUARD_NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank,
                                                       int nids, ncclUniqueId* ids,
                                                       ncclConfig_t* config) {
  REAL_OR_FAIL(ncclCommInitRankScalable);
  ncclResult_t r = real(comm, nranks, rank, nids, ids, config);
  if (Recording() && ids != nullptr && nids > 0) {
    uint64_t identity =
        opguard::nccl::IdentityOfUniqueIds(ids, sizeof(ncclUniqueId) * size_t(nids));
    opguard::nccl::AddInitialised(r, comm, identity, config, nranks, rank);
  }
  return r;
}

// Every member lives in this process (one thread or one group per device):
// the members agree on an identity drawn here.
OPGUARD_NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  REAL_OR_FAIL(ncclCommInitAll);
  ncclResult_t r = real(comms, ndev, devlist);
  if (Recording() && r == ncclSuccess && comms != nullptr) {
    uint64_t identity = 0;
    if (getrandom(&identity, sizeof(identity), 0) != sizeof(identity)) {
      identity = opguard::nccl::WallNs() ^ reinterpret_cast<uintptr_t>(comms);
    }
    identity = opguard::nccl::IdentityOfUniqueIds(&identity, sizeof(identity));
    for (int i = 0; i < ndev; ++i)
      opguard::nccl::AddInitialised(r, &comms[i], identity, nullptr, ndev, i);
  }
  return r;
}

OPGUARD_NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key,
                                            ncclComm_t* newcomm, ncclConfig_t* config) {
  REAL_OR_FAIL(ncclCommSplit);
  if (!Recording()) return real(comm, color, key, newcomm, config);
  // Counted whether or not this member joins a child: every member of the
  // parent calls the split, so each counts it alike.
  Recorder::Parent parent;
  bool known = Recorder::Get().NextChild(comm, Recorder::kSplit, &parent);
  ncclResult_t r = real(comm, color, key, newcomm, config);
  if (known && color != NCCL_SPLIT_NOCOLOR && Created(r, newcomm)) {
    uint64_t identity = opguard::nccl::IdentityOfSplit(parent.id, color, parent.ordinal);
    std::string name =
        parent.name + "/split" + std::to_string(parent.ordinal) + "." + std::to_string(color);
    Recorder::Get().AddCommunicator(*newcomm, identity, NameOf(config, name), -1, -1);
  }
  return r;
}

OPGUARD_NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int nexclude,
                                             ncclComm_t* newcomm, ncclConfig_t* config, int flags) {
  REAL_OR_FAIL(ncclCommShrink);
  if (!Recording()) return real(comm, exclude, nexclude, newcomm, config, flags);
  Recorder::Parent parent;
  bool known = Recorder::Get().NextChild(comm, Recorder::kShrink, &parent);
  ncclResult_t r = real(comm, exclude, nexclude, newcomm, config, flags);
  if (known && Created(r, newcomm)) {
    std::span<const int> excluded(exclude,
                                  exclude != nullptr && nexclude > 0 ? size_t(nexclude) : 0);
    uint64_t identity = opguard::nccl::IdentityOfShrink(parent.id, parent.ordinal, excluded);
    std::string name = parent.name + "/shrink" + std::to_string(parent.ordinal);
    Recorder::Get().AddCommunicator(*newcomm, identity, NameOf(config, name), -1, -1);
  }
  return r;
}

// The handle may be reused by a later communicator: forget it first.
OPGUARD_NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  REAL_OR_FAIL(ncclCommDestroy);
  if (Recording()) Recorder::Get().RemoveCommunicator(comm);
  return real(comm);
}

OPGUARD_NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  REAL_OR_FAIL(ncclCommAbort);
  if (Recording()) Recorder::Get().RemoveCommunicator(comm);
  return real(comm);
}
