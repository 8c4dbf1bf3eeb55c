#include "query/trace_source.h"

#include <rocksdb/iterator.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "opguard/daemon/report_wire.h"
#include "storage/keys.h"

namespace opguard::daemon {
namespace {

// FlatBuffers reads in place and needs 8-byte aligned buffers; a RocksDB
// value slice may start anywhere inside its block.
template <typename T>
Result<const T*> OpenValue(const rocksdb::Slice& value, wire::AlignedStorage* storage) {
  const char* data = value.data();
  if (reinterpret_cast<uintptr_t>(data) % wire::kBufferAlignment != 0) {
    storage->resize((value.size() + sizeof(uint64_t) - 1) / sizeof(uint64_t));
    std::memcpy(storage->data(), data, value.size());
    data = reinterpret_cast<const char*>(storage->data());
  }
  return wire::OpenStored<T>(data, value.size());
}

Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return Status::Ok();
  return Internal(std::string(what) + ": " + s.ToString());
}

// Calls fn(value) for every value of type T stored under `prefix` (a kind
// of keys.h) that opens; damaged ones are skipped. Few keys, mostly none (a
// diff scans each rank's gap notices): no long readahead.
template <typename T, typename Fn>
Status ScanKind(const Store& store, Cf cf, const std::string& prefix, const char* what, Fn&& fn) {
  const std::string upper = keys::KindUpperBound(prefix);
  rocksdb::Slice upper_slice(upper);
  auto it = store.NewScan(cf, &upper_slice, /*fill_cache=*/false, /*readahead=*/0);
  wire::AlignedStorage storage;
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    auto value = OpenValue<T>(it->value(), &storage);
    if (value.ok()) fn(**value);
  }
  return FromRocks(it->status(), what);
}

}  // namespace

Result<aligner::RankTrace> LoadRankTrace(const Store& store, uint64_t run, uint32_t rank,
                                         bool with_collectives, const CancelToken* cancel) {
  StoreDetails view(&store, run);
  OPGUARD_ASSIGN_OR_RETURN(aligner::RankTrace trace, view.LoadRank(rank, cancel));
  if (with_collectives) {
    OPGUARD_ASSIGN_OR_RETURN(auto all, LoadCollectives(store, run));
    if (auto it = all.find(rank); it != all.end()) trace.collectives = std::move(it->second);
  }
  return trace;
}

StoreDetails::StoreDetails(const Store* store, uint64_t run)
    : store_(store), run_(run), boundaries_(store, run), upper_(keys::RunBegin(run + 1)),
      upper_slice_(upper_) {
  it_ = store_->NewScan(Cf::kOps, &upper_slice_, /*fill_cache=*/false);
}

StoreDetails::~StoreDetails() = default;

// Builds one rank's trace from ops in stored order (lane by lane, each
// ascending).
class StoreDetails::TraceBuilder {
 public:
  TraceBuilder(aligner::RankTrace* trace, SiteBoundaries* boundaries, uint64_t expected_ops)
      : trace_(trace), boundaries_(boundaries), expected_ops_(expected_ops) {}

  // Whether op `idx` of `lane_id` joins the trace: overlapping chunks (a
  // rank that re-sent op indices under a new session) keep each lane
  // strictly ascending, the first one wins.
  bool Takes(uint32_t lane_id, uint64_t idx) {
    if (lane_ == nullptr || lane_->lane != lane_id) {
      trace_->lanes.push_back({lane_id, {}});
      lane_ = &trace_->lanes.back();
      // The rank's remaining ops: exact for the common one-lane rank;
      // RunReader trims what a lane did not use.
      lane_->ops.reserve(expected_ops_ > loaded_ ? expected_ops_ - loaded_ : 0);
    }
    return lane_->ops.empty() || idx > lane_->ops.back().op_index;
  }
  void Add(const aligner::OpEventCore& core) {  // after Takes
    lane_->ops.push_back(aligner::ToOpEvent(core, Boundary(core.site)));
    ++loaded_;
  }
  // A damaged chunk is a hole in the trace, never a silent pass nor a
  // failed query. Its first op is unknown: the hole runs from after the
  // lane's last op to the key's op (the chunk's last).
  aligner::Gap Hole(uint32_t lane_id, uint64_t key_op) {
    const bool same_lane = lane_ != nullptr && lane_->lane == lane_id;
    const uint64_t from = same_lane && !lane_->ops.empty() ? lane_->ops.back().op_index + 1 : key_op;
    trace_->gaps.push_back({lane_id, std::min(from, key_op), key_op});
    return trace_->gaps.back();
  }

