#include "shim_core.h"

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "opguard/common/log.h"
#include "opguard/common/utf8.h"
#include "opguard/idl/envelope.h"

namespace opguard::shim {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMaxDims = 64;
constexpr size_t kMaxAckBytes = 1 << 20;
// The sender's connection monitor (one per context, so one name suffices).
constexpr const char* kMonitorEndpoint = "inproc://opguard-shim-monitor";

size_t TensorBytes(const opguard_tensor& t) { return sizeof(TensorFixed) + size_t{t.ndim} * 8; }

bool ValidTensor(const opguard_tensor& t) {
  return t.ndim <= kMaxDims && (t.ndim == 0 || t.shape != nullptr);
}

void PutTensor(EntryWriter& w, const opguard_tensor& t) {
  TensorFixed f{};
  f.lo = t.fp_lo;
  f.hi = t.fp_hi;
  f.ndim = t.ndim;
  f.dtype = t.dtype;
  f.has_stats = t.has_stats != 0 ? 1 : 0;
  f.device = t.device;
  if (t.has_stats != 0) f.stats = t.stats;
  w.Put(f);
  if (t.ndim != 0) {
    // shape is int64 and the position is 8-aligned: copy the dims verbatim.
    std::memcpy(w.pos(), t.shape, size_t{t.ndim} * 8);
    w = EntryWriter(w.pos() + size_t{t.ndim} * 8);
  }
}

uint64_t RandomSession() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()) ^
               static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

// Copies a caller struct of `struct_size` bytes into a zeroed T, so callers
// built against an older (smaller) or newer (larger) header both work.
template <typename T>
bool CopySized(const T* in, T* out) {
  *out = T{};
  if (in == nullptr || in->struct_size < sizeof(uint32_t)) return false;
  std::memcpy(out, in, std::min<size_t>(in->struct_size, sizeof(T)));
  out->struct_size = sizeof(T);
  return true;
}

// Variables that change numerics or collectives; recorded with every run.
constexpr const char* kRelevantEnv[] = {
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE", "NCCL_ALGO",
    "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS",
    "NCCL_BUFFSIZE", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "MKL_CBWR", "PYTHONHASHSEED", "TORCH_DETERMINISTIC",
    "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT"};

}  // namespace

uint64_t StringId(std::string_view text) { return XXH64(text.data(), text.size(), 0); }

uint64_t SiteId(std::string_view file, uint32_t line, std::string_view function) {
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  XXH64_update(&st, file.data(), file.size());
  std::string mid = ":" + std::to_string(line) + ":";
  XXH64_update(&st, mid.data(), mid.size());
  XXH64_update(&st, function.data(), function.size());
  return XXH64_digest(&st);
}

uint64_t WallNs() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t CoarseWallNs() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

Core::Core(const Config& config)
    : config_(config),
      session_(RandomSession()),
      lanes_(new LaneState[kMaxLanes]),
      pending_(config.max_pending_fp, config.max_pending_fp),
      host_fp_(std::make_unique<HostFingerprinter>(static_cast<FpSink&>(*this))),
      ctx_(std::make_unique<zmq::context_t>(1)),
      encoder_(BatchIdentity{config.run, config.rank, session_}, config.batch_records,
               config.max_source_bytes),
      sender_(milliseconds(config.ack_timeout_ms), config.max_in_flight) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  announce_.node = host;
  announce_.local_rank = config.local_rank;
  announce_.world_size = config.world_size;
  announce_.pid = static_cast<uint64_t>(::getpid());
  announce_.start_ns = WallNs();
  for (const char* job : {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid"}) {
    const char* v = std::getenv(job);
    if (v != nullptr && *v != '\0' && std::strcmp(v, "none") != 0) {
      announce_.job_id = v;
      break;
    }
  }
  announce_.versions.emplace_back("opguard-shim", OPGUARD_SHIM_VERSION);
  announce_.versions.emplace_back("zeromq", std::to_string(ZMQ_VERSION_MAJOR) + "." +
                                                std::to_string(ZMQ_VERSION_MINOR) + "." +
                                                std::to_string(ZMQ_VERSION_PATCH));
  for (const char* var : kRelevantEnv) {
    if (const char* v = std::getenv(var)) announce_.environment.emplace_back(var, v);
  }
  announce_.environment.emplace_back("OPGUARD_RANK_SOURCE", config.rank_source);
  ack_timeout_now_ms_.store(config.ack_timeout_ms, std::memory_order_relaxed);
}

Result<std::unique_ptr<Core>> Core::Start(const Config& config, DeviceLoader load_device) {
  std::unique_ptr<Core> core(new Core(config));
  core->load_device_ = load_device ? std::move(load_device) : DeviceLoader(LoadCudaBackend);
  core->kernels_ = StartKernelSource(config);
  OPGUARD_RETURN_IF_ERROR(core->StartSender());
  return core;
}

Status Core::StartSender() {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal(std::string("eventfd: ") + std::strerror(errno));
  // The sender (and the ZeroMQ I/O thread it starts) must never take the
  // host's signals: start it with every signal blocked.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    sender_thread_ = std::thread([this] { SenderMain(); });
    sender_started_ = true;
  } catch (const std::exception& e) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return Internal(std::string("cannot start the sender thread: ") + e.what());
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return Status::Ok();
}

Core::~Core() {
  (void)Shutdown(0);
  if (sender_started_) {
    // A sender that Shutdown gave up on (detached) still uses this object
    // until it ends, one loop turn past its deadline (now).
    std::unique_lock<std::mutex> lock(wait_mu_);
    wait_cv_.wait(lock, [&] { return sender_done_; });
  }
  // The fingerprint thread reports into this object (and may wake the
  // sender): stopped while all of it is still alive.
  host_fp_.reset();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void Core::Fail(std::string_view what) {
  bool expected = false;
  if (failed_.compare_exchange_strong(expected, true)) {
    accepting_.store(false, std::memory_order_release);
    OPGUARD_LOG(LogLevel::kError, "internal failure (" + std::string(what) +
                                      "); OpGuard is disabled in this process, training continues");
  }
}

void Core::Wake() {
  uint64_t one = 1;
  ssize_t unused = ::write(wake_fd_, &one, sizeof(one));
  (void)unused;
}

// ---------------------------------------------------------------------------
// Producer side

uint8_t* Core::ReserveLocked(EntryKind kind, size_t bytes, bool subject_to_cap) {
  size_t total = sizeof(EntryHeader) + bytes;
  if (subject_to_cap && BufferedLocked() + total > config_.buffer_bytes) return nullptr;
  uint8_t* p = staging_.Append(total);
  if (p == nullptr) return nullptr;
  EntryHeader h{};
  h.size = static_cast<uint32_t>(total);
  h.kind = kind;
  std::memcpy(p, &h, sizeof(h));
  staged_bytes_ += total;
  return p + sizeof(EntryHeader);
}

uint8_t* Core::ReserveOrderedLocked(EntryKind kind, size_t bytes, bool hold) {
  if (!hold && held_.empty()) return ReserveLocked(kind, bytes, /*subject_to_cap=*/false);
  size_t total = sizeof(EntryHeader) + bytes;
  Held& h = held_.emplace_back();
  h.bytes.resize(total);
  h.record = kind == EntryKind::kOp || kind == EntryKind::kCollective;
  EntryHeader header{};
  header.size = static_cast<uint32_t>(total);
  header.kind = kind;
  std::memcpy(h.bytes.data(), &header, sizeof(header));
  held_bytes_ += total;
  ++held_pushed_;
  if (h.record) ++held_records_;
  return h.bytes.data() + sizeof(EntryHeader);
}

uint64_t Core::BufferedLocked() const {
  return staged_bytes_ + held_bytes_ + unacked_bytes_.load(std::memory_order_relaxed);
}

void Core::CountStagedRecordLocked() {
  uint32_t n = staged_records_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n == config_.batch_records) Wake();
}

