#include "ingest/ingest.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <typeinfo>

#include "access/access.h"
#include "opguard/common/log.h"
#include "opguard/common/saturating.h"
#include "opguard/common/utf8.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

using Clock = std::chrono::steady_clock;

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

uint64_t WallNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Run names show up in file-system-like places (URLs, CLI arguments): keep
// them printable, without '/' or whitespace.
bool ValidRunName(const flatbuffers::String* name) {
  if (name == nullptr || name->size() == 0 || name->size() > 200) return false;
  for (uint8_t c : name->string_view()) {
    if (c <= 0x20 || c == 0x7f || c == '/' || c == '\\' || c == '?' || c == '#' || c == '%') return false;
  }
  return true;
}

// Calls bad(text) for every text field of a batch; returns the name of the
// first field it flags, or "".
template <typename Bad>
std::string FindText(const wire::Batch& batch, Bad bad_text) {
  auto bad = [&bad_text](const flatbuffers::String* s) {
    return s != nullptr && bad_text(s->string_view());
  };
  auto bad_pairs = [&bad](const flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>* kv) {
    return kv != nullptr && std::any_of(kv->begin(), kv->end(),
                                        [&bad](const auto* e) { return bad(e->key()) || bad(e->value()); });
  };
  if (bad(batch.run())) return "run name";
  if (const auto* a = batch.announce()) {
    if (bad(a->job_id())) return "job id";
    if (bad(a->node())) return "node";
    if (bad(a->framework())) return "framework";
    if (bad_pairs(a->versions())) return "a version key or value";
    if (bad_pairs(a->determinism())) return "a determinism key or value";
    if (bad_pairs(a->environment())) return "an environment key or value";
  }
  if (const auto* v = batch.strings()) {
    for (const auto* s : *v) {
      if (bad(s->text())) return "interned string " + std::to_string(s->id());
    }
  }
  if (const auto* v = batch.communicators()) {
    for (const auto* c : *v) {
      if (bad(c->name())) return "communicator name";
    }
  }
  if (const auto* v = batch.gaps()) {
    for (const auto* g : *v) {
      if (bad(g->reason())) return "gap reason";
    }
  }
  return "";
}

// Host names are at most 255 bytes (DNS); a rank's node is kept in memory.
constexpr size_t kMaxNodeBytes = 255;

// The limits a batch can break on its own (docs/daemon.md, Limits): every
// text field of the batch ends up in the run's JSON (registry, HTTP, CLI),
// which must be UTF-8, and numbers that size memory are bounded. Returns the
// reason and what is wrong, or kCount when the batch is within them.
std::pair<RejectReason, std::string> CheckBatch(const wire::Batch& batch, const Config& config) {
  // The run name is the run's identity: refused, never repaired. Other text
  // that is not UTF-8 is stored repaired (Text below).
  if (batch.run() != nullptr && !IsValidUtf8(batch.run()->string_view())) {
    return {RejectReason::kInvalidBatch, "run name is not valid UTF-8"};
  }
  if (batch.seq() >= (uint64_t{1} << 62)) return {RejectReason::kInvalidBatch, "seq beyond 2^62"};
  const uint64_t max_string = config.max_string_bytes;
  if (std::string field =
          FindText(batch, [max_string](std::string_view t) { return t.size() > max_string; });
      !field.empty()) {
    return {RejectReason::kLimit,
            field + " is longer than ingest.max_string_bytes (" + std::to_string(max_string) + ")"};
  }
  const uint32_t max_world = config.max_world_size;
  if (batch.rank() >= max_world) {
    return {RejectReason::kLimit, "rank " + std::to_string(batch.rank()) +
                                      " is not below ingest.max_world_size (" +
                                      std::to_string(max_world) + ")"};
  }
  if (const auto* a = batch.announce()) {
    if (a->world_size() > max_world) {
      return {RejectReason::kLimit, "world size " + std::to_string(a->world_size()) +
                                        " exceeds ingest.max_world_size (" +
                                        std::to_string(max_world) + ")"};
    }
    if (a->world_size() != 0 && batch.rank() >= a->world_size()) {
      return {RejectReason::kInvalidBatch, "rank " + std::to_string(batch.rank()) +
                                               " is outside the world size " +
                                               std::to_string(a->world_size()) + " it announces"};
    }
    if (a->node() && a->node()->size() > kMaxNodeBytes) {
      return {RejectReason::kLimit,
              "node name longer than " + std::to_string(kMaxNodeBytes) + " bytes"};
    }
  }
  return {RejectReason::kCount, ""};
}

// Bytes an announce adds to a run's metadata (see Ingest::ApplyAnnounce: a
// field is set once, a setting's key is added once). Keys repeated within
// the announce count each time: an upper bound is enough for a limit.
uint64_t AddedMetadataBytes(const RunState& run, const wire::RunAnnounce& a) {
  uint64_t n = 0;
  if (run.job_id.empty() && a.job_id()) n += a.job_id()->size();
  if (run.framework.empty() && a.framework()) n += a.framework()->size();
  auto pairs = [&n](const std::vector<std::pair<std::string, std::string>>& field,
                    const flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>* v) {
    if (v == nullptr) return;
    for (const auto* e : *v) {
      if (e->key() == nullptr) continue;
      const auto key = e->key()->string_view();
      const bool known = std::any_of(field.begin(), field.end(),
                                     [&key](const auto& kv) { return kv.first == key; });
      if (!known) n += key.size() + (e->value() ? e->value()->size() : 0);
    }
  };
  pairs(run.determinism, a.determinism());
  pairs(run.versions, a.versions());
  pairs(run.environment, a.environment());
  return n;
}