 private:
  // A few sites take turns from op to op: a small direct-mapped memo in
  // front of the map (Of(0) is 0, so the empty slots hold).
  uint64_t Boundary(uint64_t site) {
    auto& slot = memo_[(site * 0x9e3779b97f4a7c15ULL) >> 58];
    if (slot.first != site) slot = {site, boundaries_->Of(site)};
    return slot.second;
  }
  aligner::RankTrace* trace_;
  SiteBoundaries* boundaries_;
  const uint64_t expected_ops_;
  aligner::LaneTrace* lane_ = nullptr;
  uint64_t loaded_ = 0;
  std::array<std::pair<uint64_t, uint64_t>, 64> memo_{};
};

Result<aligner::RankTrace> StoreDetails::LoadRank(uint32_t rank, const CancelToken* cancel,
                                                  uint64_t expected_ops) {
  std::lock_guard<std::mutex> lock(mu_);
  aligner::RankTrace trace;
  trace.rank = rank;
  OPGUARD_ASSIGN_OR_RETURN(const bool from_cores, LoadCores(rank, cancel, expected_ops, &trace));
  if (!from_cores) {
    trace = {};
    trace.rank = rank;
    OPGUARD_RETURN_IF_ERROR(LoadChunks(rank, cancel, expected_ops, &trace));
  }
  OPGUARD_RETURN_IF_ERROR(ScanKind<wire::GapNotice>(
      *store_, Cf::kEvents, keys::EventKindPrefix(run_, rank, keys::kGapKind), "reading gap notices",
      [&](const wire::GapNotice& g) { trace.gaps.push_back({g.lane(), g.first_op(), g.last_op()}); }));
  // Damage found earlier in the records (a trace page, a scrub) is a gap of
  // this trace too, even when it was read from the intact cores: the
  // records of those ops are lost, and the answer must say so.
  for (const Store::DamagedOps& d : store_->KnownDamage(run_, rank)) {
    const bool listed = std::any_of(trace.gaps.begin(), trace.gaps.end(), [&d](const aligner::Gap& g) {
      return g.lane == d.lane && g.first_op == d.first_op && g.last_op == d.last_op;
    });
    if (!listed) trace.gaps.push_back({d.lane, d.first_op, d.last_op});
  }
  return trace;
}

