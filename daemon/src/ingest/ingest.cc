#include "ingest.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "keys.h"
#include "opguard/common/log.h"
#include "opguard/idl/envelope.h"
#include "record_copy.h"

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

std::vector<std::pair<std::string, std::string>> Pairs(
    const flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>* kv) {
  std::vector<std::pair<std::string, std::string>> out;
  if (kv == nullptr) return out;
  for (const auto* e : *kv) {
    if (e->key() == nullptr) continue;
    out.emplace_back(e->key()->str(), e->value() ? e->value()->str() : std::string());
  }
  return out;
}

// ops key without a heap allocation: run(8) | rank(4) | lane(4) | op_index(8).
void EncodeOpKey(char* out, uint64_t run, uint32_t rank, uint32_t lane, uint64_t op) {
  auto put32 = [](char* p, uint32_t v) {
    p[0] = static_cast<char>(v >> 24);
    p[1] = static_cast<char>(v >> 16);
    p[2] = static_cast<char>(v >> 8);
    p[3] = static_cast<char>(v);
  };
  put32(out, static_cast<uint32_t>(run >> 32));
  put32(out + 4, static_cast<uint32_t>(run));
  put32(out + 8, rank);
  put32(out + 12, lane);
  put32(out + 16, static_cast<uint32_t>(op >> 32));
  put32(out + 20, static_cast<uint32_t>(op));
}

}  // namespace

struct Ingest::PendingAck {
  std::vector<zmq::message_t> route;  // routing frames to reply through
  std::string run;
  uint32_t rank = 0;
  uint64_t session = 0;
  uint64_t seq = 0;
  int64_t received_ns = 0;
};

struct Ingest::Group {
  rocksdb::WriteBatch batch;
  std::vector<PendingAck> acks;
  size_t duplicates = 0;
  std::vector<RunState> publish;            // durable state of runs this group touched
  std::vector<DeleteRequest> deletes;
  Status result;
  // Metrics to add once durable.
  uint64_t ops = 0, collectives = 0, strings = 0, sites = 0, sources = 0, steps = 0;
  uint64_t gap_notices = 0, gap_records = 0, bytes = 0;

  bool Empty() const { return acks.empty() && deletes.empty() && batch.Count() == 0; }
  // Ready for reuse, keeping the capacity of the WriteBatch and the vectors
  // (a fresh group would page-fault its way up to the same size again).
  void Reset() {
    batch.Clear();
    acks.clear();
    duplicates = 0;
    publish.clear();
    deletes.clear();
    result = Status::Ok();
    ops = collectives = strings = sites = sources = steps = 0;
    gap_notices = gap_records = bytes = 0;
  }
};

Ingest::Ingest(const Config& config, Store* store, Metrics* metrics, zmq::context_t* context)
    : config_(config),
      store_(store),
      metrics_(metrics),
      context_(context),
      chunk_codec_(ChunkCodecByName(config.compression)) {}