// A text of a batch as stored: every byte that is not part of valid UTF-8
// written as \xNN (what the shim's C API does before sending), so one bad
// byte costs neither the batch nor the record (docs/daemon.md).
std::string Text(const flatbuffers::String* s) {
  if (s == nullptr) return std::string();
  return IsValidUtf8(s->string_view()) ? s->str() : RepairUtf8(s->string_view());
}

std::vector<std::pair<std::string, std::string>> Pairs(
    const flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>* kv) {
  std::vector<std::pair<std::string, std::string>> out;
  if (kv == nullptr) return out;
  for (const auto* e : *kv) {
    if (e->key() == nullptr) continue;
    out.emplace_back(Text(e->key()), Text(e->value()));
  }
  return out;
}

std::string OwnerName(int64_t uid) {
  return uid == kUnknownOwner ? std::string("an unknown sender") : "uid " + std::to_string(uid);
}

}  // namespace

// The uid that sent `message` (ipc:// ingest), else kUnknownOwner.
int64_t Ingest::SenderUid(const zmq::message_t& message) const {
  if (!unix_ingest_) return kUnknownOwner;
  const auto uid = UnixPeerUid(message);
  return uid ? static_cast<int64_t>(*uid) : kUnknownOwner;
}

struct Ingest::PendingAck {
  std::vector<zmq::message_t> route;  // routing frames to reply through
  uint16_t minor = 0;                 // the sender's schema minor
  std::string run;
  uint32_t rank = 0;
  uint64_t session = 0;
  uint64_t seq = 0;
  int64_t received_ns = 0;
};

struct Ingest::Group {
  explicit Group(const Store* store) : batch(store) {}

  StoreBatch batch;
  uint64_t number = 0;  // groups are numbered from 1 as they open
  std::vector<PendingAck> acks;
  size_t duplicates = 0;
  std::vector<RunUpdate> publish;  // what this group changed, published once durable
  std::vector<DeleteRequest> deletes;
  Status result;
  // Metrics to add once durable.
  RecordCounts records;
  uint64_t bytes = 0;

  bool Empty() const { return acks.empty() && deletes.empty() && batch.count() == 0; }
  // Ready for reuse, keeping the capacity of the WriteBatch and the vectors
  // (a fresh group would page-fault its way up to the same size again).
  void Reset() {
    batch.Clear();
    acks.clear();
    duplicates = 0;
    publish.clear();
    deletes.clear();
    result = Status::Ok();
    records = RecordCounts();
    bytes = 0;
  }
};

Ingest::Ingest(const Config& config, Store* store, RunRegistry* registry, Metrics* metrics,
               zmq::context_t* context)
    : config_(config),
      store_(store),
      registry_(registry),
      metrics_(metrics),
      context_(context),
      writer_(ChunkCodecByName(config.compression), config.op_cores, config.max_source_bytes),
      unix_ingest_(IsUnixEndpoint(config.ingest)) {}

Ingest::~Ingest() {
  Stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status Ingest::Start() {
  OPGUARD_RETURN_IF_ERROR(store_->LoadRegistry(&working_, &next_run_id_));
  for (auto& [name, run] : working_) {
    id_to_name_[run.id] = name;
    working_ranks_ += run.ranks.size();
    if (run.world_size > config_.max_world_size) {
      // Stored before the limit existed: queries would size their answers by it.
      OPGUARD_LOG(LogLevel::kWarn, "run '" + name + "': stored world size " +
                                       std::to_string(run.world_size) +
                                       " exceeds ingest.max_world_size; treated as unknown");
      run.world_size = 0;
      dirty_meta_.insert(run.id);
    }
  }
  registry_->Reset(working_);
  CheckSpace(SteadyNs(), /*force=*/true);

  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal("eventfd failed");

  const std::string& endpoint = config_.ingest;
  std::string ipc_path;
  if (IsUnixEndpoint(endpoint)) {
    ipc_path = endpoint.substr(6);
    MakeRuntimeDir(ipc_path, config_.socket_group);
  }
  try {
    socket_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::router);
    // Beyond twice the accepted size ZeroMQ drops the connection itself,
    // before the bytes are buffered; up to that we answer with a clear ack.
    socket_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(2 * config_.max_message_bytes));
    socket_->set(zmq::sockopt::rcvhwm, static_cast<int>(config_.ingest_hwm));
    socket_->set(zmq::sockopt::sndhwm, 100000);
    socket_->set(zmq::sockopt::router_mandatory, 1);
    socket_->set(zmq::sockopt::linger, 1000);
    socket_->bind(endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot bind ingest endpoint " + endpoint + ": " + e.what());
  }
  if (!ipc_path.empty()) {
    ApplySocketAccess(ipc_path, config_.socket_group, config_.ingest_socket_mode, "ingest socket");
  }
  open_ = std::make_unique<Group>(store_);
  open_->number = next_group_++;
  receiver_beat_ns_ = SteadyNs();
  committer_ = std::thread([this] { CommitterLoop(); });
  receiver_ = std::thread([this] { ReceiverLoop(); });
  started_ = true;
  return Status::Ok();
}

