// A test stand-in of libnccl.so.2, built from the real nccl.h, used only by
// the NCCL interposer's tests and benchmark (no GPU here). Ranks are
// processes or threads on one host; buffers are host memory and every
// operation really computes (reductions, gathers, point-to-point copies).
//
// How it works: a communicator is a shared-memory segment named after its
// ncclUniqueId. Each rank owns a staging slot there; a collective copies the
// rank's input into its slot, waits at a barrier, computes its own output
// from every slot and waits at a second barrier. Point-to-point messages go
// through a small ring per ordered pair of ranks. Operations run when they
// are called (host memory needs no stream) or, inside ncclGroupStart/End, at
// the outermost ncclGroupEnd. Argument errors return NCCL's own codes at the
// call, as NCCL does. Limits (a test stand-in): kSlotBytes per rank and
// operation, kMailBytes per message; larger calls return ncclInvalidUsage.
// Every wait gives up after kWaitLimit with ncclRemoteError, so a test whose
// peer died fails instead of hanging.
//
// Fault injection for tests: STAND_IN_NCCL_CORRUPT=R:K:E makes communicator
// rank R's copy of the result of its K-th all-reduce (from 0, per
// communicator) differ in the lowest bit of element E, as a silent data
// corruption on that rank's device would.
#include <fcntl.h>
#include <immintrin.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#define STAND_IN_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr size_t kSlotBytes = size_t{4} << 20;
constexpr size_t kMailBytes = size_t{1} << 20;
constexpr uint32_t kMailDepth = 4;
constexpr auto kWaitLimit = std::chrono::seconds(60);
constexpr uint32_t kMagic = 0x0cc15a4d;

struct Barrier {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
};

struct Mail {
  std::atomic<uint32_t> full;
  uint64_t bytes;
};

// Segment layout: Header, then nranks staging slots, then nranks * nranks
// mail rings of kMailDepth (Mail + kMailBytes) entries.
struct Header {
  std::atomic<uint32_t> state;  // 0 fresh, 1 being set up, 2 ready
  uint32_t magic;
  int32_t nranks;
  std::atomic<int32_t> joined;
  Barrier barrier;
};

size_t SlotOffset(int rank) { return 4096 + size_t(rank) * kSlotBytes; }
size_t MailOffset(int nranks, int src, int dst, uint32_t index) {
  size_t entry = 64 + kMailBytes;
  return SlotOffset(nranks) + ((size_t(src) * nranks + dst) * kMailDepth + index) * entry;
}
size_t SegmentBytes(int nranks) { return MailOffset(nranks, nranks, 0, 0); }

thread_local std::string last_error;

ncclResult_t Fail(ncclResult_t code, const std::string& why) {
  last_error = "stand-in nccl: " + why;
  return code;
}

bool WaitUntil(const std::function<bool()>& ready) {
  auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
  for (uint32_t spins = 0; !ready(); ++spins) {
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
  }
  return true;
}

std::string SegmentName(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string name = "/opguard-stand-in-nccl-";
  for (int i = 0; i < 16; ++i) {
    auto b = static_cast<unsigned char>(id.internal[i]);
    name += digits[b >> 4];
    name += digits[b & 15];
  }
  return name;
}

}  // namespace

struct ncclComm {
  ncclUniqueId id;
  int nranks = 0;
  int rank = 0;
  int device = 0;
  uint8_t* base = nullptr;
  uint64_t splits = 0;   // ncclCommSplit calls on this communicator
  uint64_t shrinks = 0;  // ncclCommShrink calls on it
  uint64_t all_reduces = 0;
  std::vector<uint32_t> sent, received;  // per peer: messages so far (ring position)

  Header* header() { return reinterpret_cast<Header*>(base); }
  uint8_t* slot(int r) { return base + SlotOffset(r); }