Ingest::~Ingest() {
  Stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status Ingest::Start() {
  OPGUARD_RETURN_IF_ERROR(store_->LoadRegistry(&working_, &next_run_id_));
  for (const auto& [name, run] : working_) id_to_name_[run.id] = name;
  published_ = working_;

  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal("eventfd failed");

  const std::string& endpoint = config_.ingest;
  std::string ipc_path;
  if (endpoint.rfind("ipc://", 0) == 0) {
    ipc_path = endpoint.substr(6);
    std::error_code ec;
    auto parent = std::filesystem::path(ipc_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
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
  if (!ipc_path.empty() && ::chmod(ipc_path.c_str(), config_.ingest_socket_mode) != 0) {
    OPGUARD_LOG(LogLevel::kWarn, "cannot chmod ingest socket " + ipc_path);
  }
  open_ = std::make_unique<Group>();
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
    receiver_beat_ns_ = SteadyNs();
    const bool stopping = stop_.load();
    const bool full = open_->batch.GetDataSize() >= config_.max_group_bytes;
    zmq::pollitem_t items[2] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0},
                                {static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0}};
    // Backpressure: a full group stops reading until the committer is free.
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
    HandleDeleteRequests();
    if (nitems == 2 && (items[1].revents & ZMQ_POLLIN)) {
      // Read a bounded burst, then go round to keep commits flowing.
      for (int i = 0; i < 256 && open_->batch.GetDataSize() < config_.max_group_bytes; ++i) {
        frames.clear();
        zmq::recv_result_t got;
        try {
          got = zmq::recv_multipart(*socket_, std::back_inserter(frames), zmq::recv_flags::dontwait);
        } catch (const zmq::error_t& e) {
          OPGUARD_LOG(LogLevel::kWarn, std::string("ingest recv: ") + e.what());
          break;
        }
        if (!got) break;
        HandleMessage(frames);
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

  if (size > config_.max_message_bytes) {
    return Reject(ack, RejectReason::kOversized,
                  "batch of " + std::to_string(size) + " bytes exceeds the limit of " +
                      std::to_string(config_.max_message_bytes));
  }
  if (size < 8 || !wire::EnvelopeBufferHasIdentifier(data)) {
    return Reject(ack, RejectReason::kNotOpGuard, "not an OpGuard message (missing identifier)");
  }
  auto opened = wire::OpenEnvelope(data, size, config_.max_message_bytes);
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
  ack.run = batch->run() ? batch->run()->str() : std::string();
  ack.rank = batch->rank();
  ack.session = batch->session();
  ack.seq = batch->seq();
  if (!ValidRunName(batch->run())) {
    return Reject(ack, RejectReason::kInvalidBatch,
                  "invalid run name (1..200 printable bytes without '/', '?', '#', '%', '\\' or spaces)");
  }
  ApplyBatch(static_cast<const uint8_t*>(data), batch, size, ack);
}

void Ingest::Reject(PendingAck& ack, RejectReason reason, const std::string& error) {
  metrics_->rejected[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  OPGUARD_LOG(LogLevel::kDebug, std::string("ingest: rejected (") + RejectReasonName(reason) +
                                    "): " + error);
  SendAck(ack, false, error);
}

void Ingest::SendAck(PendingAck& ack, bool durable, const std::string& error) {
  flatbuffers::FlatBufferBuilder b(256);
  auto run = b.CreateString(ack.run);
  auto err = error.empty() ? 0 : b.CreateString(error);
  wire::AckBuilder ab(b);
  ab.add_run(run);
  ab.add_rank(ack.rank);
  ab.add_session(ack.session);
  ab.add_seq(ack.seq);
  ab.add_code(durable ? wire::AckCode::Durable : wire::AckCode::Rejected);
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
  if (durable) {
    metrics_->ObserveAck(static_cast<uint64_t>((SteadyNs() - ack.received_ns) / 1000));
  }
}

void Ingest::ApplyBatch(const uint8_t* buffer, const void* batch_ptr, size_t bytes,
                        PendingAck& ack) {
  const auto* batch = static_cast<const wire::Batch*>(batch_ptr);
  Group& g = *open_;
  const uint64_t now = WallNs();
  const std::string& name = ack.run;

  auto found = working_.find(name);
  if (found == working_.end()) {
    RunState run;
    run.id = next_run_id_++;
    run.name = name;
    run.created_ns = now;
    run.start_ns = now;
    std::string next;
    keys::PutU64(&next, next_run_id_);
    g.batch.Put(store_->cf(Cf::kMeta), keys::MetaNextIdKey(), next);
    found = working_.emplace(name, std::move(run)).first;
    id_to_name_[found->second.id] = name;
    dirty_meta_.insert(found->second.id);
  }
  RunState& run = found->second;
  RankState& rank = run.ranks[batch->rank()];
  SessionState& session = rank.sessions[batch->session()];
  if (session.Applied(batch->seq())) {
    // A resend of a batch already applied: change nothing. If it is already
    // durable, ack at once (a shim that resends because acks are slow must not
    // make them slower); otherwise ack with this group, which commits after
    // the group holding the original. The receiver is the only writer of
    // published_, so reading it here needs no lock.
    auto durable = published_.find(name);
    if (durable != published_.end() && durable->second.id == run.id) {
      auto r = durable->second.ranks.find(batch->rank());
      if (r != durable->second.ranks.end()) {
        auto s = r->second.sessions.find(batch->session());
        if (s != r->second.sessions.end() && s->second.Applied(batch->seq())) {
          metrics_->batches_duplicate.fetch_add(1, std::memory_order_relaxed);
          SendAck(ack, true, "");
          return;
        }
      }
    }
    ++g.duplicates;
    g.acks.push_back(std::move(ack));
    return;
  }
  session.Mark(batch->seq());
  session.last_ns = now;
  rank.TrimSessions();
  const uint64_t run_id = run.id;
  const uint32_t r = batch->rank();

  if (const auto* a = batch->announce()) {
    if (a->node()) rank.node = a->node()->str();
    rank.local_rank = a->local_rank();
    rank.pid = a->pid();
    bool changed = false;
    if (run.job_id.empty() && a->job_id() && a->job_id()->size()) run.job_id = a->job_id()->str(), changed = true;
    if (run.world_size == 0 && a->world_size()) run.world_size = a->world_size(), changed = true;
    if (run.framework.empty() && a->framework() && a->framework()->size()) run.framework = a->framework()->str(), changed = true;
    if (run.determinism.empty() && a->determinism() && a->determinism()->size()) run.determinism = Pairs(a->determinism()), changed = true;
    if (run.versions.empty() && a->versions() && a->versions()->size()) run.versions = Pairs(a->versions()), changed = true;
    if (run.environment.empty() && a->environment() && a->environment()->size()) run.environment = Pairs(a->environment()), changed = true;
    if (a->start_ns() != 0 && (run.start_ns == run.created_ns || a->start_ns() < run.start_ns)) {
      run.start_ns = a->start_ns();
      changed = true;
    }
    if (changed) dirty_meta_.insert(run_id);
  }

  auto* strings_cf = store_->cf(Cf::kStrings);
  if (const auto* v = batch->strings()) {
    for (const auto* s : *v) {
      if (s->text() == nullptr) continue;
      g.batch.Put(strings_cf, keys::DefKey(run_id, keys::kStringKind, s->id()),
                  rocksdb::Slice(s->text()->data(), s->text()->size()));
      ++g.strings;
    }
  }
  if (const auto* v = batch->sites()) {
    for (const auto* s : *v) {
      std::string value;
      keys::PutU64(&value, s->file());
      keys::PutU32(&value, s->line());
      keys::PutU64(&value, s->function());
      g.batch.Put(strings_cf, keys::DefKey(run_id, keys::kSiteKind, s->id()), value);
      ++g.sites;
    }
  }
  flatbuffers::FlatBufferBuilder fbb(1024);
  if (const auto* v = batch->communicators()) {
    for (const auto* c : *v) {
      fbb.Clear();
      fbb.Finish(CopyCommunicatorDef(fbb, c));
      g.batch.Put(strings_cf, keys::DefKey(run_id, keys::kCommunicatorKind, c->id()),
                  rocksdb::Slice(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize()));
    }
  }
  if (const auto* v = batch->ops()) {
    // Consecutive records of one lane go into one chunk value, keyed by its
    // last op_index (docs/storage.md). Chunking depends only on the batch's
    // content, so a resent batch rewrites exactly the same keys.
    auto* cf = store_->cf(Cf::kOps);
    char key[24];
    auto put_chunk = [&](uint32_t lane, OpChunkWriter& w) {
      if (w.empty()) return;
      EncodeOpKey(key, run_id, r, lane, w.last_op());
      const std::string_view value = w.Finish(chunk_codec_);
      g.batch.Put(cf, rocksdb::Slice(key, sizeof key), rocksdb::Slice(value.data(), value.size()));
      w.Clear();
    };
    // One open chunk per lane of this batch (lanes are few; usually one).
    size_t open_lanes = 0;
    for (const auto* op : *v) {
      const uint32_t lane = op->lane();
      size_t i = 0;
      while (i < open_lanes && chunk_lanes_[i] != lane) ++i;
      if (i == open_lanes) {
        if (open_lanes == chunks_.size()) chunks_.emplace_back();
        if (chunk_lanes_.size() <= open_lanes) chunk_lanes_.resize(open_lanes + 1);
        chunk_lanes_[i] = lane;
        ++open_lanes;
      }
      OpChunkWriter& w = chunks_[i];
      if (!w.Accepts(op->op_index())) put_chunk(lane, w);
      // The record's own bytes when they form one compact span (any batch
      // the shim encodes), else a rebuilt copy.
      if (!AddOpRecordBytes(&w, buffer, bytes, op)) {
        fbb.Clear();
        fbb.Finish(CopyOpRecord(fbb, op));
        w.Add(op->op_index(), fbb.GetBufferPointer(), fbb.GetSize());
      }
    }
    for (size_t i = 0; i < open_lanes; ++i) put_chunk(chunk_lanes_[i], chunks_[i]);
    rank.ops += v->size();
    g.ops += v->size();
  }
  if (const auto* v = batch->collectives()) {
    auto* cf = store_->cf(Cf::kCollectives);
    for (const auto* c : *v) {
      fbb.Clear();
      fbb.Finish(CopyCollectiveRecord(fbb, c));
      g.batch.Put(cf, keys::CollectiveKey(run_id, c->communicator(), c->seq(), r,
                                          static_cast<uint8_t>(c->phase())),
                  rocksdb::Slice(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize()));
      if (c->phase() == wire::CollectivePhase::Completed) {
        ++rank.collectives;
        ++g.collectives;
      }
    }
  }
  auto* events_cf = store_->cf(Cf::kEvents);
  if (const auto* v = batch->steps()) {
    for (const auto* s : *v) {
      std::string value;
      keys::PutU64(&value, s->op_index());
      keys::PutU64(&value, s->time_ns());
      g.batch.Put(events_cf, keys::EventKey(run_id, r, keys::kStepKind, s->lane(), s->step()), value);
    }
    rank.steps += v->size();
    g.steps += v->size();
  }
  if (const auto* v = batch->gaps()) {
    for (const auto* gap : *v) {
      fbb.Clear();
      fbb.Finish(CopyGapNotice(fbb, gap));
      std::string key;
      if (gap->communicator() != 0) {
        // A gap of collective records: run | rank | 'G' | communicator | first_seq.
        key = keys::RunBegin(run_id);
        keys::PutU32(&key, r);
        key.push_back(keys::kCollectiveGapKind);
        keys::PutU64(&key, gap->communicator());
        keys::PutU64(&key, gap->first_seq());
        rank.collective_gap_records += gap->records_dropped();
      } else {
        key = keys::EventKey(run_id, r, keys::kGapKind, gap->lane(), gap->first_op());
        rank.gap_records += gap->records_dropped();
      }
      g.batch.Put(events_cf, key,
                  rocksdb::Slice(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize()));
      ++rank.gap_notices;
      ++g.gap_notices;
      g.gap_records += gap->records_dropped();
    }
  }
  if (const auto* v = batch->sources()) {
    auto* cf = store_->cf(Cf::kSources);
    for (const auto* s : *v) {
      if (s->content() == nullptr) continue;
      g.batch.Put(cf, keys::SourceKey(run_id, s->file()),
                  rocksdb::Slice(reinterpret_cast<const char*>(s->content()->data()), s->content()->size()));
      ++g.sources;
    }
  }
  if (batch->end_of_run()) rank.ended = true;
  ++rank.batches;
  rank.bytes += bytes;
  if (rank.first_ns == 0) rank.first_ns = now;
  rank.last_ns = now;
  g.bytes += bytes;
  dirty_ranks_[run_id].insert(r);
  g.acks.push_back(std::move(ack));
}

void Ingest::HandleDeleteRequests() {
  std::vector<DeleteRequest> requests;
  {
    std::lock_guard<std::mutex> lock(requests_mu_);
    requests.swap(delete_requests_);
  }
  for (auto& request : requests) {
    auto found = working_.find(request.name);
    if (found == working_.end()) {
      request.done->set_value(NotFound("no run named '" + request.name + "'"));
      continue;
    }
    store_->AddDeleteRun(&open_->batch, found->second);
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
  auto* meta = store_->cf(Cf::kMeta);
  std::set<uint64_t> touched(dirty_meta_.begin(), dirty_meta_.end());
  for (uint64_t id : dirty_meta_) {
    const RunState& run = working_.at(id_to_name_.at(id));
    g.batch.Put(meta, keys::MetaRunKey(run.name), RunMetaToJson(run).dump());
  }
  for (const auto& [id, ranks] : dirty_ranks_) {
    const RunState& run = working_.at(id_to_name_.at(id));
    for (uint32_t rank : ranks) {
      g.batch.Put(meta, keys::MetaRankKey(id, rank), RankToJson(run.ranks.at(rank)).dump());
    }
    touched.insert(id);
  }
  for (uint64_t id : touched) g.publish.push_back(working_.at(id_to_name_.at(id)));
  dirty_meta_.clear();
  dirty_ranks_.clear();
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);
    to_commit_ = std::move(open_);
  }
  handoff_cv_.notify_one();
  committer_busy_ = true;
  if (spare_) {
    open_ = std::move(spare_);
  } else {
    open_ = std::make_unique<Group>();
  }
}

void Ingest::DrainCommitted() {
  std::deque<std::unique_ptr<Group>> done;
  {
    std::lock_guard<std::mutex> lock(handoff_mu_);
    done.swap(committed_);
  }
  for (auto& group : done) {
    committer_busy_ = false;
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
    {
      std::unique_lock<std::shared_mutex> lock(published_mu_);
      for (const auto& d : group->deletes) {
        auto it = published_.find(d.name);
        if (it != published_.end() && it->second.id == d.run_id) published_.erase(it);
      }
      for (auto& run : group->publish) published_[run.name] = std::move(run);
    }
    // Counters first: a sender that has its ack may ask for them at once.
    const size_t fresh = group->acks.size() - group->duplicates;
    metrics_->batches_durable.fetch_add(fresh, std::memory_order_relaxed);
    metrics_->batches_duplicate.fetch_add(group->duplicates, std::memory_order_relaxed);
    metrics_->ops.fetch_add(group->ops, std::memory_order_relaxed);
    metrics_->collectives.fetch_add(group->collectives, std::memory_order_relaxed);
    metrics_->strings.fetch_add(group->strings, std::memory_order_relaxed);
    metrics_->sites.fetch_add(group->sites, std::memory_order_relaxed);
    metrics_->sources.fetch_add(group->sources, std::memory_order_relaxed);
    metrics_->steps.fetch_add(group->steps, std::memory_order_relaxed);
    metrics_->gap_notices.fetch_add(group->gap_notices, std::memory_order_relaxed);
    metrics_->gap_records.fetch_add(group->gap_records, std::memory_order_relaxed);
    metrics_->bytes_received.fetch_add(group->bytes, std::memory_order_relaxed);
    metrics_->commit_batches.fetch_add(group->acks.size(), std::memory_order_relaxed);
    for (auto& ack : group->acks) SendAck(ack, true, "");
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

std::vector<RunState> Ingest::Runs() const {
  std::shared_lock<std::shared_mutex> lock(published_mu_);
  std::vector<RunState> out;
  out.reserve(published_.size());
  for (const auto& [name, run] : published_) out.push_back(run);
  return out;
}

std::optional<RunState> Ingest::FindRun(const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(published_mu_);
  auto it = published_.find(name);
  if (it == published_.end()) return std::nullopt;
  return it->second;
}

size_t Ingest::RunCount() const {
  std::shared_lock<std::shared_mutex> lock(published_mu_);
  return published_.size();
}

bool Ingest::Healthy(std::chrono::seconds stall) const {
  const int64_t now = SteadyNs();
  const int64_t limit = std::chrono::duration_cast<std::chrono::nanoseconds>(stall).count();
  if (now - receiver_beat_ns_.load() > limit) return false;
  const int64_t commit = commit_started_ns_.load();
  return commit == 0 || now - commit <= limit;
}

}  // namespace opguard::daemon