// A gap entry's bytes (header included) for `lane` first..last.
std::vector<uint8_t> Core::GapEntry(uint32_t lane, uint64_t first, uint64_t last, uint64_t count,
                                    std::string_view reason) {
  std::vector<uint8_t> bytes(sizeof(EntryHeader) + sizeof(GapFixed) + Pad8(reason.size()));
  EntryHeader header{};
  header.size = static_cast<uint32_t>(bytes.size());
  header.kind = EntryKind::kGap;
  EntryWriter w(bytes.data());
  w.Put(header);
  GapFixed g{};
  g.first_op = first;
  g.last_op = last;
  g.count = count;
  g.lane = lane;
  g.reason_len = static_cast<uint32_t>(reason.size());
  w.Put(g);
  w.PutBytes(reason.data(), reason.size());
  return bytes;
}

bool Core::EmitOpGapLocked(uint32_t lane, uint64_t first, uint64_t last, uint64_t count,
                           std::string_view reason) {
  std::vector<uint8_t> gap = GapEntry(lane, first, last, count, reason);
  uint8_t* p = ReserveOrderedLocked(EntryKind::kGap, gap.size() - sizeof(EntryHeader), /*hold=*/false);
  if (p == nullptr) return false;  // out of memory
  std::memcpy(p, gap.data() + sizeof(EntryHeader), gap.size() - sizeof(EntryHeader));
  ++gaps_reported_;
  ops_missing_ += last - first + 1;
  return true;
}

void Core::EmitGapLocked(uint32_t lane, LaneState& ls, std::string_view reason) {
  // Out of memory: the range stays open and is retried.
  if (EmitOpGapLocked(lane, ls.gap_first, ls.gap_last, ls.gap_count, reason)) ls.gap_open = false;
}

void Core::EmitCollGapLocked(uint64_t comm, uint64_t first, uint64_t last, uint64_t count,
                             std::string_view reason) {
  uint8_t* p = ReserveOrderedLocked(EntryKind::kCollectiveGap,
                                    sizeof(CollectiveGapFixed) + Pad8(reason.size()), false);
  if (p == nullptr) return;  // out of memory
  EntryWriter w(p);
  w.Put(CollectiveGapFixed{comm, first, last, count, static_cast<uint32_t>(reason.size()), 0});
  w.PutBytes(reason.data(), reason.size());
  ++gaps_reported_;
}

void Core::CloseOpenGapsLocked() {
  for (uint32_t lane : lanes_with_gap_) {
    LaneState& ls = lanes_[lane];
    if (ls.gap_open) EmitGapLocked(lane, ls, "shim buffer full");
  }
  lanes_with_gap_.clear();
  for (const auto& [comm, cg] : coll_gaps_) EmitCollGapLocked(comm, cg.first, cg.last, cg.count, {});
  coll_gaps_.clear();
}

void Core::CheckMarkersLocked(const opguard_tensor* tensors, uint32_t n, bool* hold,
                              std::string* missing) {
  for (uint32_t i = 0; i < n; ++i) {
    if (!IsPendingMarker(tensors[i])) continue;
    PendingTable::Entry* e = pending_.Find(tensors[i].fp_lo);
    if (e == nullptr) {
      if (missing->empty()) *missing = "unknown handle";
    } else if (e->state == PendingTable::State::kFailed) {
      if (missing->empty()) *missing = e->reason;
    } else if (e->state == PendingTable::State::kPending) {
      *hold = true;
    }
  }
}

void Core::PutTensorLocked(EntryWriter& w, const opguard_tensor& t, const uint8_t* entry,
                           std::vector<Held::Ref>* refs) {
  if (!IsPendingMarker(t)) {
    PutTensor(w, t);
    return;
  }
  PendingTable::Entry* e = pending_.Find(t.fp_lo);  // known: CheckMarkersLocked ran
  opguard_tensor resolved = t;
  if (e != nullptr && e->state == PendingTable::State::kResolved) {
    resolved.fp_lo = e->result.lo;
    resolved.fp_hi = e->result.hi;
    resolved.has_stats = e->result.has_stats;
    resolved.stats = e->result.stats;
  } else if (e != nullptr && refs != nullptr) {
    pending_.AddRef(e);
    refs->push_back(Held::Ref{static_cast<uint32_t>(w.pos() - entry), t.fp_lo});
    resolved.has_stats = 0;  // filled in at release
  }
  PutTensor(w, resolved);
}

void Core::ReleaseHeldLocked() {
  while (!held_.empty()) {
    Held& h = held_.front();
    std::string_view failed;
    for (const Held::Ref& ref : h.refs) {
      const PendingTable::Entry* e = pending_.Peek(ref.handle);  // referenced: never erased
      if (e->state == PendingTable::State::kPending) return;
      if (e->state == PendingTable::State::kFailed && failed.empty()) failed = e->reason;
    }
    if (failed.empty() && h.kernels_key != 0 && !h.kernels_settled) return;  // AttachKernels
    std::vector<uint8_t> bytes;
    if (!failed.empty()) {
      if (h.kernels_key != 0 && !h.kernels_settled) DiscardKernelsLocked(h.kernels_key);
      // A fingerprint that could not be taken: the record is sent as a gap
      // for its op index (or collective sequence number), not with wrong bits.
      std::string reason = "missing fingerprint: " + std::string(failed);
      EntryHeader header;
      std::memcpy(&header, h.bytes.data(), sizeof(header));
      if (header.kind == EntryKind::kOp) {
        OpFixed f;
        std::memcpy(&f, h.bytes.data() + sizeof(header), sizeof(f));
        bytes = GapEntry(f.lane, f.op_index, f.op_index, 1, reason);
        ++ops_missing_;
      } else {
        CollectiveFixed f;
        std::memcpy(&f, h.bytes.data() + sizeof(header), sizeof(f));
        bytes.resize(sizeof(EntryHeader) + sizeof(CollectiveGapFixed) + Pad8(reason.size()));
        header.size = static_cast<uint32_t>(bytes.size());
        header.kind = EntryKind::kCollectiveGap;
        EntryWriter w(bytes.data());
        w.Put(header);
        w.Put(CollectiveGapFixed{f.communicator, f.seq, f.seq, 1, static_cast<uint32_t>(reason.size()), 0});
        w.PutBytes(reason.data(), reason.size());
      }
      ++gaps_reported_;
    } else {
      for (const Held::Ref& ref : h.refs) {
        const PendingTable::Entry* e = pending_.Peek(ref.handle);
        TensorFixed tf;
        std::memcpy(&tf, h.bytes.data() + ref.offset, sizeof(tf));
        tf.lo = e->result.lo;
        tf.hi = e->result.hi;
        tf.has_stats = e->result.has_stats != 0 ? 1 : 0;
        tf.stats = tf.has_stats != 0 ? e->result.stats : opguard_tensor_stats{};
        std::memcpy(h.bytes.data() + ref.offset, &tf, sizeof(tf));
      }
    }
    const std::vector<uint8_t>& out = failed.empty() ? h.bytes : bytes;
    uint8_t* p = staging_.Append(out.size());
    if (p == nullptr) return;  // out of memory: stays held, retried on the next release
    std::memcpy(p, out.data(), out.size());
    staged_bytes_ += out.size();
    held_bytes_ -= h.bytes.size();
    if (h.record) {
      --held_records_;
      if (failed.empty()) CountStagedRecordLocked();
    }
    for (const Held::Ref& ref : h.refs) pending_.Unref(ref.handle);
    held_.pop_front();
    ++held_released_;
  }
}

void Core::FailAllPendingLocked(std::string_view reason) {
  handle_scratch_.clear();
  for (const Held& h : held_) {
    for (const Held::Ref& ref : h.refs) handle_scratch_.push_back(ref.handle);
  }
  for (uint64_t handle : handle_scratch_) pending_.Fail(handle, reason);
  // Ops still waiting for kernel names go without them.
  for (Held& h : held_) {
    if (h.kernels_key == 0 || h.kernels_settled) continue;
    h.kernels_settled = true;
    ++kernel_lists_unavailable_;
    kernels_->Forget(h.kernels_key);
  }
  ReleaseHeldLocked();
}