  bool Barrier() {
    ::Barrier& b = header()->barrier;
    uint32_t gen = b.generation.load(std::memory_order_acquire);
    if (b.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(nranks)) {
      b.arrived.store(0, std::memory_order_relaxed);
      b.generation.fetch_add(1, std::memory_order_acq_rel);
      return true;
    }
    return WaitUntil([&] { return b.generation.load(std::memory_order_acquire) != gen; });
  }
};

namespace {

size_t TypeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

// F16C's conversions (round to nearest even), which every x86-64 machine that
// runs these tests has; clang before 15 has no _Float16 on x86.
__attribute__((target("f16c"))) float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }
uint16_t FloatToBf16(float f) {  // round to nearest even
  uint32_t u = std::bit_cast<uint32_t>(f);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

template <typename T>
T Combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd:
      return T(a * b);
    case ncclMax:
      return std::max(a, b);
    case ncclMin:
      return std::min(a, b);
    default:
      return T(a + b);  // sum and avg
  }
}

template <typename T>
void ReduceTyped(ncclComm* c, size_t offset, size_t count, ncclRedOp_t op, void* out) {
  std::vector<T> acc(count);
  std::memcpy(acc.data(), c->slot(0) + offset, count * sizeof(T));
  for (int r = 1; r < c->nranks; ++r) {
    const T* in = reinterpret_cast<const T*>(c->slot(r) + offset);
    for (size_t i = 0; i < count; ++i) acc[i] = Combine(acc[i], in[i], op);
  }
  if (op == ncclAvg) {
    for (auto& v : acc) v = T(v / T(c->nranks));
  }
  std::memcpy(out, acc.data(), count * sizeof(T));
}

// Half types are reduced in float, in rank order, and rounded once.
void ReduceHalf(ncclComm* c, size_t offset, size_t count, ncclRedOp_t op, void* out, bool bf16) {
  auto load = [bf16](uint16_t h) { return bf16 ? Bf16ToFloat(h) : HalfToFloat(h); };
  std::vector<float> acc(count);
  for (int r = 0; r < c->nranks; ++r) {
    const uint16_t* in = reinterpret_cast<const uint16_t*>(c->slot(r) + offset);
    for (size_t i = 0; i < count; ++i)
      acc[i] = r == 0 ? load(in[i]) : Combine(acc[i], load(in[i]), op);
  }
  auto* o = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    float v = op == ncclAvg ? acc[i] / float(c->nranks) : acc[i];
    o[i] = bf16 ? FloatToBf16(v) : FloatToHalf(v);
  }
}

// Element-wise reduction over every rank's slot at `offset` into `out`.
void Reduce(ncclComm* c, size_t offset, size_t count, ncclDataType_t t, ncclRedOp_t op, void* out) {
  switch (t) {
    case ncclInt8:
      return ReduceTyped<int8_t>(c, offset, count, op, out);
    case ncclUint8:
      return ReduceTyped<uint8_t>(c, offset, count, op, out);
    case ncclInt32:
      return ReduceTyped<int32_t>(c, offset, count, op, out);
    case ncclUint32:
      return ReduceTyped<uint32_t>(c, offset, count, op, out);
    case ncclInt64:
      return ReduceTyped<int64_t>(c, offset, count, op, out);
    case ncclUint64:
      return ReduceTyped<uint64_t>(c, offset, count, op, out);
    case ncclFloat32:
      return ReduceTyped<float>(c, offset, count, op, out);
    case ncclFloat64:
      return ReduceTyped<double>(c, offset, count, op, out);
    case ncclFloat16:
      return ReduceHalf(c, offset, count, op, out, false);
    case ncclBfloat16:
      return ReduceHalf(c, offset, count, op, out, true);
    default:
      return;  // fp8 is refused at the call
  }
}