// The cores column family holds every chunk's cores when the rank's marker
// says so (docs/storage.md): then the trace is read from them alone, with no
// chunk touched. False (and a partial *trace) when it cannot be: no marker
// (a rank stored before, or with storage.op_cores off), cores of another
// version, a value or block that does not read; the chunks answer then.
Result<bool> StoreDetails::LoadCores(uint32_t rank, const CancelToken* cancel, uint64_t expected_ops,
                                     aligner::RankTrace* trace) {
  if (!store_->Has(Cf::kCores)) return false;
  const std::string marker = keys::CoresCompleteKey(run_, rank);
  // One iterator for all the run's ranks: its readahead carries over from
  // one rank to the next, which follows it in the file.
  if (!cores_it_) cores_it_ = store_->NewScan(Cf::kCores, &upper_slice_, /*fill_cache=*/false);
  rocksdb::Iterator* it = cores_it_.get();
  it->Seek(marker);
  if (!it->Valid() && !it->status().ok()) {
    store_->NoteReadError("the event cores of run id " + std::to_string(run_) + " rank " + std::to_string(rank),
                          it->status().ToString());
    return false;
  }
  if (!it->Valid() || it->key() != rocksdb::Slice(marker) ||
      it->value() != rocksdb::Slice(keys::CoresCompleteValue(aligner::kOpEventCoreVersion))) {
    return false;
  }
  TraceBuilder builder(trace, &boundaries_, expected_ops);
  OpChunkView cores;
  for (it->Next(); it->Valid(); it->Next()) {
    // One check per stored chunk (at most 256 records).
    OPGUARD_RETURN_IF_ERROR(CheckCancel(cancel));
    const std::string_view key = it->key().ToStringView();
    if (!key.starts_with(marker)) break;
    if (key.size() != keys::kOpKeySize) return false;
    const uint32_t lane = keys::OpKeyLane(key);
    const auto opened = cores.OpenCores(keys::OpKeyIndex(key), it->value().ToStringView());
    if (opened != OpChunkView::Cores::kRead) {
      // The chunks answer instead; damage is counted and logged.
      if (opened == OpChunkView::Cores::kDamaged) {
        store_->NoteReadError("the event cores of run id " + std::to_string(run_) + " rank " + std::to_string(rank),
                              "a cores value does not open");
      }
      return false;
    }
    for (const aligner::OpEventCore& core : cores.cores()) {
      if (builder.Takes(lane, core.op_index)) builder.Add(core);
    }
  }
  if (!it->status().ok()) {
    // A block whose checksum does not match, an I/O error: the chunks answer.
    store_->NoteReadError("the event cores of run id " + std::to_string(run_) + " rank " + std::to_string(rank),
                          it->status().ToString());
    return false;
  }
  return true;
}

// The trace from the ops chunks: the cores stored in front of a chunk's
// records (the layout before the cores column family), else every record
// decoded and reduced.
Status StoreDetails::LoadChunks(uint32_t rank, const CancelToken* cancel, uint64_t expected_ops,
                                aligner::RankTrace* trace) {
  const std::string begin = keys::LanePrefix(run_, rank, 0);
  const std::string_view prefix(begin.data(), 12);  // run | rank
  TraceBuilder builder(trace, &boundaries_, expected_ops);
  OpChunkView chunk;
  aligner::OpDetail scratch;
  std::string last_key;  // the last key read fine
  char first_key[keys::kOpKeySize];
  keys::EncodeOpKey(first_key, run_, rank, 0, 0);
  bool damaged_to_end = false;
  for (it_->Seek(begin);; it_->Next()) {
    // A value RocksDB cannot read (checksum mismatch): skip to what reads.
    while (!it_->Valid() && !it_->status().ok()) {
      const std::string damaged = store_->SkipDamagedOps(
          it_.get(), last_key.empty() ? std::string_view(first_key, sizeof first_key) : last_key,
          !last_key.empty(), &damaged_to_end);
      if (!std::string_view(damaged).starts_with(prefix)) break;  // past this rank
      builder.Hole(keys::OpKeyLane(damaged), keys::OpKeyIndex(damaged));  // SkipDamagedOps noted it
      last_key = damaged;
      if (damaged_to_end) break;
    }
    if (!it_->Valid()) break;
    // One check per stored chunk (at most 256 records).
    OPGUARD_RETURN_IF_ERROR(CheckCancel(cancel));
    auto key = it_->key();
    if (!key.starts_with(rocksdb::Slice(prefix.data(), prefix.size()))) break;
    if (key.size() != keys::kOpKeySize) continue;
    last_key = key.ToString();
    const uint32_t lane_id = keys::OpKeyLane(key.ToStringView());
    const uint64_t key_op = keys::OpKeyIndex(key.ToStringView());
    // The cores stored with the records (op_chunk.h): no record is
    // decompressed, verified or hashed.
    if (chunk.OpenCores(key_op, it_->value().ToStringView()) == OpChunkView::Cores::kRead) {
      for (const aligner::OpEventCore& core : chunk.cores()) {
        if (builder.Takes(lane_id, core.op_index)) builder.Add(core);
      }
      continue;
    }
    // A value of an earlier layout (or whose cores do not open): reduce
    // every record.
    if (!chunk.Open(key_op, it_->value().ToStringView())) {
      const aligner::Gap hole = builder.Hole(lane_id, key_op);
      store_->NoteDamagedOps(key.ToStringView(), hole.first_op, "an ops chunk whose framing or compression does not open");
      continue;
    }
    for (size_t i = 0; i < chunk.size(); ++i) {
      const uint64_t idx = chunk.op_index(i);
      const auto record = chunk.record(i);
      auto op = wire::OpenStored<wire::OpRecord>(record.data(), record.size());
      if (!op.ok()) {
        trace->gaps.push_back({lane_id, idx, idx});
        continue;
      }
      if (!builder.Takes(lane_id, idx)) continue;
      OpDetailFromRecord(**op, &scratch);
      builder.Add(aligner::MakeOpEventCore(scratch));
    }
  }
  if (!damaged_to_end) OPGUARD_RETURN_IF_ERROR(FromRocks(it_->status(), "reading trace"));
  return Status::Ok();
}