int Core::RecordOp(const opguard_op& in, uint64_t* op_index_out) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  opguard_op op;
  bool ok = CopySized(&in, &op) && op.lane < kMaxLanes &&
            (op.num_inputs == 0 || op.inputs != nullptr) &&
            (op.num_outputs == 0 || op.outputs != nullptr) &&
            (op.num_kernels == 0 || op.kernels != nullptr);
  size_t bytes = sizeof(OpFixed) + size_t{op.num_kernels} * 8;
  bool has_markers = false;
  for (uint32_t i = 0; ok && i < op.num_inputs; ++i) {
    const opguard_value& v = op.inputs[i];
    bytes += sizeof(ValueFixed);
    switch (v.kind) {
      case OPGUARD_VALUE_NONE:
      case OPGUARD_VALUE_SCALAR:
        break;
      case OPGUARD_VALUE_TENSOR:
        ok = ValidTensor(v.tensor);
        bytes += TensorBytes(v.tensor);
        has_markers = has_markers || IsPendingMarker(v.tensor);
        break;
      case OPGUARD_VALUE_TENSOR_LIST:
        ok = v.num_tensors == 0 || v.tensors != nullptr;
        for (uint32_t j = 0; ok && j < v.num_tensors; ++j) {
          ok = ValidTensor(v.tensors[j]);
          bytes += TensorBytes(v.tensors[j]);
          has_markers = has_markers || IsPendingMarker(v.tensors[j]);
        }
        break;
      default:
        ok = false;
    }
  }
  for (uint32_t i = 0; ok && i < op.num_outputs; ++i) {
    ok = ValidTensor(op.outputs[i]);
    bytes += TensorBytes(op.outputs[i]);
    has_markers = has_markers || IsPendingMarker(op.outputs[i]);
  }
  uint64_t start_ns = op.start_ns != 0 ? op.start_ns : CoarseWallNs();

  std::lock_guard<std::mutex> lock(mu_);
  if (!ok) {
    ++records_invalid_;
    return OPGUARD_ERR_INVALID;
  }
  LaneState& ls = lanes_[op.lane];
  uint64_t index = ls.next_op;
  if (op.op_index != OPGUARD_AUTO) {
    if (op.op_index < ls.next_op) {
      ++records_invalid_;
      return OPGUARD_ERR_INVALID;
    }
    index = op.op_index;
  }
  ls.next_op = index + 1;
  if (op_index_out != nullptr) *op_index_out = index;
  bool hold = false;
  std::string missing;
  if (has_markers) {
    for (uint32_t i = 0; i < op.num_inputs; ++i) {
      const opguard_value& v = op.inputs[i];
      if (v.kind == OPGUARD_VALUE_TENSOR) CheckMarkersLocked(&v.tensor, 1, &hold, &missing);
      if (v.kind == OPGUARD_VALUE_TENSOR_LIST) CheckMarkersLocked(v.tensors, v.num_tensors, &hold, &missing);
    }
    CheckMarkersLocked(op.outputs, op.num_outputs, &hold, &missing);
  }
  // Its kernel names come from the sender thread once the op's GPU work is
  // done: the record waits for them like for a pending fingerprint.
  const bool wants_kernels = op.kernels_key != 0 && kernels_ != nullptr && kernels_->on();
  hold = hold || wants_kernels;
  bool room = BufferedLocked() + bytes + sizeof(EntryHeader) <= config_.buffer_bytes;
  if (room && ls.gap_open) EmitGapLocked(op.lane, ls, "shim buffer full");
  if (room && !missing.empty()) {
    // A fingerprint that could not be taken: the op is missing, not wrong.
    EmitOpGapLocked(op.lane, index, index, 1, "missing fingerprint: " + missing);
    if (wants_kernels) DiscardKernelsLocked(op.kernels_key);
    return OPGUARD_OK;
  }
  const bool to_held = hold || !held_.empty();
  uint8_t* p = room ? ReserveOrderedLocked(EntryKind::kOp, bytes, hold) : nullptr;
  if (p == nullptr) {
    if (wants_kernels) DiscardKernelsLocked(op.kernels_key);
    ++records_dropped_;
    if (!ls.gap_open) {
      ls.gap_open = true;
      ls.gap_first = index;
      ls.gap_count = 0;
      lanes_with_gap_.push_back(op.lane);
    }
    ls.gap_last = index;
    ++ls.gap_count;
    return OPGUARD_ERR_DROPPED;
  }
  const uint8_t* entry = p - sizeof(EntryHeader);
  std::vector<Held::Ref>* refs = to_held ? &held_.back().refs : nullptr;
  if (wants_kernels) held_.back().kernels_key = op.kernels_key;
  EntryWriter w(p);
  OpFixed f{};
  f.op_index = index;
  f.step = (op.flags & OPGUARD_OP_EXPLICIT_STEP) != 0 ? op.step : current_step_;
  f.name = op.name;
  f.site = op.site;
  f.seq_nr = op.seq_nr;
  f.start_ns = start_ns;
  f.duration_ns = op.duration_ns;
  f.forward_site = op.forward_site;
  f.lane = op.lane;
  f.flags = op.flags;
  f.num_inputs = op.num_inputs;
  f.num_outputs = op.num_outputs;
  f.num_kernels = op.num_kernels;
  w.Put(f);
  for (uint32_t i = 0; i < op.num_inputs; ++i) {
    const opguard_value& v = op.inputs[i];
    ValueFixed vf{};
    vf.kind = v.kind;
    vf.scalar_dtype = v.scalar_dtype;
    vf.num_tensors = v.kind == OPGUARD_VALUE_TENSOR ? 1
                     : v.kind == OPGUARD_VALUE_TENSOR_LIST ? v.num_tensors
                                                           : 0;
    vf.scalar_bits = v.kind == OPGUARD_VALUE_SCALAR ? v.scalar_bits : 0;
    w.Put(vf);
    if (v.kind == OPGUARD_VALUE_TENSOR) PutTensorLocked(w, v.tensor, entry, refs);
    if (v.kind == OPGUARD_VALUE_TENSOR_LIST) {
      for (uint32_t j = 0; j < v.num_tensors; ++j) PutTensorLocked(w, v.tensors[j], entry, refs);
    }
  }
  for (uint32_t i = 0; i < op.num_outputs; ++i) PutTensorLocked(w, op.outputs[i], entry, refs);
  if (op.num_kernels != 0) std::memcpy(w.pos(), op.kernels, size_t{op.num_kernels} * 8);
  ++records_enqueued_;
  if (!to_held) CountStagedRecordLocked();
  return OPGUARD_OK;
}