void Ingest::Stop() {
  if (!started_) return;
  started_ = false;
  stop_ = true;
  Wake();
  if (receiver_.joinable()) receiver_.join();
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);
    committer_stop_ = true;
  }
  handoff_cv_.notify_all();
  if (committer_.joinable()) committer_.join();
}

void Ingest::Wake() {
  if (wake_fd_ < 0) return;
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  (void)n;  // a full counter still wakes the reader
}

// ---- receiver thread --------------------------------------------------------

void Ingest::ReceiverLoop() {
  pthread_setname_np(pthread_self(), "og-ingest");
  std::vector<zmq::message_t> frames;
  while (true) {
    const int64_t now = SteadyNs();
    receiver_beat_ns_ = now;
    const bool stopping = stop_.load();
    const bool full = Full();
    metrics_->inflight_bytes.store(open_->bytes + committing_bytes_, std::memory_order_relaxed);
    if (full != (paused_since_ns_ != 0)) {
      if (!full) {
        metrics_->ingest_paused_micros.fetch_add(
            static_cast<uint64_t>((now - paused_since_ns_) / 1000), std::memory_order_relaxed);
      }
      paused_since_ns_ = full ? now : 0;
      std::lock_guard<std::mutex> lock(pauses_mu_);
      budget_pause_ = {};
      if (full) {
        budget_pause_ = {
            "inflight_budget",
            std::to_string(open_->bytes + committing_bytes_) +
                " bytes received and not yet durable reach ingest.max_inflight_bytes (" +
                std::to_string(config_.max_inflight_bytes) +
                ") or a commit group ingest.max_group_bytes (" +
                std::to_string(config_.max_group_bytes) + "); reading waits for the store",
            static_cast<int64_t>(WallNs())};
      }
    }
    zmq::pollitem_t items[2] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0},
                                {static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0}};
    // Backpressure: a full budget stops reading until the committer is done;
    // ZeroMQ then queues at most ingest.hwm messages per sender and leaves
    // the rest in the senders' buffers.
    const int nitems = (stopping || full || failed_) ? 1 : 2;
    try {
      zmq::poll(items, nitems, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) OPGUARD_LOG(LogLevel::kError, std::string("ingest poll: ") + e.what());
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t counter;
      while (::read(wake_fd_, &counter, sizeof counter) > 0) {
      }
    }
    DrainCommitted();
    CheckSpace(SteadyNs(), /*force=*/false);
    HandleDeleteRequests();
    if (nitems == 2 && (items[1].revents & ZMQ_POLLIN)) {
      // Read a bounded burst, then go round to keep commits flowing.
      for (int i = 0; i < 256 && !Full(); ++i) {
        frames.clear();
        zmq::recv_result_t got;
        try {
          got = zmq::recv_multipart(*socket_, std::back_inserter(frames), zmq::recv_flags::dontwait);
        } catch (const zmq::error_t& e) {
          OPGUARD_LOG(LogLevel::kWarn, std::string("ingest recv: ") + e.what());
          break;
        }
        if (!got) break;
        try {
          HandleMessage(frames);
        } catch (const std::exception& e) {
          NoteException(e);  // no ack: the message could not even be read
        }
      }
    }
    if (!committer_busy_ && !open_->Empty() && !failed_) SealAndHandOff();
    if (stopping && !committer_busy_ && open_->Empty()) break;
    if (stopping && failed_) break;
  }
  // Requests that arrived too late (or were caught by a store failure).
  for (auto& r : open_->deletes) r.done->set_value(Unavailable("daemon is shutting down"));
  open_->deletes.clear();
  std::lock_guard<std::mutex> lock(requests_mu_);
  for (auto& r : delete_requests_) r.done->set_value(Unavailable("daemon is shutting down"));
  delete_requests_.clear();
  socket_.reset();  // lingers up to 1 s so the last acks leave
}

// The in-flight budget: batches received and not yet acknowledged (the open
// group and the one being written), and one group's size.
bool Ingest::Full() const {
  return open_->bytes + committing_bytes_ >= config_.max_inflight_bytes ||
         open_->batch.bytes() >= config_.max_group_bytes;
}