void CorruptIfAsked(ncclComm* c, uint64_t ordinal, void* out, size_t count, size_t type_size) {
  static const char* spec = std::getenv("STAND_IN_NCCL_CORRUPT");
  int rank = -1;
  unsigned long long which = 0, element = 0;
  if (spec == nullptr || std::sscanf(spec, "%d:%llu:%llu", &rank, &which, &element) != 3) return;
  if (rank == c->rank && which == ordinal && element < count) {
    static_cast<uint8_t*>(out)[element * type_size] ^= 1;
  }
}

enum class Kind {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
  kSend,
  kRecv
};

struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;  // or peer
  ncclComm* comm;
};

// Runs one call to its end on the calling thread.
ncclResult_t Execute(const Call& k) {
  ncclComm* c = k.comm;
  const size_t bytes = k.count * TypeSize(k.type);
  const int n = c->nranks, me = c->rank;
  if (k.kind == Kind::kSend) {
    uint32_t index = c->sent[k.root]++ % kMailDepth;
    auto* mail = reinterpret_cast<Mail*>(c->base + MailOffset(n, me, k.root, index));
    if (!WaitUntil([&] { return mail->full.load(std::memory_order_acquire) == 0; })) {
      return Fail(ncclRemoteError, "peer did not receive");
    }
    mail->bytes = bytes;
    std::memcpy(reinterpret_cast<uint8_t*>(mail) + 64, k.send, bytes);
    mail->full.store(1, std::memory_order_release);
    return ncclSuccess;
  }
  if (k.kind == Kind::kRecv) {
    uint32_t index = c->received[k.root]++ % kMailDepth;
    auto* mail = reinterpret_cast<Mail*>(c->base + MailOffset(n, k.root, me, index));
    if (!WaitUntil([&] { return mail->full.load(std::memory_order_acquire) == 1; })) {
      return Fail(ncclRemoteError, "peer did not send");
    }
    if (mail->bytes != bytes) return Fail(ncclInvalidUsage, "send and recv sizes differ");
    std::memcpy(k.recv, reinterpret_cast<uint8_t*>(mail) + 64, bytes);
    mail->full.store(0, std::memory_order_release);
    return ncclSuccess;
  }
  // Collectives: stage this rank's input, meet, compute the own output, meet.
  size_t staged =
      k.kind == Kind::kAlltoAll || k.kind == Kind::kScatter || k.kind == Kind::kReduceScatter
          ? bytes * n
          : bytes;
  bool contributes = k.kind != Kind::kScatter || me == k.root;
  if (k.kind == Kind::kBroadcast) contributes = me == k.root;
  if (contributes && staged != 0) std::memmove(c->slot(me), k.send, staged);
  if (!c->Barrier()) return Fail(ncclRemoteError, "a rank did not arrive");
  switch (k.kind) {
    case Kind::kAllReduce:
      Reduce(c, 0, k.count, k.type, k.op, k.recv);
      CorruptIfAsked(c, c->all_reduces++, k.recv, k.count, TypeSize(k.type));
      break;
    case Kind::kReduce:
      if (me == k.root) Reduce(c, 0, k.count, k.type, k.op, k.recv);
      break;
    case Kind::kReduceScatter:
      Reduce(c, size_t(me) * bytes, k.count, k.type, k.op, k.recv);
      break;
    case Kind::kBroadcast:
      std::memcpy(k.recv, c->slot(k.root), bytes);
      break;
    case Kind::kAllGather:
      for (int r = 0; r < n; ++r)
        std::memcpy(static_cast<uint8_t*>(k.recv) + r * bytes, c->slot(r), bytes);
      break;
    case Kind::kGather:
      if (me == k.root) {
        for (int r = 0; r < n; ++r)
          std::memcpy(static_cast<uint8_t*>(k.recv) + r * bytes, c->slot(r), bytes);
      }
      break;
    case Kind::kScatter:
      std::memcpy(k.recv, c->slot(k.root) + size_t(me) * bytes, bytes);
      break;
    case Kind::kAlltoAll:
      for (int r = 0; r < n; ++r) {
        std::memcpy(static_cast<uint8_t*>(k.recv) + r * bytes, c->slot(r) + size_t(me) * bytes,
                    bytes);
      }
      break;
    default:
      break;
  }
  if (!c->Barrier()) return Fail(ncclRemoteError, "a rank did not arrive");
  return ncclSuccess;
}