int Core::RecordCollective(const opguard_collective& in, uint64_t* seq_out) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  opguard_collective c;
  bool ok = CopySized(&in, &c) && c.lane < kMaxLanes && c.phase <= OPGUARD_PHASE_ENTERED &&
            (c.num_inputs == 0 || c.inputs != nullptr) &&
            (c.num_outputs == 0 || c.outputs != nullptr) &&
            !(c.seq == OPGUARD_AUTO && c.phase != OPGUARD_PHASE_ENTERED);
  size_t bytes = sizeof(CollectiveFixed);
  for (uint32_t i = 0; ok && i < c.num_inputs; ++i) {
    ok = ValidTensor(c.inputs[i]);
    bytes += TensorBytes(c.inputs[i]);
  }
  for (uint32_t i = 0; ok && i < c.num_outputs; ++i) {
    ok = ValidTensor(c.outputs[i]);
    bytes += TensorBytes(c.outputs[i]);
  }
  uint64_t time_ns = c.time_ns != 0 ? c.time_ns : CoarseWallNs();

  std::lock_guard<std::mutex> lock(mu_);
  if (!ok) {
    ++records_invalid_;
    return OPGUARD_ERR_INVALID;
  }
  uint64_t& next = coll_next_seq_[c.communicator];
  uint64_t seq = c.seq;
  if (seq == OPGUARD_AUTO) seq = next;
  if (c.phase == OPGUARD_PHASE_ENTERED || seq >= next) next = std::max(next, seq + 1);
  if (seq_out != nullptr) *seq_out = seq;
  uint64_t op_index = c.op_index == OPGUARD_AUTO ? lanes_[c.lane].next_op : c.op_index;
  uint64_t step = c.step == OPGUARD_AUTO ? current_step_ : c.step;
  bool hold = false;
  std::string missing;
  CheckMarkersLocked(c.inputs, c.num_inputs, &hold, &missing);
  CheckMarkersLocked(c.outputs, c.num_outputs, &hold, &missing);

  bool room = BufferedLocked() + bytes + sizeof(EntryHeader) <= config_.buffer_bytes;
  auto gap = coll_gaps_.find(c.communicator);
  if (room && gap != coll_gaps_.end()) {
    EmitCollGapLocked(gap->first, gap->second.first, gap->second.last, gap->second.count, {});
    coll_gaps_.erase(gap);
  }
  if (room && !missing.empty()) {
    EmitCollGapLocked(c.communicator, seq, seq, 1, "missing fingerprint: " + missing);
    return OPGUARD_OK;
  }
  const bool to_held = hold || !held_.empty();
  uint8_t* p = room ? ReserveOrderedLocked(EntryKind::kCollective, bytes, hold) : nullptr;
  if (p == nullptr) {
    ++records_dropped_;
    auto [it, fresh] = coll_gaps_.try_emplace(c.communicator, CollGap{seq, seq, 0});
    it->second.first = std::min(it->second.first, seq);
    it->second.last = std::max(it->second.last, seq);
    ++it->second.count;
    (void)fresh;
    return OPGUARD_ERR_DROPPED;
  }
  const uint8_t* entry = p - sizeof(EntryHeader);
  std::vector<Held::Ref>* refs = to_held ? &held_.back().refs : nullptr;
  EntryWriter w(p);
  CollectiveFixed f{};
  f.communicator = c.communicator;
  f.seq = seq;
  f.count = c.count;
  f.op_index = op_index;
  f.step = step;
  f.site = c.site;
  f.time_ns = time_ns;
  f.root = c.root;
  f.lane = c.lane;
  f.phase = c.phase;
  f.kind = c.kind;
  f.dtype = c.dtype;
  f.reduce_op = c.reduce_op;
  f.num_inputs = c.num_inputs;
  f.num_outputs = c.num_outputs;
  w.Put(f);
  for (uint32_t i = 0; i < c.num_inputs; ++i) PutTensorLocked(w, c.inputs[i], entry, refs);
  for (uint32_t i = 0; i < c.num_outputs; ++i) PutTensorLocked(w, c.outputs[i], entry, refs);
  ++records_enqueued_;
  if (!to_held) CountStagedRecordLocked();
  return OPGUARD_OK;
}

uint64_t Core::Intern(std::string_view text) {
  if (!accepting()) return StringId(text);
  std::lock_guard<std::mutex> lock(mu_);
  return InternLocked(text);
}

uint64_t Core::InternLocked(std::string_view text) {
  uint64_t id = StringId(text);
  if (sent_strings_.count(id) != 0) return id;
  uint8_t* p = ReserveLocked(EntryKind::kString, sizeof(StringFixed) + Pad8(text.size()), false);
  if (p == nullptr) return id;  // not marked sent: the next call retries
  sent_strings_.insert(id);
  EntryWriter w(p);
  w.Put(StringFixed{id, text.size()});
  w.PutBytes(text.data(), text.size());
  return id;
}

uint64_t Core::Site(std::string_view file, uint32_t line, std::string_view function) {
  uint64_t id = SiteId(file, line, function);
  if (!accepting()) return id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sent_sites_.count(id) != 0) return id;
  }
  uint64_t file_id = Intern(file);
  uint64_t fn_id = Intern(function);
  std::lock_guard<std::mutex> lock(mu_);
  if (!sent_sites_.insert(id).second) return id;
  uint8_t* p = ReserveLocked(EntryKind::kSite, sizeof(SiteFixed), false);
  if (p == nullptr) {
    sent_sites_.erase(id);
    return id;
  }
  EntryWriter w(p);
  w.Put(SiteFixed{id, file_id, fn_id, line, 0});
  return id;
}

uint64_t Core::SourceFile(std::string_view path, const void* content, size_t len) {
  // Named by its path repaired to UTF-8 (the id the C API gives it); a file
  // read here is read under the path's own bytes.
  std::string repaired;
  uint64_t id = Intern(RepairedUtf8(path, &repaired));
  if (!accepting()) return id;
  bool from_path = content == nullptr;
  std::string_view bytes = from_path ? path : std::string_view(static_cast<const char*>(content), len);
  if (!from_path && len > config_.max_source_bytes) return id;
  std::lock_guard<std::mutex> lock(mu_);
  if (sent_sources_.count(id) != 0) return id;
  uint8_t* p = ReserveLocked(EntryKind::kSource, sizeof(SourceFixed) + Pad8(bytes.size()), true);
  if (p == nullptr) return id;  // buffer full: retried on the next call for this path
  sent_sources_.insert(id);
  EntryWriter w(p);
  w.Put(SourceFixed{id, bytes.size(), from_path ? 1u : 0u, 0});
  w.PutBytes(bytes.data(), bytes.size());
  return id;
}

uint64_t Core::DefineCommunicator(const opguard_communicator& in) {
  opguard_communicator c;
  if (!CopySized(&in, &c)) return 0;
  std::string repaired;  // every member repairs alike, so the id still agrees
  std::string_view name = RepairedUtf8(c.name != nullptr ? std::string_view(c.name) : std::string_view(), &repaired);
  uint32_t num_ranks = c.ranks != nullptr ? c.size : 0;
  uint64_t id = c.id;
  if (id == 0) {
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, name.data(), name.size());
    for (uint32_t i = 0; i < num_ranks; ++i) {
      uint32_t r = c.ranks[i];
      uint8_t le[4] = {static_cast<uint8_t>(r), static_cast<uint8_t>(r >> 8),
                       static_cast<uint8_t>(r >> 16), static_cast<uint8_t>(r >> 24)};
      XXH64_update(&st, le, 4);
    }
    id = XXH64_digest(&st);
    if (id == 0) id = 1;
  }
  if (!accepting()) return id;
  std::lock_guard<std::mutex> lock(mu_);
  if (sent_comms_.count(id) != 0) return id;
  size_t bytes = sizeof(CommunicatorFixed) + Pad8(name.size()) + Pad8(size_t{num_ranks} * 4);
  uint8_t* p = ReserveLocked(EntryKind::kCommunicator, bytes, false);
  if (p == nullptr) return id;
  sent_comms_.insert(id);
  EntryWriter w(p);
  w.Put(CommunicatorFixed{id, c.size, static_cast<uint32_t>(name.size()), num_ranks, 0});
  w.PutBytes(name.data(), name.size());
  w.PutBytes(c.ranks, size_t{num_ranks} * 4);
  return id;
}

int Core::MarkStep(uint32_t lane, uint64_t step) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  if (lane >= kMaxLanes) return OPGUARD_ERR_INVALID;
  uint64_t now = WallNs();
  std::lock_guard<std::mutex> lock(mu_);
  current_step_ = step;
  uint8_t* p = ReserveOrderedLocked(EntryKind::kStep, sizeof(StepFixed), false);
  if (p == nullptr) return OPGUARD_ERR_DROPPED;
  EntryWriter w(p);
  w.Put(StepFixed{step, lanes_[lane].next_op, now, lane, 0});
  return OPGUARD_OK;
}