void Ingest::HandleMessage(std::vector<zmq::message_t>& frames) {
  if (frames.empty()) return;
  PendingAck ack;
  ack.received_ns = SteadyNs();
  zmq::message_t payload = std::move(frames.back());
  frames.pop_back();
  ack.route = std::move(frames);
  frames.clear();
  const void* data = payload.data();
  const size_t size = payload.size();
  // libzmq may hand a large frame over at any address; FlatBuffers reads
  // need it aligned, so a misaligned batch is opened (and applied) from an
  // aligned copy.
  wire::AlignedStorage aligned;

  if (size > config_.max_message_bytes) {
    return Reject(ack, RejectReason::kOversized,
                  "batch of " + std::to_string(size) + " bytes exceeds the limit of " +
                      std::to_string(config_.max_message_bytes));
  }
  if (size < 8 || !wire::EnvelopeBufferHasIdentifier(data)) {
    return Reject(ack, RejectReason::kNotOpGuard, "not an OpGuard message (missing identifier)");
  }
  auto opened = wire::OpenEnvelope(data, size, aligned, config_.max_message_bytes);
  if (!aligned.empty()) data = aligned.data();
  if (!opened.ok()) {
    // Classify for the metrics: the size and identifier were checked above.
    flatbuffers::Verifier verifier(static_cast<const uint8_t*>(data), size);
    RejectReason reason = RejectReason::kMalformed;
    if (wire::VerifyEnvelopeBuffer(verifier)) {
      const auto* v = wire::GetEnvelope(data)->version();
      reason = (v && v->major() != wire::kSchemaMajor) ? RejectReason::kSchemaMajor
                                                       : RejectReason::kWrongMessage;
    }
    return Reject(ack, reason, opened.status().message());
  }
  const wire::Batch* batch = (*opened)->message_as_Batch();
  if (batch == nullptr) {
    return Reject(ack, RejectReason::kWrongMessage,
                  std::string("expected a Batch on the ingest endpoint, got ") +
                      wire::EnumNameMessage((*opened)->message_type()));
  }
  ack.minor = (*opened)->version()->minor();
  ack.run = batch->run() ? batch->run()->str() : std::string();
  ack.rank = batch->rank();
  ack.session = batch->session();
  ack.seq = batch->seq();
  if (auto [reason, error] = CheckBatch(*batch, config_); reason != RejectReason::kCount) {
    return Reject(ack, reason, error);
  }
  if (!ValidRunName(batch->run())) {
    return Reject(ack, RejectReason::kInvalidBatch,
                  "invalid run name (1..200 printable bytes without '/', '?', '#', '%', '\\' or spaces)");
  }
  // A run is written only by the uid that created it (access/access.h).
  const int64_t sender = SenderUid(payload);
  if (auto run = working_.find(ack.run); run != working_.end() && run->second.owner_uid != sender) {
    return Reject(ack, RejectReason::kOwner,
                  "run '" + ack.run + "' belongs to " + OwnerName(run->second.owner_uid) +
                      ", not to this sender (" + OwnerName(sender) + "); choose another run name");
  }
  if (std::string error = CheckCapacity(*batch); !error.empty()) {
    return Reject(ack, RejectReason::kLimit, error);
  }
  if (!full_reason_.empty()) return Defer(ack);
  if (std::string field = FindText(*batch, [](std::string_view t) { return !IsValidUtf8(t); });
      !field.empty()) {
    metrics_->text_repaired.fetch_add(1, std::memory_order_relaxed);
    if (!repair_logged_) {
      repair_logged_ = true;
      OPGUARD_LOG(LogLevel::kWarn, "ingest: run '" + ack.run + "' rank " + std::to_string(ack.rank) + ": " + field +
                                       " is not valid UTF-8; stored with each bad byte written as \\xNN "
                                       "(logged once, counted in opguard_batches_text_repaired_total)");
    }
  }
  try {
    ApplyBatch(static_cast<const uint8_t*>(data), *batch, size, sender, ack);
  } catch (const std::exception& e) {
    // A bug, not bad input (that is refused above). The batch may be half
    // applied in memory; it is refused, so its sender logs it and moves on
    // instead of resending it after every restart.
    NoteException(e);
    Reject(ack, RejectReason::kInvalidBatch, std::string("internal error applying the batch: ") + e.what());
  }
}

void Ingest::NoteException(const std::exception& e) {
  metrics_->ingest_exceptions.fetch_add(1, std::memory_order_relaxed);
  if (exception_kinds_logged_.insert(typeid(e).name()).second) {
    OPGUARD_LOG(LogLevel::kError, std::string("ingest: handling a message threw (logged once per kind, counted in "
                                              "opguard_ingest_exceptions_total): ") + e.what());
  }
}