// ---- group calls -------------------------------------------------------------

thread_local int group_depth = 0;
thread_local std::vector<Call> group_calls;

// Runs a group's calls: sends first (they only wait for ring space), then the
// collectives in call order, then the receives; calls on different
// communicators (one thread driving several ranks, ncclCommInitAll) run on
// one thread per communicator, as NCCL progresses them concurrently.
ncclResult_t RunGroup(std::vector<Call> calls) {
  std::map<ncclComm*, std::vector<Call>> by_comm;
  for (int pass = 0; pass < 3; ++pass) {
    for (const Call& k : calls) {
      int p = k.kind == Kind::kSend ? 0 : k.kind == Kind::kRecv ? 2 : 1;
      if (p == pass) by_comm[k.comm].push_back(k);
    }
  }
  auto run = [](const std::vector<Call>& list) {
    for (const Call& k : list) {
      if (ncclResult_t r = Execute(k); r != ncclSuccess) return r;
    }
    return ncclSuccess;
  };
  if (by_comm.size() == 1) return run(by_comm.begin()->second);
  std::vector<ncclResult_t> results(by_comm.size(), ncclSuccess);
  std::vector<std::thread> threads;
  size_t i = 0;
  for (auto& [comm, list] : by_comm) {
    threads.emplace_back([&, i, l = &list] { results[i] = run(*l); });
    ++i;
  }
  for (auto& t : threads) t.join();
  for (ncclResult_t r : results) {
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}

ncclResult_t Submit(const Call& k) {
  if (group_depth > 0) {
    group_calls.push_back(k);
    return ncclSuccess;
  }
  return Execute(k);
}

ncclResult_t CheckComm(ncclComm* c) {
  return c == nullptr ? Fail(ncclInvalidArgument, "comm is NULL") : ncclSuccess;
}

// The checks NCCL makes before it enqueues anything.
ncclResult_t Validate(const Call& k) {
  if (ncclResult_t r = CheckComm(k.comm); r != ncclSuccess) return r;
  if (k.type < 0 || k.type >= ncclNumTypes) return Fail(ncclInvalidArgument, "invalid datatype");
  bool reduces =
      k.kind == Kind::kAllReduce || k.kind == Kind::kReduce || k.kind == Kind::kReduceScatter;
  if (reduces && (k.op < 0 || k.op >= ncclNumOps))
    return Fail(ncclInvalidArgument, "invalid reduction op");
  if (reduces && TypeSize(k.type) == 1 && (k.type == ncclFloat8e4m3 || k.type == ncclFloat8e5m2)) {
    return Fail(ncclInvalidUsage, "fp8 reductions are not in the stand-in");
  }
  bool rooted = k.kind == Kind::kBroadcast || k.kind == Kind::kReduce || k.kind == Kind::kGather ||
                k.kind == Kind::kScatter || k.kind == Kind::kSend || k.kind == Kind::kRecv;
  if (rooted && (k.root < 0 || k.root >= k.comm->nranks)) {
    return Fail(ncclInvalidArgument, "root or peer out of range");
  }
  if (k.count != 0) {
    bool needs_send = k.kind != Kind::kRecv &&
                      (k.kind != Kind::kScatter || k.comm->rank == k.root) &&
                      (k.kind != Kind::kBroadcast || k.comm->rank == k.root);
    bool needs_recv =
        k.kind != Kind::kSend &&
        ((k.kind != Kind::kReduce && k.kind != Kind::kGather) || k.comm->rank == k.root);
    if ((needs_send && k.send == nullptr) || (needs_recv && k.recv == nullptr)) {
      return Fail(ncclInvalidArgument, "buffer is NULL");
    }
  }
  size_t bytes = k.count * TypeSize(k.type);
  bool per_peer =
      k.kind == Kind::kAlltoAll || k.kind == Kind::kScatter || k.kind == Kind::kReduceScatter;
  if ((per_peer ? bytes * k.comm->nranks : bytes) > kSlotBytes ||
      ((k.kind == Kind::kSend || k.kind == Kind::kRecv) && bytes > kMailBytes)) {
    return Fail(ncclInvalidUsage, "larger than the stand-in's staging slot");
  }
  return ncclSuccess;
}

ncclResult_t Enqueue(Call k) {
  if (ncclResult_t r = Validate(k); r != ncclSuccess) return r;
  return Submit(k);
}

// ---- communicators -------------------------------------------------------------

ncclResult_t Join(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank) {
  if (out == nullptr) return Fail(ncclInvalidArgument, "comm is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return Fail(ncclInvalidArgument, "rank or nranks invalid");
  std::string name = SegmentName(id);
  int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return Fail(ncclSystemError, "shm_open " + name + ": " + std::strerror(errno));
  size_t size = SegmentBytes(nranks);
  void* base = MAP_FAILED;
  if (::ftruncate(fd, off_t(size)) == 0) {
    base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (base == MAP_FAILED) return Fail(ncclSystemError, "mapping " + name + " failed");
  auto* comm = new ncclComm;
  comm->id = id;
  comm->nranks = nranks;
  comm->rank = rank;
  comm->device = rank;
  comm->base = static_cast<uint8_t*>(base);
  comm->sent.assign(nranks, 0);
  comm->received.assign(nranks, 0);
  Header* h = comm->header();
  uint32_t fresh = 0;
  if (h->state.compare_exchange_strong(fresh, 1)) {
    h->magic = kMagic;
    h->nranks = nranks;
    h->state.store(2, std::memory_order_release);
  }
  bool ready = WaitUntil([&] { return h->state.load(std::memory_order_acquire) == 2; });
  ncclResult_t result = ncclSuccess;
  if (!ready || h->magic != kMagic || h->nranks != nranks) {
    result = Fail(ncclInvalidUsage, "ranks disagree on nranks");
  } else {
    h->joined.fetch_add(1);
    if (!comm->Barrier()) result = Fail(ncclRemoteError, "not every rank joined");
  }
  // Everyone has mapped the segment: its name is no longer needed.
  if (result == ncclSuccess && rank == 0) ::shm_unlink(name.c_str());
  if (result != ncclSuccess) {
    ::munmap(comm->base, size);
    delete comm;
    return result;
  }
  *out = comm;
  return ncclSuccess;
}

// NCCL_CONFIG_INITIALIZER's magic, or NULL.
ncclResult_t CheckConfig(const ncclConfig_t* config) {
  if (config != nullptr && config->magic != 0xcafebeef) {
    return Fail(ncclInvalidArgument, "config not initialised");
  }
  return ncclSuccess;
}

void Release(ncclComm* c) {
  ::munmap(c->base, SegmentBytes(c->nranks));
  delete c;
}

}  // namespace

// ---- the API ----------------------------------------------------------------------

#define STAND_IN_ALIAS(name) \
  extern "C" __attribute__((visibility("default"), alias(#name))) decltype(name) p##name;

STAND_IN_API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Fail(ncclInvalidArgument, "version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Fail(ncclInvalidArgument, "uniqueId is NULL");
  std::memset(id, 0, sizeof(*id));
  if (::getrandom(id->internal, 32, 0) != 32) return Fail(ncclSystemError, "getrandom failed");
  return ncclSuccess;
}

STAND_IN_API const char* ncclGetErrorString(ncclResult_t r) {
  static const char* names[] = {"no error",
                                "unhandled cuda error",
                                "unhandled system error",
                                "internal error",
                                "invalid argument",
                                "invalid usage",
                                "remote process exited or there was a network error",
                                "NCCL operation in progress"};
  return r >= 0 && r < ncclNumResults ? names[r] : "unknown result code";
}

STAND_IN_API const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

STAND_IN_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                           int rank) {
  return Join(comm, nranks, id, rank);
}

STAND_IN_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                 int rank, ncclConfig_t* config) {
  if (ncclResult_t r = CheckConfig(config); r != ncclSuccess) return r;
  return Join(comm, nranks, id, rank);
}

// Several ids only spread NCCL's bootstrap; the first names the segment.
STAND_IN_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nids,
                                                   ncclUniqueId* ids, ncclConfig_t* config) {
  if (nids < 1 || ids == nullptr) return Fail(ncclInvalidArgument, "no unique id");
  if (ncclResult_t r = CheckConfig(config); r != ncclSuccess) return r;
  return Join(comm, nranks, ids[0], rank);
}

STAND_IN_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) return Fail(ncclInvalidArgument, "comms or ndev invalid");
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return r;
  std::vector<ncclResult_t> results(ndev);
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    threads.emplace_back([&, i] { results[i] = Join(&comms[i], ndev, id, i); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < ndev; ++i) {
    if (results[i] != ncclSuccess) return results[i];
    comms[i]->device = devlist != nullptr ? devlist[i] : i;
  }
  return ncclSuccess;
}

// Members exchange (color, key) through the parent's slots; each color group
// joins a new segment named after (parent, split ordinal, color).
STAND_IN_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                        ncclConfig_t*) {
  if (ncclResult_t r = CheckComm(comm); r != ncclSuccess) return r;
  if (newcomm == nullptr) return Fail(ncclInvalidArgument, "newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return Fail(ncclInvalidArgument, "invalid color");
  int32_t mine[2] = {color, key};
  std::memcpy(comm->slot(comm->rank), mine, sizeof(mine));
  if (!comm->Barrier()) return Fail(ncclRemoteError, "a rank did not arrive");
  std::vector<std::pair<int32_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < comm->nranks; ++r) {
    int32_t theirs[2];
    std::memcpy(theirs, comm->slot(r), sizeof(theirs));
    if (color != NCCL_SPLIT_NOCOLOR && theirs[0] == color) members.emplace_back(theirs[1], r);
  }
  uint64_t ordinal = comm->splits++;
  if (!comm->Barrier()) return Fail(ncclRemoteError, "a rank did not arrive");
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  std::sort(members.begin(), members.end());
  int rank = int(std::find(members.begin(), members.end(), std::make_pair(key, comm->rank)) -
                 members.begin());
  ncclUniqueId id = comm->id;
  uint64_t salt[2] = {ordinal + 1, uint64_t(uint32_t(color)) | uint64_t{1} << 40};
  for (int i = 0; i < 16; ++i) id.internal[i] ^= reinterpret_cast<const char*>(salt)[i];
  return Join(newcomm, int(members.size()), id, rank);
}