int Core::ReportGap(uint32_t lane, uint64_t count, std::string_view reason, uint64_t* first_out) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  if (lane >= kMaxLanes || count == 0 || count > (uint64_t{1} << 48)) return OPGUARD_ERR_INVALID;
  std::lock_guard<std::mutex> lock(mu_);
  LaneState& ls = lanes_[lane];
  // A shim-side gap still open on this lane is reported first, in order.
  if (ls.gap_open) EmitGapLocked(lane, ls, "shim buffer full");
  ls.gap_open = true;
  ls.gap_first = ls.next_op;
  ls.gap_last = ls.next_op + count - 1;
  ls.gap_count = count;
  ls.next_op += count;
  if (first_out != nullptr) *first_out = ls.gap_first;
  EmitGapLocked(lane, ls, reason.empty() ? std::string_view("reported by caller") : reason);
  return OPGUARD_OK;
}

int Core::SetRunInfo(int kind, std::string_view key, std::string_view value) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  // The daemon refuses a batch with text that is not UTF-8: refuse it here,
  // where the caller can see the error, not later for the whole batch.
  if (!IsValidUtf8(key) || !IsValidUtf8(value)) return OPGUARD_ERR_INVALID;
  std::lock_guard<std::mutex> lock(meta_mu_);
  auto set = [&](KeyValues& kvs) {
    if (key.empty()) return false;
    for (auto& kv : kvs) {
      if (kv.first == key) {
        kv.second = value;
        return true;
      }
    }
    kvs.emplace_back(key, value);
    return true;
  };
  bool ok = true;
  switch (kind) {
    case OPGUARD_INFO_FRAMEWORK: announce_.framework = value; break;
    case OPGUARD_INFO_JOB_ID: announce_.job_id = value; break;
    case OPGUARD_INFO_VERSION: ok = set(announce_.versions); break;
    case OPGUARD_INFO_DETERMINISM: ok = set(announce_.determinism); break;
    case OPGUARD_INFO_ENVIRONMENT: ok = set(announce_.environment); break;
    default: ok = false;
  }
  if (!ok) return OPGUARD_ERR_INVALID;
  announce_dirty_ = true;
  return OPGUARD_OK;
}

uint64_t Core::LanePosition(uint32_t lane) {
  if (lane >= kMaxLanes) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  return lanes_[lane].next_op;
}

void Core::GetCounters(opguard_counters* out) {
  opguard_counters c{};
  c.struct_size = sizeof(c);
  c.enabled = accepting() ? 1 : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c.records_enqueued = records_enqueued_;
    c.records_dropped = records_dropped_;
    c.records_invalid = records_invalid_;
    c.gaps_reported = gaps_reported_;
    c.ops_missing = ops_missing_;
    c.buffered_bytes = BufferedLocked();
    c.fp_pending = pending_.pending();
    c.fp_resolved = pending_.resolved();
    c.fp_failed = pending_.failed();
    c.fp_refused = fp_refused_;
    c.records_held = held_records_;
    c.kernel_names = kernel_names_;
    c.kernel_lists_unavailable = kernel_lists_unavailable_;
    c.kernel_lists_cut = kernel_lists_cut_;
  }
  c.records_sent = records_sent_.load();
  c.records_acked = records_acked_.load();
  c.records_rejected = records_rejected_.load();
  c.batches_sent = batches_sent_.load();
  c.batches_acked = batches_acked_.load();
  c.batches_resent = batches_resent_.load();
  c.batches_rejected = batches_rejected_.load();
  c.bytes_sent = bytes_sent_.load();
  c.pending_batches = pending_batches_.load();
  size_t n = std::min<size_t>(out->struct_size, sizeof(c));
  uint32_t caller_size = out->struct_size;
  std::memcpy(out, &c, n);
  out->struct_size = caller_size;
}

// ---------------------------------------------------------------------------
// Pending fingerprints

int Core::PendingBegin(uint64_t* handle_out) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t h = pending_.Begin();
  if (h == 0) {
    ++fp_refused_;
    return OPGUARD_ERR_DROPPED;
  }
  *handle_out = h;
  return OPGUARD_OK;
}

int Core::PendingResolve(uint64_t handle, const FpResult& result) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_.Resolve(handle, result)) return OPGUARD_ERR_INVALID;
  ReleaseHeldLocked();
  return OPGUARD_OK;
}

int Core::PendingFail(uint64_t handle, std::string_view reason) {
  // The reason goes into a gap notice, which must be UTF-8 (the C API repairs it).
  if (reason.empty() || !IsValidUtf8(reason)) reason = "failed";
  std::lock_guard<std::mutex> lock(mu_);
  // At most 200 bytes, cut between characters.
  std::string_view cut = reason.substr(0, 200);
  while (!IsValidUtf8(cut)) cut.remove_suffix(1);
  if (!pending_.Fail(handle, cut)) return OPGUARD_ERR_INVALID;
  ReleaseHeldLocked();
  return OPGUARD_OK;
}

int Core::FingerprintHostAsync(HostFingerprinter::Job job, uint64_t* handle_out) {
  int rc = PendingBegin(&job.handle);
  if (rc != OPGUARD_OK) return rc;
  uint64_t handle = job.handle;
  if (!host_fp_->Submit(std::move(job))) {
    // No worker thread: give the handle back as failed; nothing was taken.
    (void)PendingFail(handle, "no fingerprint thread");
    return OPGUARD_ERR_DROPPED;
  }
  *handle_out = handle;
  return OPGUARD_OK;
}

int Core::FingerprintDeviceAsync(const opguard_device_tensor& t, bool contiguous, void* stream,
                                 uint64_t* handle_out) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  uint64_t handle = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handle = pending_.Begin();
    if (handle == 0) {
      // At the limit the record becomes a gap: a handle that is failed at
      // once (it waits for nothing, so it is outside the limit).
      ++fp_refused_;
      *handle_out = pending_.BeginFailed("pending fingerprint limit");
      return OPGUARD_OK;
    }
  }
  *handle_out = handle;
  std::call_once(device_once_, [&] {
    std::string why;
    device_fp_ = load_device_(config_.max_pending_fp, &why);
    if (device_fp_ == nullptr) {
      OPGUARD_LOG(LogLevel::kWarn, "no CUDA device fingerprints (" + why +
                                       "); records of device tensors become gaps");
    }
    device_ready_.store(device_fp_.get(), std::memory_order_release);
  });
  DeviceFingerprinter* device = device_ready_.load(std::memory_order_acquire);
  std::string why;
  if (device == nullptr) {
    why = "no CUDA device";
  } else if (!contiguous) {
    why = "non-contiguous device tensor";
  } else {
    why = device->Launch(handle, t, stream);
  }
  if (!why.empty()) (void)PendingFail(handle, why);
  return OPGUARD_OK;
}

// ---------------------------------------------------------------------------
// Kernel attribution

int Core::KernelsBegin(uint64_t* key_out) {
  if (!accepting()) return OPGUARD_ERR_DISABLED;
  if (kernels_ == nullptr) return OPGUARD_ERR_UNSUPPORTED;
  uint64_t key = next_kernels_key_.fetch_add(1, std::memory_order_relaxed);
  if (!kernels_->BeginOp(key)) return OPGUARD_ERR_UNSUPPORTED;
  *key_out = key;
  return OPGUARD_OK;
}

void Core::KernelsEnd(uint64_t key) {
  if (kernels_ != nullptr) kernels_->EndOp(key);
}