void Ingest::Reject(PendingAck& ack, RejectReason reason, const std::string& error) {
  metrics_->rejected[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  OPGUARD_LOG(LogLevel::kDebug, std::string("ingest: rejected (") + RejectReasonName(reason) +
                                    "): " + error);
  SendAck(ack, wire::AckCode::Rejected, error);
}

// Schema minor 6 brought AckCode::Retry; an older sender would drop a batch
// answered with a code it does not know.
constexpr uint16_t kRetryAckMinor = 6;

void Ingest::Defer(PendingAck& ack, const std::string& why) {
  metrics_->batches_deferred.fetch_add(1, std::memory_order_relaxed);
  if (ack.minor < kRetryAckMinor) return;
  const std::string& reason =
      !why.empty() ? why : !full_reason_.empty() ? full_reason_ : std::string("the store could not write");
  SendAck(ack, wire::AckCode::Retry, "not stored now: " + reason + "; keep the batch and send it again later");
}

void Ingest::CheckSpace(int64_t now_ns, bool force) {
  if (!force && now_ns < next_space_check_ns_) return;
  next_space_check_ns_ = now_ns + 250'000'000;
  if (store_->StoppedForSpace()) {
    if (Status resumed = store_->Resume(); resumed.ok()) {
      metrics_->store_resumes.fetch_add(1, std::memory_order_relaxed);
      next_resume_log_ns_ = 0;
      OPGUARD_LOG(LogLevel::kInfo, "store resumed: there is space again");
    } else if (now_ns >= next_resume_log_ns_) {
      // Its reason carries figures that change while it lasts: a line a
      // minute, not one per try.
      next_resume_log_ns_ = now_ns + 60'000'000'000;
      OPGUARD_LOG(LogLevel::kWarn, "store not resumed yet (tried every 250 ms): " + resumed.message());
    }
  }
  std::string why = store_->WhyFull();
  if (why.empty() != full_reason_.empty()) {
    if (why.empty()) {
      OPGUARD_LOG(LogLevel::kInfo, "ingest resumed: the store takes new records again");
    } else {
      metrics_->read_only_entered.fetch_add(1, std::memory_order_relaxed);
      OPGUARD_LOG(LogLevel::kWarn, "ingest paused: " + why +
                                       "; batches are answered \"retry later\" and kept by their senders, "
                                       "queries and rm go on");
    }
  }
  metrics_->read_only.store(why.empty() ? 0 : 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(pauses_mu_);
    if (why.empty()) {
      space_pause_ = {};
    } else {
      if (space_pause_.cause.empty())
        space_pause_ = {"disk_space", "", static_cast<int64_t>(WallNs())};
      space_pause_.reason = why;  // its figures change while it lasts
    }
  }
  full_reason_ = std::move(why);
}

std::vector<IngestPause> Ingest::Pauses() const {
  std::lock_guard<std::mutex> lock(pauses_mu_);
  std::vector<IngestPause> pauses;
  for (const IngestPause* p : {&space_pause_, &budget_pause_}) {
    if (!p->cause.empty()) pauses.push_back(*p);
  }
  return pauses;
}

void Ingest::RollBack(Group* failed) {
  CheckSpace(SteadyNs(), /*force=*/true);  // the reason the acks give
  // Nothing of either group is durable.
  for (Group* g : {failed, open_.get()}) {
    for (auto& ack : g->acks) Defer(ack);
  }
  // Deletions not yet tried go again after the rollback; one that failed
  // tells its caller.
  for (auto& d : failed->deletes) d.done->set_value(failed->result);
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    for (auto& d : open_->deletes) delete_requests_.push_back(std::move(d));
  }
  open_->Reset();
  // The durable state again. Run ids stay unused: next_run_id_ only grows.
  working_ = registry_->Writer();
  id_to_name_.clear();
  working_ranks_ = 0;
  for (const auto& [name, run] : working_) {
    id_to_name_[run.id] = name;
    working_ranks_ += run.ranks.size();
  }
  dirty_meta_.clear();
  dirty_ranks_.clear();
}

