#include "recorder.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <time.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "buffer_fingerprint.h"
#include "identity.h"
#include "log.h"
#include "real_nccl.h"
#include "shim_api.h"

namespace opguard::nccl {
namespace {

// NCCL's group state is per thread, and so is the list of calls a group
// collected: they are issued by this thread's outermost ncclGroupEnd.
thread_local int group_depth = 0;

bool Accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

uint8_t ReduceOpOf(const Call& c) {
  if (!c.reduces) return 255;
  return c.op >= ncclSum && c.op <= ncclAvg ? static_cast<uint8_t>(c.op) : 255;  // custom: none
}

void LogOnce(std::once_flag& once, const char* message) {
  std::call_once(once, [message] { Log("%s", message); });
}

}  // namespace

uint8_t DTypeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return OPGUARD_DTYPE_INT8;
    case ncclUint8:
      return OPGUARD_DTYPE_UINT8;
    case ncclInt32:
      return OPGUARD_DTYPE_INT32;
    case ncclUint32:
      return OPGUARD_DTYPE_UINT32;
    case ncclInt64:
      return OPGUARD_DTYPE_INT64;
    case ncclUint64:
      return OPGUARD_DTYPE_UINT64;
    case ncclFloat16:
      return OPGUARD_DTYPE_FLOAT16;
    case ncclFloat32:
      return OPGUARD_DTYPE_FLOAT32;
    case ncclFloat64:
      return OPGUARD_DTYPE_FLOAT64;
    case ncclBfloat16:
      return OPGUARD_DTYPE_BFLOAT16;
    case ncclFloat8e4m3:
      return OPGUARD_DTYPE_FLOAT8_E4M3;
    case ncclFloat8e5m2:
      return OPGUARD_DTYPE_FLOAT8_E5M2;
    default:
      return OPGUARD_DTYPE_UNKNOWN;
  }
}

uint64_t WallNs() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

thread_local std::vector<Recorder::Pending> Recorder::group_calls_;

Recorder& Recorder::Get() {
  static auto* recorder = new Recorder();  // never destroyed: used until the last NCCL call
  return *recorder;
}

void Recorder::AddCommunicator(ncclComm_t comm, uint64_t identity, const std::string& name,
                               int nranks, int rank) {
  if (comm == nullptr) return;
  static std::once_flag version_once;
  std::call_once(version_once, [] {
    int version = 0;
    if (auto get = OPGUARD_REAL_NCCL(ncclGetVersion);
        get != nullptr && get(&version) == ncclSuccess) {
      Shim()->set_run_info(OPGUARD_INFO_VERSION, "nccl", std::to_string(version).c_str());
    }
  });
  std::lock_guard<std::mutex> lock(mu_);
  Communicator c;
  c.id = identity;
  c.name = name;
  c.nranks = nranks;
  c.rank = rank;
  // OpGuard's rank is the process: a second member of the same communicator
  // in this process (ncclCommInitAll, one thread per GPU) would write records
  // under the same rank and sequence numbers, so only the first is recorded.
  if (members_here_[identity]++ > 0) {
    c.recorded = false;
    static std::once_flag once;
    LogOnce(once,
            "this process holds several members of one communicator; only the first "
            "member's calls are recorded (OpGuard records one rank per process)");
  }
  comms_[comm] = std::move(c);
}

Recorder::Communicator* Recorder::FindLocked(ncclComm_t comm) {
  auto it = comms_.find(comm);
  return it == comms_.end() ? nullptr : &it->second;
}

bool Recorder::NextChild(ncclComm_t parent, Derivation how, Parent* out) {
  std::lock_guard<std::mutex> lock(mu_);
  Communicator* c = FindLocked(parent);
  if (c == nullptr) return false;
  out->id = c->id;
  out->ordinal = c->children[how]++;
  out->name = c->name;
  return true;
}

void Recorder::RemoveCommunicator(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(comm);
  if (it == comms_.end()) return;
  if (--members_here_[it->second.id] == 0) members_here_.erase(it->second.id);
  comms_.erase(it);
}