void Core::KernelsDiscard(uint64_t key) {
  if (kernels_ == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  DiscardKernelsLocked(key);
}

void Core::DiscardKernelsLocked(uint64_t key) {
  // CUPTI delivers the op's records later: the sender forgets the op once
  // they are in (AttachKernels). A flood of them is let go; CUPTI's side
  // bounds itself (KernelLedger::kMaxOpenOps).
  if (kernels_discarded_.size() < kMaxDiscardedKernelKeys) kernels_discarded_.push_back(key);
}

void Core::AppendKernelsLocked(Held& h, const std::vector<std::string_view>& names) {
  size_t n = names.size();
  if (n > kMaxKernelsPerOp) {
    n = kMaxKernelsPerOp;
    ++kernel_lists_cut_;
  }
  if (n == 0) return;
  EntryHeader header;
  OpFixed f;
  std::memcpy(&header, h.bytes.data(), sizeof(header));
  std::memcpy(&f, h.bytes.data() + sizeof(header), sizeof(f));
  // Kernels are the entry's last field: the names go after the caller's.
  const size_t at = h.bytes.size();
  h.bytes.resize(at + n * sizeof(uint64_t));
  for (size_t i = 0; i < n; ++i) {
    uint64_t id = InternLocked(names[i]);
    std::memcpy(h.bytes.data() + at + i * sizeof(uint64_t), &id, sizeof(id));
  }
  header.size += static_cast<uint32_t>(n * sizeof(uint64_t));
  f.num_kernels += static_cast<uint32_t>(n);
  std::memcpy(h.bytes.data(), &header, sizeof(header));
  std::memcpy(h.bytes.data() + sizeof(header), &f, sizeof(f));
  held_bytes_ += n * sizeof(uint64_t);
  kernel_names_ += n;
}

bool Core::AttachKernels() {
  if (kernels_ == nullptr) return false;
  // 1. Ops whose fingerprints all settled: their GPU work is done (a device
  //    fingerprint resolves when an event recorded after the op completed).
  //    Every such op, not only the head of held_: one flush then finalises
  //    them all.
  kernel_keys_scratch_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Held& h : held_) {
      if (h.kernels_key == 0 || h.gpu_done) continue;
      bool settled = true;
      for (const Held::Ref& ref : h.refs) {
        settled = settled && pending_.Peek(ref.handle)->state != PendingTable::State::kPending;
      }
      if (!settled) continue;
      h.gpu_done = true;
      kernel_keys_scratch_.push_back(h.kernels_key);
    }
    for (uint64_t key : kernels_discarded_) kernel_keys_scratch_.push_back(key);
    kernels_forgetting_.insert(kernels_forgetting_.end(), kernels_discarded_.begin(),
                               kernels_discarded_.end());
    kernels_discarded_.clear();
  }
  for (uint64_t key : kernel_keys_scratch_) kernels_->GpuWorkDone(key);
  // 2. CUPTI hands over what it holds (on this thread, never the training one).
  if (kernels_->waiting_for_flush()) kernels_->Flush();
  const bool on = kernels_->on();
  std::vector<std::string_view> unused;
  for (auto it = kernels_forgetting_.begin(); it != kernels_forgetting_.end();) {
    unused.clear();
    if (on && kernels_->KernelsFor(*it, &unused) == KernelSource::State::kPending) {
      ++it;
    } else {
      if (!on) kernels_->Forget(*it);
      it = kernels_forgetting_.erase(it);
    }
  }
  // 3. Final lists into their records, in any order; release in record order.
  bool waiting = false;
  std::lock_guard<std::mutex> lock(mu_);
  for (Held& h : held_) {
    if (h.kernels_key == 0 || h.kernels_settled) continue;
    if (!h.gpu_done) {
      waiting = true;
      continue;
    }
    kernel_names_scratch_.clear();
    KernelSource::State state = kernels_->KernelsFor(h.kernels_key, &kernel_names_scratch_);
    if (state == KernelSource::State::kPending && on) {
      waiting = true;
      continue;
    }
    if (state == KernelSource::State::kReady) {
      AppendKernelsLocked(h, kernel_names_scratch_);
    } else {
      // Attribution turned off before the op's list was final: sent without.
      if (state == KernelSource::State::kPending) kernels_->Forget(h.kernels_key);
      ++kernel_lists_unavailable_;
    }
    h.kernels_settled = true;
  }
  ReleaseHeldLocked();
  return waiting || !kernels_forgetting_.empty();
}

// ---------------------------------------------------------------------------
// Waiting calls

int Core::Flush(uint32_t timeout_ms) {
  auto deadline = Clock::now() + milliseconds(timeout_ms);
  std::unique_lock<std::mutex> lock(wait_mu_);
  if (sender_done_) return shutdown_clean_ ? OPGUARD_OK : OPGUARD_ERR_TIMEOUT;
  uint64_t gen = ++flush_requested_;
  flush_pending_.store(true, std::memory_order_release);
  Wake();
  bool done = wait_cv_.wait_until(lock, deadline, [&] { return flush_completed_ >= gen || sender_done_; });
  if (flush_completed_ >= gen) return OPGUARD_OK;
  if (done && sender_done_) return shutdown_clean_ ? OPGUARD_OK : OPGUARD_ERR_TIMEOUT;
  return OPGUARD_ERR_TIMEOUT;
}

int Core::Shutdown(uint32_t timeout_ms) {
  accepting_.store(false, std::memory_order_release);
  auto now = Clock::now();
  std::unique_lock<std::mutex> lock(wait_mu_);
  if (!sender_thread_.joinable() && sender_done_) return shutdown_clean_ ? OPGUARD_OK : OPGUARD_ERR_TIMEOUT;
  if (!stop_requested_) {
    stop_requested_ = true;
    stop_deadline_ = now + milliseconds(timeout_ms);
  }
  auto deadline = stop_deadline_;
  Wake();
  // The sender gives up by the deadline itself; the grace covers one loop turn.
  wait_cv_.wait_until(lock, deadline + milliseconds(1000), [&] { return sender_done_; });
  // sender_thread_ is joined or detached under wait_mu_, so two callers (the exit
  // handler and a host thread) never both do it. A done sender never takes
  // wait_mu_ again, so joining it here cannot deadlock. One that is not done
  // yet (a long last encode) is detached rather than left joinable: it ends on
  // its own, and at exit the process must not wait for it.
  if (sender_thread_.joinable()) {
    if (sender_done_) {
      sender_thread_.join();
    } else {
      sender_thread_.detach();
    }
  }
  return sender_done_ && shutdown_clean_ ? OPGUARD_OK : OPGUARD_ERR_TIMEOUT;
}

// ---------------------------------------------------------------------------
// Sender thread

bool Core::HarvestDevice() {
  DeviceFingerprinter* device = device_ready_.load(std::memory_order_acquire);
  return device != nullptr && device->Harvest(*this) > 0;
}

uint64_t Core::HeldPushed() {
  std::lock_guard<std::mutex> lock(mu_);
  return held_pushed_;
}

bool Core::HeldReleasedUpTo(uint64_t target) {
  std::lock_guard<std::mutex> lock(mu_);
  return held_released_ >= target;
}

void Core::SenderMain() {
  pthread_setname_np(pthread_self(), "opguard-send");
  try {
    SenderLoop();
  } catch (const std::exception& e) {
    Fail(std::string("sender: ") + e.what());
  } catch (...) {
    Fail("sender: unknown exception");
  }
  std::lock_guard<std::mutex> lock(wait_mu_);
  sender_done_ = true;
  shutdown_clean_ = shutdown_clean_ && !failed_.load();
  wait_cv_.notify_all();
}

AnnounceInfo Core::SnapshotAnnounce() {
  std::lock_guard<std::mutex> lock(meta_mu_);
  announce_dirty_ = false;
  return announce_;
}

void Core::CutAndEncode(bool end_of_run) {
  EncodeSome(SIZE_MAX);  // the cut in progress, if any, goes first
  if (Cut(end_of_run)) EncodeSome(SIZE_MAX);
}