// Only the remaining ranks call it (the excluded ones may be gone): each
// joins a segment named after (parent, shrink ordinal) in parent rank order.
STAND_IN_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int nexclude,
                                         ncclComm_t* newcomm, ncclConfig_t* config, int) {
  if (ncclResult_t r = CheckComm(comm); r != ncclSuccess) return r;
  if (ncclResult_t r = CheckConfig(config); r != ncclSuccess) return r;
  if (newcomm == nullptr || nexclude < 0 || (nexclude > 0 && exclude == nullptr)) {
    return Fail(ncclInvalidArgument, "newcomm or exclude list invalid");
  }
  std::vector<bool> excluded(comm->nranks, false);
  for (int i = 0; i < nexclude; ++i) {
    if (exclude[i] < 0 || exclude[i] >= comm->nranks || exclude[i] == comm->rank) {
      return Fail(ncclInvalidArgument, "excluded rank invalid");
    }
    excluded[exclude[i]] = true;
  }
  int rank = 0, nranks = 0;
  for (int r = 0; r < comm->nranks; ++r) {
    if (r == comm->rank) rank = nranks;
    nranks += excluded[r] ? 0 : 1;
  }
  ncclUniqueId id = comm->id;
  uint64_t salt[2] = {++comm->shrinks, uint64_t{2} << 40};
  for (int i = 0; i < 16; ++i) id.internal[i] ^= reinterpret_cast<const char*>(salt)[i];
  return Join(newcomm, nranks, id, rank);
}