Result<std::map<uint32_t, std::vector<aligner::CollectiveEvent>>> LoadCollectives(
    const Store& store, uint64_t run) {
  std::map<uint32_t, std::vector<aligner::CollectiveEvent>> out;
  const std::string begin = keys::RunBegin(run), upper = keys::RunBegin(run + 1);
  rocksdb::Slice upper_slice(upper);
  auto it = store.NewScan(Cf::kCollectives, &upper_slice, /*fill_cache=*/false);
  wire::AlignedStorage storage;
  for (it->Seek(begin); it->Valid(); it->Next()) {
    auto key = it->key();
    if (key.size() != keys::kCollectiveKeySize) continue;
    auto c = OpenValue<wire::CollectiveRecord>(it->value(), &storage);
    if (!c.ok()) {
      store.NoteReadError("a collective record of run id " + std::to_string(run), c.status().message());
      continue;
    }
    out[keys::CollectiveKeyRank(key.ToStringView())].push_back(CollectiveFromWire(**c));
  }
  OPGUARD_RETURN_IF_ERROR(FromRocks(it->status(), "reading collectives"));
  return out;
}

Result<std::vector<CollectiveGapRange>> LoadCollectiveGaps(const Store& store, uint64_t run,
                                                           const std::vector<uint32_t>& ranks) {
  std::vector<CollectiveGapRange> out;
  for (uint32_t rank : ranks) {
    OPGUARD_RETURN_IF_ERROR(ScanKind<wire::GapNotice>(
        store, Cf::kEvents, keys::EventKindPrefix(run, rank, keys::kCollectiveGapKind),
        "reading collective gap notices", [&](const wire::GapNotice& g) {
          out.push_back({rank, g.communicator(), g.first_seq(), g.last_seq()});
        }));
  }
  return out;
}

Result<std::vector<aligner::Communicator>> LoadCommunicators(const Store& store, uint64_t run) {
  std::vector<aligner::Communicator> out;
  OPGUARD_RETURN_IF_ERROR(ScanKind<wire::CommunicatorDef>(
      store, Cf::kStrings, keys::DefKindPrefix(run, keys::kCommunicatorKind), "reading communicators",
      [&](const wire::CommunicatorDef& def) { out.push_back(CommunicatorFromWire(def)); }));
  return out;
}