bool Core::Cut(bool end_of_run) {
  uint64_t estimate = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CloseOpenGapsLocked();
    staging_.Swap(spare_);
    estimate = staged_bytes_;  // == spare_.size(): staged entries now count as unacknowledged
    unacked_bytes_.fetch_add(estimate, std::memory_order_relaxed);
    staged_bytes_ = 0;
    staged_records_.store(0, std::memory_order_relaxed);
  }
  bool announce_due = next_seq_ == 0;
  {
    std::lock_guard<std::mutex> lock(meta_mu_);
    announce_due = announce_due || announce_dirty_;
  }
  if (spare_.empty() && !announce_due && !end_of_run) {
    unacked_bytes_.fetch_sub(estimate, std::memory_order_relaxed);
    return false;
  }
  spare_announce_due_ = announce_due;
  if (announce_due) spare_announce_ = SnapshotAnnounce();
  spare_end_of_run_ = end_of_run;
  spare_offset_ = 0;
  encoding_ = true;
  return true;
}

void Core::EncodeSome(size_t max_batches) {
  if (!encoding_) return;
  EncodeStats stats;
  size_t consumed = 0;
  const uint8_t* from = spare_.empty() ? nullptr : spare_.data() + spare_offset_;
  auto batches = encoder_.Encode(from, spare_.size() - spare_offset_,
                                 spare_announce_due_ ? &spare_announce_ : nullptr, spare_end_of_run_,
                                 &next_seq_, &stats, std::max<size_t>(max_batches, 1), &consumed);
  if (!batches.empty()) spare_announce_due_ = false;
  spare_offset_ += consumed;
  uint64_t actual = 0;
  auto now = Clock::now();
  for (auto& b : batches) {
    actual += b.buffer.size();
    sender_.Add(b.seq,
                Sender::Batch{std::make_shared<const flatbuffers::DetachedBuffer>(std::move(b.buffer)), b.records},
                now);
  }
  // The staged bytes just encoded are replaced by their batches.
  unacked_bytes_.fetch_add(actual, std::memory_order_relaxed);
  unacked_bytes_.fetch_sub(consumed, std::memory_order_relaxed);
  pending_batches_.store(sender_.pending(), std::memory_order_relaxed);
  if (spare_offset_ >= spare_.size()) {
    encoding_ = false;
    spare_offset_ = 0;
    spare_.Clear();
    // Keep the capacity a busy interval needs; give back only a backlog's worth.
    spare_.ShrinkIfIdle(64u << 20);
  }
  if (stats.sources_skipped != 0) {
    OPGUARD_LOG(LogLevel::kDebug, std::to_string(stats.sources_skipped) +
                                      " source file(s) unreadable or over OPGUARD_MAX_SOURCE_KB; not sent");
  }
}

void Core::ReceiveAcks(zmq::socket_t& sock) {
  wire::AlignedStorage aligned;  // ZeroMQ frames may start at any address
  const auto now = Clock::now();
  bool progress = false;
  for (int i = 0; i < 100000; ++i) {
    zmq::message_t msg;
    auto got = sock.recv(msg, zmq::recv_flags::dontwait);
    if (!got) break;
    auto env = wire::OpenEnvelope(msg.data(), msg.size(), aligned, kMaxAckBytes);
    if (!env.ok() || (*env)->message_type() != wire::Message::Ack) {
      OPGUARD_LOG(LogLevel::kDebug, "ignoring a message from the daemon that is not an Ack");
      continue;
    }
    const wire::Ack* ack = (*env)->message_as_Ack();
    if (ack->session() != session_ || ack->rank() != config_.rank || ack->run() == nullptr ||
        ack->run()->string_view() != config_.run) {
      continue;  // an ack for another session (e.g. a previous process on this socket path)
    }
    if (ack->code() == wire::AckCode::Retry) {
      // The daemon's disk is full: keep the batch, send it again later.
      sender_.Defer(ack->seq(), now);
      if (!warned_deferred_) {
        warned_deferred_ = true;
        std::string why = ack->error() != nullptr ? ack->error()->str() : "no reason given";
        OPGUARD_LOG(LogLevel::kWarn, "the daemon cannot store records now (" + why +
                                         "); keeping them and retrying (logged once)");
      }
      continue;
    }
    std::optional<Sender::Batch> batch = sender_.Acknowledge(ack->seq(), now);
    if (!batch) continue;  // duplicate ack after a resend
    progress = true;
    uint32_t records = batch->records;
    if (ack->code() == wire::AckCode::Durable) {
      records_acked_.fetch_add(records, std::memory_order_relaxed);
      batches_acked_.fetch_add(1, std::memory_order_relaxed);
    } else {
      records_rejected_.fetch_add(records, std::memory_order_relaxed);
      batches_rejected_.fetch_add(1, std::memory_order_relaxed);
      if (!warned_rejected_) {
        warned_rejected_ = true;
        std::string why = ack->error() != nullptr ? ack->error()->str() : "no reason given";
        OPGUARD_LOG(LogLevel::kError, "the daemon rejected batch " + std::to_string(ack->seq()) +
                                          " (" + why + "); dropping it (later rejections are only counted)");
      }
    }
    unacked_bytes_.fetch_sub(batch->bytes->size(), std::memory_order_relaxed);
  }
  if (progress) {
    ack_timeout_now_ms_.store(
        static_cast<uint32_t>(std::chrono::duration_cast<milliseconds>(sender_.AckTimeout()).count()),
        std::memory_order_relaxed);
  }
  pending_batches_.store(sender_.pending(), std::memory_order_relaxed);
}

void Core::ReceiveMonitorEvents(zmq::socket_t& monitor) {
  for (int i = 0; i < 1000; ++i) {
    zmq::message_t first;
    if (!monitor.recv(first, zmq::recv_flags::dontwait)) break;
    uint16_t event = 0;
    if (first.size() >= sizeof(event)) std::memcpy(&event, first.data(), sizeof(event));
    bool more = first.more();
    while (more) {  // the endpoint frame; parts of one message arrive together
      zmq::message_t part;
      if (!monitor.recv(part, zmq::recv_flags::none)) break;
      more = part.more();
    }
    if (event == ZMQ_EVENT_DISCONNECTED) sender_.ConnectionLost(Clock::now());
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) sender_.ConnectionUp();
  }
}

bool Core::Transmit(zmq::socket_t& sock, const Sender::Batch& batch, bool resend) {
  // Zero-copy: the message points at the batch buffer and holds a reference
  // to it, released by ZeroMQ (on its I/O thread, or here if the send fails)
  // once the bytes are written or dropped. The buffer is never written again.
  using Ref = std::shared_ptr<const flatbuffers::DetachedBuffer>;
  zmq::message_t msg(
      const_cast<uint8_t*>(batch.bytes->data()), batch.bytes->size(),
      [](void*, void* ref) { delete static_cast<Ref*>(ref); }, new Ref(batch.bytes));
  auto ok = sock.send(msg, zmq::send_flags::dontwait);
  if (!ok) return false;  // not connected (ZMQ_IMMEDIATE) or high-water mark: retry later
  if (!resend) {
    batches_sent_.fetch_add(1, std::memory_order_relaxed);
    records_sent_.fetch_add(batch.records, std::memory_order_relaxed);
  } else {
    batches_resent_.fetch_add(1, std::memory_order_relaxed);
  }
  bytes_sent_.fetch_add(batch.bytes->size(), std::memory_order_relaxed);
  return true;
}

void Core::SendPending(zmq::socket_t& sock) {
  // Silence is judged on acks that have arrived, not on those we have been
  // too busy (encoding, a starved CPU) to read: take them first.
  ReceiveAcks(sock);
  const Clock::time_point now = Clock::now();
  sender_.Send(now, [&](uint64_t, const Sender::Batch& batch, bool resend) {
    return Transmit(sock, batch, resend);
  });
  if (!warned_unreachable_ && sender_.LooksUnreachable(now)) {
    // Nothing acknowledged since the oldest batch was made (a slow daemon
    // that still acks holds batches back too, but is not unreachable).
    warned_unreachable_ = true;
    OPGUARD_LOG(LogLevel::kWarn, "no acknowledgement from the daemon at " + config_.endpoint +
                                     " yet; buffering up to " + std::to_string(config_.buffer_bytes >> 20) +
                                     " MiB, then dropping records with gap notices");
  }
}