void Ingest::SendAck(PendingAck& ack, wire::AckCode code, const std::string& error) {
  flatbuffers::FlatBufferBuilder b(256);
  auto run = b.CreateString(ack.run);
  auto err = error.empty() ? 0 : b.CreateString(error);
  wire::AckBuilder ab(b);
  ab.add_run(run);
  ab.add_rank(ack.rank);
  ab.add_session(ack.session);
  ab.add_seq(ack.seq);
  ab.add_code(code);
  if (!err.IsNull()) ab.add_error(err);
  wire::FinishEnvelope(b, ab.Finish());
  try {
    for (auto& frame : ack.route) {
      if (!socket_->send(frame, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    }
    (void)socket_->send(zmq::const_buffer(b.GetBufferPointer(), b.GetSize()),
                        zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // The sender went away (EHOSTUNREACH): it resends after reconnecting and
    // gets a duplicate ack then.
  }
  if (code == wire::AckCode::Durable) {
    metrics_->ObserveAck(static_cast<uint64_t>((SteadyNs() - ack.received_ns) / 1000));
  }
}

// ---- one batch, step by step (receiver thread) -------------------------------

void Ingest::ApplyBatch(const uint8_t* buffer, const wire::Batch& batch, size_t bytes,
                        int64_t sender, PendingAck& ack) {
  const uint64_t now = WallNs();
  RunState& run = WorkingRun(ack.run, now, sender);
  auto [rank_entry, new_rank] = run.ranks.try_emplace(batch.rank());
  if (new_rank) ++working_ranks_;
  RankState& rank = rank_entry->second;
  SessionState& session = rank.Session(batch.session());
  if (session.Applied(batch.seq())) return AckResend(run, batch, ack);
  if (!session.CanMark(batch.seq())) {
    // Marking it would need one more range of out-of-order seqs than the
    // session keeps: not applied, and not taken for applied either (that
    // would acknowledge records never stored). The sender sends it again.
    metrics_->dedup_deferred.fetch_add(1, std::memory_order_relaxed);
    return Defer(ack, "batch " + std::to_string(batch.seq()) + " of this session arrived after " +
                          std::to_string(SessionState::kMaxRanges) +
                          " ranges of batches out of order; send the earlier batches first");
  }
  session.Mark(batch.seq());
  session.last_ns = now;
  session.group = open_->number;
  // A revived session may have applied this seq before it was forgotten:
  // its records count only where the store does not hold them yet. Its
  // marks from before were durable when it was forgotten, so the store is
  // the whole answer.
  const bool checked = session.revived;
  rank.TrimSessions(durable_group_);
  if (const auto* a = batch.announce()) ApplyAnnounce(*a, &run, &rank);
  open_->batch.CheckExisting(checked);
  const RecordCounts records = writer_.Write(batch, buffer, bytes, run.id, rank.ops, &open_->batch);
  open_->batch.CheckExisting(false);
  if (records.sources_refused > 0 && !source_refusal_logged_) {
    source_refusal_logged_ = true;
    OPGUARD_LOG(LogLevel::kWarn, "ingest: run '" + ack.run + "' rank " + std::to_string(batch.rank()) +
                                     ": a source file larger than ingest.max_source_bytes (" +
                                     std::to_string(config_.max_source_bytes) +
                                     ") is not stored; the rest of its batch is (logged once, counted in "
                                     "opguard_sources_refused_total)");
  }
  dirty_ranks_[run.id].insert(batch.rank());
  if (checked) metrics_->dedup_checked.fetch_add(1, std::memory_order_relaxed);
  if (checked && records.already_stored > 0 && records.counted() == 0) {
    // Every record was stored already: a resend the marks had forgotten.
    ++open_->duplicates;
    open_->bytes += bytes;
  } else {
    CountBatch(records, bytes, now, batch, &rank);
  }
  open_->acks.push_back(std::move(ack));
}

// The working state of run `name`, created (with a fresh id and its owner,
// persisted in the open group) on its first batch.
RunState& Ingest::WorkingRun(const std::string& name, uint64_t now, int64_t owner) {
  auto found = working_.find(name);
  if (found != working_.end()) return found->second;
  RunState run;
  run.id = next_run_id_++;
  run.name = name;
  run.owner_uid = owner;
  run.created_ns = now;
  run.start_ns = now;
  open_->batch.PutNextRunId(next_run_id_);
  found = working_.emplace(name, std::move(run)).first;
  id_to_name_[found->second.id] = name;
  dirty_meta_.insert(found->second.id);
  return found->second;
}

// The limits a batch can break given what is stored: runs, ranks (of the
// run and of all runs) and run metadata bytes. Returns "" when within them.
std::string Ingest::CheckCapacity(const wire::Batch& batch) const {
  auto found = working_.find(batch.run()->str());
  const RunState* run = found == working_.end() ? nullptr : &found->second;
  if (run == nullptr && working_.size() >= config_.max_runs) {
    return "the daemon holds ingest.max_runs (" + std::to_string(config_.max_runs) +
           ") runs; remove some (opguard rm) or set retention";
  }
  if (run == nullptr || run->ranks.count(batch.rank()) == 0) {
    if (run != nullptr && run->ranks.size() >= config_.max_ranks_per_run) {
      return "the run has ingest.max_ranks_per_run (" + std::to_string(config_.max_ranks_per_run) +
             ") ranks";
    }
    if (working_ranks_ >= config_.max_ranks) {
      return "the daemon holds ingest.max_ranks (" + std::to_string(config_.max_ranks) +
             ") ranks of all runs";
    }
  }
  if (const auto* a = batch.announce()) {
    static const RunState kEmpty;
    const RunState& r = run != nullptr ? *run : kEmpty;
    if (r.MetadataBytes() + AddedMetadataBytes(r, *a) > config_.max_run_metadata_bytes) {
      return "the run's metadata would exceed ingest.max_run_metadata_bytes (" +
             std::to_string(config_.max_run_metadata_bytes) + ")";
    }
  }
  return "";
}

// A resend of a batch already applied: change nothing. If it is already
// durable, ack at once (a shim that resends because acks are slow must not
// make them slower); otherwise ack with this group, which commits after the
// group holding the original. The receiver is the registry's only writer, so
// reading it here needs no lock.
void Ingest::AckResend(const RunState& run, const wire::Batch& batch, PendingAck& ack) {
  const auto& durable = registry_->Writer();
  if (auto d = durable.find(run.name); d != durable.end() && d->second.id == run.id) {
    if (auto r = d->second.ranks.find(batch.rank()); r != d->second.ranks.end()) {
      auto s = r->second.sessions.find(batch.session());
      if (s != r->second.sessions.end() && s->second.Applied(batch.seq())) {
        metrics_->batches_duplicate.fetch_add(1, std::memory_order_relaxed);
        SendAck(ack, wire::AckCode::Durable, "");
        return;
      }
    }
  }
  ++open_->duplicates;
  open_->acks.push_back(std::move(ack));
}

// Who the rank is, and the run's metadata: the first non-empty value of each
// field wins, the earliest start time wins. Key-value settings merge: a key
// announced later (a shim re-announces what it learns while recording, the
// step rule for one) is added; a key's first value wins.
void Ingest::ApplyAnnounce(const wire::RunAnnounce& a, RunState* run, RankState* rank) {
  if (a.node()) rank->node = Text(a.node());
  rank->local_rank = a.local_rank();
  rank->pid = a.pid();
  bool changed = false;
  auto set_string = [&changed](std::string* field, const flatbuffers::String* v) {
    if (field->empty() && v && v->size()) *field = Text(v), changed = true;
  };
  auto set_pairs = [&changed](std::vector<std::pair<std::string, std::string>>* field,
                              const flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>* v) {
    if (v == nullptr) return;
    for (auto& pair : Pairs(v)) {
      const std::string& key = pair.first;  // clang 14 cannot capture a structured binding
      const bool known = std::any_of(field->begin(), field->end(),
                                     [&key](const auto& kv) { return kv.first == key; });
      if (!known) field->push_back(std::move(pair)), changed = true;
    }
  };
  set_string(&run->job_id, a.job_id());
  if (a.world_size() != 0 && a.world_size() != rank->world_size) {
    rank->world_size = a.world_size();
    // Only a rank that disagrees with the run costs a count over the ranks.
    const uint32_t vote =
        a.world_size() == run->world_size ? run->world_size : run->WorldSizeVote();
    if (vote != run->world_size) run->world_size = vote, changed = true;
  }
  set_string(&run->framework, a.framework());
  set_pairs(&run->determinism, a.determinism());
  set_pairs(&run->versions, a.versions());
  set_pairs(&run->environment, a.environment());
  if (a.start_ns() != 0 && (run->start_ns == run->created_ns || a.start_ns() < run->start_ns)) {
    run->start_ns = a.start_ns();
    changed = true;
  }
  if (changed) dirty_meta_.insert(run->id);
}

// The rank's counters (persisted with the group) and the group's (added to
// the metrics once durable).
void Ingest::CountBatch(const RecordCounts& records, size_t bytes, uint64_t now,
                        const wire::Batch& batch, RankState* rank) {
  rank->ops += records.ops;
  rank->collectives += records.collectives;
  rank->steps += records.steps;
  rank->gap_records = SaturatingAdd(rank->gap_records, records.op_gap_records);
  rank->collective_gap_records = SaturatingAdd(rank->collective_gap_records, records.collective_gap_records);
  rank->gap_notices += records.gap_notices;
  if (batch.end_of_run()) rank->ended = true;
  ++rank->batches;
  rank->bytes += bytes;
  if (rank->first_ns == 0) rank->first_ns = now;
  rank->last_ns = now;
  open_->records += records;
  open_->bytes += bytes;
}

void Ingest::HandleDeleteRequests() {
  std::vector<DeleteRequest> requests;
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    requests.swap(delete_requests_);
  }
  // A store stopped by ENOSPC takes no deletion either until resumed
  // (CheckSpace does that as soon as there is space).
  const bool blocked = !requests.empty() && (store_->read_only() || store_->StoppedForSpace());
  for (auto& request : requests) {
    auto found = working_.find(request.name);
    if (found == working_.end()) {
      request.done->set_value(NotFound("no run named '" + request.name + "'"));
      continue;
    }
    if (blocked) {
      request.done->set_value(Unavailable("cannot remove run '" + request.name + "' now: " +
                                          store_->WhyFull() + "; free space on the data directory's file system"));
      continue;
    }
    open_->batch.DeleteRun(found->second);
    working_ranks_ -= found->second.ranks.size();
    request.run_id = found->second.id;
    dirty_ranks_.erase(request.run_id);
    dirty_meta_.erase(request.run_id);
    id_to_name_.erase(request.run_id);
    working_.erase(found);
    open_->deletes.push_back(std::move(request));
  }
}

void Ingest::SealAndHandOff() {
  Group& g = *open_;
  std::map<uint64_t, RunUpdate> updates;
  for (uint64_t id : dirty_meta_) {
    RunState& run = working_.at(id_to_name_.at(id));
    g.batch.PutRunMeta(run);
    // The metadata without the ranks: moved out and back, never copied.
    auto ranks = std::move(run.ranks);
    updates[id].meta = run;
    run.ranks = std::move(ranks);
  }
  for (const auto& [id, ranks] : dirty_ranks_) {
    const RunState& run = working_.at(id_to_name_.at(id));
    for (uint32_t rank : ranks) {
      g.batch.PutRank(id, rank, run.ranks.at(rank));
      updates[id].ranks.emplace_back(rank, run.ranks.at(rank));
    }
  }
  for (auto& [id, u] : updates) {
    u.id = id;
    u.name = id_to_name_.at(id);
    g.publish.push_back(std::move(u));
  }
  dirty_meta_.clear();
  dirty_ranks_.clear();
  committing_bytes_ = g.bytes;
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);
    to_commit_ = std::move(open_);
  }
  handoff_cv_.notify_one();
  committer_busy_ = true;
  if (spare_) {
    open_ = std::move(spare_);
  } else {
    open_ = std::make_unique<Group>(store_);
  }
  open_->number = next_group_++;
}