STAND_IN_API ncclResult_t ncclCommFinalize(ncclComm_t comm) { return CheckComm(comm); }

STAND_IN_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "comm is NULL");
  Release(comm);
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm != nullptr) Release(comm);
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (ncclResult_t r = CheckComm(comm); r != ncclSuccess) return r;
  if (error == nullptr) return Fail(ncclInvalidArgument, "asyncError is NULL");
  *error = ncclSuccess;
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return Fail(ncclInvalidArgument, "NULL argument");
  *count = comm->nranks;
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return Fail(ncclInvalidArgument, "NULL argument");
  *rank = comm->rank;
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return Fail(ncclInvalidArgument, "NULL argument");
  *device = comm->device;
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t,
                                        ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kAllReduce, s, r, n, t, op, -1, c});
}
STAND_IN_API ncclResult_t ncclReduce(const void* s, void* r, size_t n, ncclDataType_t t,
                                     ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kReduce, s, r, n, t, op, root, c});
}
STAND_IN_API ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t,
                                        int root, ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kBroadcast, s, r, n, t, ncclSum, root, c});
}
STAND_IN_API ncclResult_t ncclBcast(void* b, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                                    cudaStream_t) {
  return Enqueue({Kind::kBroadcast, b, b, n, t, ncclSum, root, c});
}
STAND_IN_API ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t,
                                        ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kAllGather, s, r, n, t, ncclSum, -1, c});
}
STAND_IN_API ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t,
                                            ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kReduceScatter, s, r, n, t, op, -1, c});
}
STAND_IN_API ncclResult_t ncclAlltoAll(const void* s, void* r, size_t n, ncclDataType_t t,
                                       ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kAlltoAll, s, r, n, t, ncclSum, -1, c});
}
STAND_IN_API ncclResult_t ncclGather(const void* s, void* r, size_t n, ncclDataType_t t, int root,
                                     ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kGather, s, r, n, t, ncclSum, root, c});
}
STAND_IN_API ncclResult_t ncclScatter(const void* s, void* r, size_t n, ncclDataType_t t, int root,
                                      ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kScatter, s, r, n, t, ncclSum, root, c});
}
STAND_IN_API ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer,
                                   ncclComm_t c, cudaStream_t) {
  return Enqueue({Kind::kSend, s, nullptr, n, t, ncclSum, peer, c});
}
STAND_IN_API ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                                   cudaStream_t) {
  return Enqueue({Kind::kRecv, nullptr, r, n, t, ncclSum, peer, c});
}

STAND_IN_API ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

STAND_IN_API ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return Fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  return RunGroup(std::exchange(group_calls, {}));
}

// NCCL's profiling names (pnccl*): the same functions, never interposed. The
// interposer's tests call them to compare results with and without it.
STAND_IN_ALIAS(ncclCommInitRank)
STAND_IN_ALIAS(ncclAllReduce)
STAND_IN_ALIAS(ncclBroadcast)
STAND_IN_ALIAS(ncclReduce)
STAND_IN_ALIAS(ncclAllGather)
STAND_IN_ALIAS(ncclSend)
STAND_IN_ALIAS(ncclRecv)
STAND_IN_ALIAS(ncclGroupStart)
STAND_IN_ALIAS(ncclGroupEnd)
STAND_IN_ALIAS(ncclCommSplit)
STAND_IN_ALIAS(ncclCommDestroy)