void Core::SenderLoop() {
  zmq::socket_t sock(*ctx_, zmq::socket_type::dealer);
  sock.set(zmq::sockopt::linger, 0);
  // Send only over a live connection: while the daemon is away, batches stay
  // in our bounded buffer instead of piling up (and dying) in ZeroMQ's pipes.
  sock.set(zmq::sockopt::immediate, 1);
  sock.set(zmq::sockopt::reconnect_ivl, 100);
  sock.set(zmq::sockopt::reconnect_ivl_max, 1000);
  sock.set(zmq::sockopt::sndhwm, 1000);
  sock.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxAckBytes));
  // A dropped connection (daemon restart) loses what was in flight on it; the
  // monitor tells us at once, instead of after an ack timeout.
  std::optional<zmq::socket_t> monitor;
  if (zmq_socket_monitor(sock.handle(), kMonitorEndpoint,
                         ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED) == 0) {
    monitor.emplace(*ctx_, zmq::socket_type::pair);
    monitor->set(zmq::sockopt::linger, 0);
    monitor->connect(kMonitorEndpoint);
  } else {
    OPGUARD_LOG(LogLevel::kDebug, std::string("no connection monitor (") + zmq_strerror(zmq_errno()) +
                                      "); a daemon restart is noticed by the ack timeout");
  }
  // Stop the monitor before its socket and the monitored one close.
  struct MonitorStop {
    zmq::socket_t& sock;
    bool active;
    ~MonitorStop() {
      if (active) zmq_socket_monitor(sock.handle(), nullptr, 0);
    }
  } monitor_stop{sock, monitor.has_value()};
  sock.connect(config_.endpoint);

  auto interval = milliseconds(config_.batch_interval_ms);
  auto next_cut = Clock::now() + interval;
  uint64_t flush_gen_handled = 0;
  uint64_t flush_target_seq = 0;  // batches below this settle the handled flush
  bool stopping = false;
  Clock::time_point stop_deadline{};
  bool waiting_on_fps = false;  // device results in flight, or a flush/stop waits for held records
  uint64_t flush_hold_gen = 0, flush_hold_target = 0;
  bool stop_draining = false;
  uint64_t stop_hold_target = 0;
  Clock::time_point stop_drain_until{};

  while (true) {
    auto now = Clock::now();
    // How long we may sleep: the next time cut (or, while a cut is being
    // encoded, until fewer than a window of batches wait unsent), a retry of
    // unsent batches, the earliest resend, the stop deadline.
    const size_t unsent = sender_.unsent();
    Clock::duration wait = next_cut - now;
    if (encoding_) wait = unsent < config_.max_in_flight ? Clock::duration::zero() : milliseconds(1000);
    // Batches waiting while the window has room: the last send failed (no
    // connection yet, or ZeroMQ's high-water mark); retry soon. With a full
    // window, an ack (socket readable) or a resend check wakes us instead.
    if (unsent > 0 && sender_.window_has_room()) {
      // While sends are held ("retry later"), not before the hold ends.
      wait = std::min<Clock::duration>(wait, std::max<Clock::duration>(milliseconds(5), sender_.hold_until() - now));
    }
    if (Clock::time_point resend_at = sender_.NextResendCheck(); resend_at != Clock::time_point::max()) {
      wait = std::min<Clock::duration>(wait, resend_at - now);
    }
    if (stopping) wait = std::min<Clock::duration>(wait, stop_deadline - now);
    // Pending fingerprints are polled (device events) or waited for
    // (released by the host fingerprint thread) every millisecond.
    if (waiting_on_fps) wait = std::min<Clock::duration>(wait, milliseconds(1));
    long wait_ms = std::max<long>(0, std::chrono::duration_cast<milliseconds>(wait).count());
    // Round up: waking a fraction of a millisecond early only spins.
    if (wait > milliseconds(wait_ms)) ++wait_ms;

    zmq_pollitem_t items[3] = {{sock.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, wake_fd_, ZMQ_POLLIN, 0},
                               {monitor ? monitor->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, monitor ? 3 : 2, milliseconds(wait_ms));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
    if ((items[1].revents & ZMQ_POLLIN) != 0) {
      uint64_t count;
      ssize_t unused = ::read(wake_fd_, &count, sizeof(count));
      (void)unused;
    }
    // Acks first: one that arrived before the connection dropped still counts.
    ReceiveAcks(sock);
    if (monitor) ReceiveMonitorEvents(*monitor);
    now = Clock::now();

    uint64_t flush_gen = 0;
    bool stop_now = false;
    {
      std::lock_guard<std::mutex> lock(wait_mu_);
      flush_gen = flush_requested_;
      if (stop_requested_ && !stopping && !stop_draining) {
        stop_now = true;
        stop_deadline = stop_deadline_;
      }
    }
    // Records held for pending fingerprints: a flush covers those recorded
    // before it, so it waits (within its deadline) until they are released;
    // a stop gives them half its time, then sends them as gaps.
    waiting_on_fps = HarvestDevice();
    waiting_on_fps = AttachKernels() || waiting_on_fps;
    bool flush_ready = false;
    if (flush_gen > flush_gen_handled) {
      if (flush_hold_gen != flush_gen) {
        flush_hold_gen = flush_gen;
        flush_hold_target = HeldPushed();
      }
      flush_ready = HeldReleasedUpTo(flush_hold_target);
      waiting_on_fps = waiting_on_fps || !flush_ready;
    }
    if (stop_now) {
      stop_draining = true;
      stop_hold_target = HeldPushed();
      stop_drain_until = now + (stop_deadline - now) / 2;
    }
    if (stop_draining && (HeldReleasedUpTo(stop_hold_target) || now >= stop_drain_until)) {
      stop_draining = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        FailAllPendingLocked("shutdown before the fingerprint was ready");
      }
      stopping = true;
      CutAndEncode(/*end_of_run=*/true);
      next_cut = now + interval;
    } else if (stop_draining) {
      waiting_on_fps = true;
    }
    if (stopping || stop_draining) {
      // Nothing new to cut: the end-of-run cut took everything.
    } else if (flush_ready) {
      CutAndEncode(/*end_of_run=*/false);
      next_cut = now + interval;
    } else {
      // Encode only what the window can take soon: a backlog waits in the
      // bounded buffer (staged or cut), and the loop stays free for acks.
      if (!encoding_ && (staged_records_.load(std::memory_order_relaxed) >= config_.batch_records ||
                         now >= next_cut)) {
        Cut(/*end_of_run=*/false);
        next_cut = now + interval;
      }
      size_t unsent = sender_.unsent();
      if (encoding_ && unsent < config_.max_in_flight) EncodeSome(config_.max_in_flight - unsent);
    }
    if (flush_gen > flush_gen_handled && (flush_ready || stopping)) {
      flush_gen_handled = flush_gen;
      flush_target_seq = next_seq_;
    }
    SendPending(sock);

    if (flush_gen_handled != 0 && sender_.SettledBelow(flush_target_seq)) {
      std::lock_guard<std::mutex> lock(wait_mu_);
      if (flush_completed_ < flush_gen_handled) {
        flush_completed_ = flush_gen_handled;
        wait_cv_.notify_all();
      }
    }
    if (stopping && (sender_.pending() == 0 || Clock::now() >= stop_deadline)) break;
  }
  bool clean = sender_.pending() == 0;
  if (!clean) {
    OPGUARD_LOG(LogLevel::kWarn, std::to_string(sender_.pending_records()) + " record(s) in " +
                                     std::to_string(sender_.pending()) +
                                     " batch(es) were not acknowledged by the daemon at " +
                                     config_.endpoint + " before the flush deadline; they are lost");
  }
  // CUPTI's activity kinds off and its buffers returned, on this thread.
  if (kernels_ != nullptr) kernels_->Stop();
  std::lock_guard<std::mutex> lock(wait_mu_);
  shutdown_clean_ = clean;
}

}  // namespace opguard::shim