void Ingest::DrainCommitted() {
  std::deque<std::unique_ptr<Group>> done;
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);
    done.swap(committed_);
  }
  for (auto& group : done) {
    committer_busy_ = false;
    committing_bytes_ = 0;
    // Refused for space (Unavailable: nothing written), or RocksDB met ENOSPC.
    if (!group->result.ok() &&
        (group->result.code() == StatusCode::kUnavailable || store_->StoppedForSpace())) {
      metrics_->store_errors.fetch_add(1, std::memory_order_relaxed);
      // Refused before writing (the room check raced the last space check)
      // is a warning; RocksDB failing for space is an error.
      const bool refused = group->result.code() == StatusCode::kUnavailable;
      OPGUARD_LOG(refused ? LogLevel::kWarn : LogLevel::kError,
                  "ingest: " + group->result.message() +
                      "; the batches of this group and the next are answered \"retry later\"");
      RollBack(group.get());
      durable_group_ = group->number;  // nothing in the working state refers to it any more
      group->Reset();
      spare_ = std::move(group);
      continue;
    }
    if (!group->result.ok()) {
      // Nothing of this group is acknowledged; the shims resend. The working
      // registry is now ahead of the store, so the daemon stops taking data
      // and exits for a clean restart (see Failed()).
      metrics_->store_errors.fetch_add(1, std::memory_order_relaxed);
      OPGUARD_LOG(LogLevel::kError, "ingest: " + group->result.message() +
                                        "; no further batches are acknowledged, daemon exits");
      failed_ = true;
      for (auto& d : group->deletes) d.done->set_value(group->result);
      continue;
    }
    std::vector<std::pair<std::string, uint64_t>> deleted;
    for (const auto& d : group->deletes) deleted.emplace_back(d.name, d.run_id);
    registry_->Publish(&group->publish, deleted);
    durable_group_ = group->number;
    // Counters first: a sender that has its ack may ask for them at once.
    const size_t fresh = group->acks.size() - group->duplicates;
    metrics_->batches_durable.fetch_add(fresh, std::memory_order_relaxed);
    metrics_->batches_duplicate.fetch_add(group->duplicates, std::memory_order_relaxed);
    const RecordCounts& n = group->records;
    metrics_->ops.fetch_add(n.ops, std::memory_order_relaxed);
    metrics_->collectives.fetch_add(n.collectives, std::memory_order_relaxed);
    metrics_->strings.fetch_add(n.strings, std::memory_order_relaxed);
    metrics_->sites.fetch_add(n.sites, std::memory_order_relaxed);
    metrics_->sources.fetch_add(n.sources, std::memory_order_relaxed);
    metrics_->sources_refused.fetch_add(n.sources_refused, std::memory_order_relaxed);
    metrics_->steps.fetch_add(n.steps, std::memory_order_relaxed);
    metrics_->gap_notices.fetch_add(n.gap_notices, std::memory_order_relaxed);
    Metrics::AddSaturating(&metrics_->gap_records, SaturatingAdd(n.op_gap_records, n.collective_gap_records));
    metrics_->bytes_received.fetch_add(group->bytes, std::memory_order_relaxed);
    metrics_->commit_batches.fetch_add(group->acks.size(), std::memory_order_relaxed);
    for (auto& ack : group->acks) SendAck(ack, wire::AckCode::Durable, "");
    for (auto& d : group->deletes) {
      metrics_->runs_deleted.fetch_add(1, std::memory_order_relaxed);
      OPGUARD_LOG(LogLevel::kInfo, "run '" + d.name + "' deleted");
      if (on_run_deleted_) on_run_deleted_(d.run_id);
      d.done->set_value(Status::Ok());
    }
    group->Reset();
    spare_ = std::move(group);
  }
}