bool Recorder::Prepare(const Call& call, Pending* out) {
  if (call.comm == nullptr) return false;  // NCCL refuses it
  std::lock_guard<std::mutex> lock(mu_);
  Communicator* c = FindLocked(call.comm);
  if (c == nullptr) {
    static std::once_flag once;
    LogOnce(once,
            "calls on a communicator created before recording started (or not created "
            "through NCCL's init and split calls) are not recorded");
    return false;
  }
  if (!c->recorded) return false;
  // Size and own rank are known once NCCL finished creating the
  // communicator (a split, or a non-blocking init, may still be running when
  // it is registered).
  if (c->nranks < 0) {
    auto count = OPGUARD_REAL_NCCL(ncclCommCount);
    if (count == nullptr || count(call.comm, &c->nranks) != ncclSuccess) c->nranks = -1;
  }
  if (c->rank < 0) {
    auto user_rank = OPGUARD_REAL_NCCL(ncclCommUserRank);
    if (user_rank == nullptr || user_rank(call.comm, &c->rank) != ncclSuccess) c->rank = -1;
  }
  if (c->nranks < 0 || c->rank < 0) return false;
  if (!c->defined) {
    opguard_communicator def{};
    def.struct_size = sizeof(def);
    def.size = static_cast<uint32_t>(c->nranks);
    def.id = c->id;
    def.name = c->name.c_str();
    c->defined = Shim()->communicator_define(&def) != 0;
  }
  out->call = call;
  out->communicator = c->id;
  auto elements = [&](const Call::Buffer& b) -> uint64_t {
    if (!b.used || (b.root_only && c->rank != call.root)) return 0;
    return call.count * (b.scale_by_ranks ? static_cast<uint64_t>(c->nranks) : 1);
  };
  out->input_elements = elements(call.input);
  out->output_elements = elements(call.output);
  if (out->input_elements == 0) out->call.input.used = false;
  if (out->output_elements == 0) out->call.output.used = false;
  // Point-to-point: the channel's own communicator, defined on first use.
  if (call.kind == OPGUARD_COLL_SEND || call.kind == OPGUARD_COLL_RECV) {
    int src = call.kind == OPGUARD_COLL_SEND ? c->rank : call.root;
    int dst = call.kind == OPGUARD_COLL_SEND ? call.root : c->rank;
    out->communicator = IdentityOfChannel(c->id, src, dst);
    if (c->channel_seq.emplace(std::make_pair(out->communicator, call.kind), 0).second &&
        !c->channel_seq.count({out->communicator, call.kind == OPGUARD_COLL_SEND
                                                      ? OPGUARD_COLL_RECV
                                                      : OPGUARD_COLL_SEND})) {
      std::string name = c->name + " p2p " + std::to_string(src) + "->" + std::to_string(dst);
      opguard_communicator def{};
      def.struct_size = sizeof(def);
      def.size = 2;
      def.id = out->communicator;
      def.name = name.c_str();
      Shim()->communicator_define(&def);
    }
  }
  return true;
}

uint64_t Recorder::NextSeq(const Pending& p, uint64_t* communicator) {
  std::lock_guard<std::mutex> lock(mu_);
  *communicator = p.communicator;
  Communicator* c = FindLocked(p.call.comm);
  if (c == nullptr) return OPGUARD_AUTO;  // destroyed meanwhile: the shim numbers it
  if (p.communicator != c->id) return c->channel_seq[{p.communicator, p.call.kind}]++;
  return c->next_seq++;
}