std::optional<aligner::OpDetail> StoreDetails::Find(uint32_t rank, uint32_t lane,
                                                    uint64_t op_index) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Chunks are keyed by their last op: the first key >= (rank, lane, op) is
  // the only chunk that can hold the op. The last chunk decoded is kept, as
  // pivots look up neighbouring ops.
  const std::string key = keys::OpKey(run_, rank, lane, op_index);
  const std::string_view lane_prefix(key.data(), 16);  // run | rank | lane
  if (!(cached_valid_ && std::string_view(cached_key_).starts_with(lane_prefix) &&
        op_index <= keys::OpKeyIndex(cached_key_) && chunk_.size() > 0 &&
        op_index >= chunk_.op_index(0))) {
    cached_valid_ = false;
    it_->Seek(key);
    if (!it_->Valid() || it_->key().size() != keys::kOpKeySize ||
        !it_->key().ToStringView().starts_with(lane_prefix)) {
      return std::nullopt;
    }
    cached_key_.assign(it_->key().data(), it_->key().size());
    if (!chunk_.Open(keys::OpKeyIndex(cached_key_), it_->value().ToStringView(),
                     /*copy=*/true)) {
      return std::nullopt;
    }
    cached_valid_ = true;
  }
  const size_t i = chunk_.LowerBound(op_index);
  if (i == chunk_.size() || chunk_.op_index(i) != op_index) return std::nullopt;
  const auto record = chunk_.record(i);
  auto op = wire::OpenStored<wire::OpRecord>(record.data(), record.size());
  if (!op.ok()) return std::nullopt;
  aligner::OpDetail d;
  OpDetailFromRecord(**op, &d);
  return d;
}

SiteBoundaries::SiteBoundaries(const Store* store, uint64_t run)
    : store_(store), run_(run), strings_(std::make_unique<StoreStrings>(store, run)) {}
SiteBoundaries::~SiteBoundaries() = default;

uint64_t SiteBoundaries::Of(uint64_t site) {
  if (site == 0) return 0;
  if (auto it = by_site_.find(site); it != by_site_.end()) return it->second;
  uint64_t id = 0;
  if (auto def = strings_->SiteOf(site)) {
    const std::string path = strings_->String(def->file).value_or("");
    const std::string function = strings_->String(def->function).value_or("");
    std::string_view text;
    if (const auto* lines = Lines(def->file); lines != nullptr && def->line >= 1 &&
                                               def->line <= lines->size()) {
      text = aligner::TrimmedLine((*lines)[def->line - 1]);
    }
    id = aligner::BoundaryId(path, function, def->line, text);
  }
  by_site_.emplace(site, id);
  return id;
}

const std::vector<std::string>* SiteBoundaries::Lines(uint64_t file) {
  auto [it, added] = files_.try_emplace(file);
  if (added) {
    if (auto content = store_->GetSource(run_, file)) {
      std::vector<std::string> lines;
      size_t start = 0;
      while (start <= content->size()) {
        size_t end = content->find('\n', start);
        if (end == std::string::npos) end = content->size();
        lines.emplace_back(*content, start, end - start);
        start = end + 1;
      }
      it->second = std::move(lines);
    }
  }
  return it->second ? &*it->second : nullptr;
}

std::optional<std::string> StoreStrings::String(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = strings_.find(id); it != strings_.end()) return it->second;
  auto defs = store_->GetStrings(run_, {id});
  std::optional<std::string> v;
  if (auto it = defs.find(id); it != defs.end()) v = it->second;
  strings_[id] = v;
  return v;
}

std::optional<aligner::StringResolver::Site> StoreStrings::SiteOf(uint64_t site_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = sites_.find(site_id); it != sites_.end()) return it->second;
  auto defs = store_->GetSites(run_, {site_id});
  std::optional<Site> v;
  if (auto it = defs.find(site_id); it != defs.end()) {
    v = Site{it->second.file, it->second.line, it->second.function};
  }
  sites_[site_id] = v;
  return v;
}

}  // namespace opguard::daemon