// ---- committer thread -------------------------------------------------------

void Ingest::CommitterLoop() {
  pthread_setname_np(pthread_self(), "og-commit");
  while (true) {
    std::unique_ptr<Group> group;
    {
      std::unique_lock<std::mutex> lock(handoff_mu_);
      handoff_cv_.wait(lock, [&] { return to_commit_ != nullptr || committer_stop_; });
      if (to_commit_ == nullptr) return;
      group = std::move(to_commit_);
    }
    const int64_t start = SteadyNs();
    commit_started_ns_ = start;
    group->result = store_->Write(&group->batch, /*sync=*/true);
    commit_started_ns_ = 0;
    metrics_->commit_groups.fetch_add(1, std::memory_order_relaxed);
    metrics_->commit_seconds_micros.fetch_add(static_cast<uint64_t>((SteadyNs() - start) / 1000),
                                              std::memory_order_relaxed);
    group->batch.Clear();
    {
      std::lock_guard<std::mutex> lock(handoff_mu_);
      committed_.push_back(std::move(group));
    }
    Wake();
  }
}

// ---- any thread ---------------------------------------------------------------

Status Ingest::DeleteRun(const std::string& name, std::chrono::milliseconds timeout) {
  if (!started_ || stop_) return Unavailable("daemon is shutting down");
  DeleteRequest request;
  request.name = name;
  request.done = std::make_shared<std::promise<Status>>();
  auto future = request.done->get_future();
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    delete_requests_.push_back(std::move(request));
  }
  Wake();
  if (future.wait_for(timeout) != std::future_status::ready) {
    return Unavailable("deleting run '" + name + "' did not finish in time (still in progress)");
  }
  return future.get();
}

bool Ingest::Healthy(std::chrono::seconds stall) const {
  const int64_t now = SteadyNs();
  const int64_t limit = std::chrono::duration_cast<std::chrono::nanoseconds>(stall).count();
  if (now - receiver_beat_ns_.load() > limit) return false;
  const int64_t commit = commit_started_ns_.load();
  return commit == 0 || now - commit <= limit;
}

}  // namespace opguard::daemon