uint64_t Recorder::SiteOf(const void* caller) {
  if (caller == nullptr) return 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = sites_.find(caller); it != sites_.end()) return it->second;
  }
  Dl_info info{};
  std::string file = "?", function;
  if (dladdr(caller, &info) != 0 && info.dli_fname != nullptr) {
    file = info.dli_fname;
    const void* base = info.dli_fbase;
    if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
      int status = -1;
      char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      function = status == 0 ? demangled : info.dli_sname;
      std::free(demangled);
      base = info.dli_saddr;
    }
    char offset[32];
    std::snprintf(
        offset, sizeof(offset), "+0x%zx",
        static_cast<size_t>(static_cast<const char*>(caller) - static_cast<const char*>(base)));
    function += offset;
  }
  uint64_t site = Shim()->site(file.c_str(), 0, function.c_str());
  std::lock_guard<std::mutex> lock(mu_);
  sites_.emplace(caller, site);
  return site;
}

void Recorder::TakeInput(Pending& p) {
  if (!p.call.input.used) return;
  p.has_input =
      FingerprintBuffer(p.call.input.data, DTypeOf(p.call.type), p.input_elements, p.call.stream,
                        &p.input_shape, &p.input) == BufferFingerprint::kTaken;
}

void Recorder::Record(std::vector<Pending>& calls) {
  for (Pending& p : calls) {
    if (p.has_input) p.input.shape = &p.input_shape;  // the vector may have moved it
    opguard_collective rec{};
    rec.struct_size = sizeof(rec);
    rec.kind = p.call.kind;
    rec.dtype = DTypeOf(p.call.type);
    rec.reduce_op = ReduceOpOf(p.call);
    rec.seq = NextSeq(p, &rec.communicator);
    rec.count = p.call.count;
    rec.root = p.call.root;
    rec.lane = 0;
    rec.op_index = OPGUARD_AUTO;
    rec.step = OPGUARD_AUTO;
    rec.site = SiteOf(p.call.caller);
    rec.num_inputs = p.has_input ? 1 : 0;
    rec.inputs = p.has_input ? &p.input : nullptr;
    rec.phase = OPGUARD_PHASE_ENTERED;
    rec.time_ns = p.time_ns;
    uint64_t seq = rec.seq;
    if (Shim()->record_collective(&rec, &seq) != OPGUARD_OK && rec.seq == OPGUARD_AUTO) continue;
    opguard_tensor output{};
    int64_t output_shape = 0;
    bool has_output =
        p.call.output.used &&
        FingerprintBuffer(p.call.output.data, rec.dtype, p.output_elements, p.call.stream,
                          &output_shape, &output) == BufferFingerprint::kTaken;
    rec.phase = OPGUARD_PHASE_COMPLETED;
    rec.seq = seq;
    rec.num_outputs = has_output ? 1 : 0;
    rec.outputs = has_output ? &output : nullptr;
    rec.time_ns = WallNs();
    Shim()->record_collective(&rec, nullptr);
  }
}

ncclResult_t Recorder::Collective(const Call& call, const std::function<ncclResult_t()>& forward) {
  std::vector<Pending> pending(1);
  pending[0].time_ns = WallNs();
  if (!Prepare(call, &pending[0])) return forward();
  if (group_depth > 0) {
    ncclResult_t r = forward();
    if (Accepted(r)) group_calls_.push_back(std::move(pending[0]));
    return r;
  }
  TakeInput(pending[0]);
  ncclResult_t r = forward();
  // Calls NCCL refused never ran and are not recorded (every rank's NCCL
  // numbers only the calls it accepted).
  if (Accepted(r)) Record(pending);
  return r;
}

ncclResult_t Recorder::GroupStart(const std::function<ncclResult_t()>& forward) {
  ncclResult_t r = forward();
  if (r == ncclSuccess) ++group_depth;
  return r;
}

ncclResult_t Recorder::GroupEnd(const std::function<ncclResult_t()>& forward) {
  if (group_depth == 0) return forward();  // NCCL reports the misuse
  if (--group_depth > 0) return forward();
  std::vector<Pending> calls = std::move(group_calls_);
  group_calls_.clear();
  for (Pending& p : calls) TakeInput(p);
  ncclResult_t r = forward();
  if (Accepted(r)) Record(calls);
  return r;
}

}  // namespace opguard::nccl
