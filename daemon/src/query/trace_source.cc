#include "trace_source.h"

#include <rocksdb/iterator.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "keys.h"
#include "record_copy.h"

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

// Fills `out` in place (a trace scan decodes millions of records into one
// scratch OpDetail: reusing its vectors' capacity avoids a malloc per shape).
void FillTensor(const wire::TensorSig* t, aligner::TensorInfo* out) {
  out->fingerprint = {};
  out->dtype = aligner::DType::kUnknown;
  out->shape.clear();
  out->stats.reset();
  out->device = -1;
  if (t == nullptr) return;
  if (const auto* f = t->fingerprint()) out->fingerprint = {f->lo(), f->hi()};
  out->dtype = static_cast<aligner::DType>(t->dtype());
  if (t->shape()) out->shape.assign(t->shape()->begin(), t->shape()->end());
  if (const auto* s = t->stats()) {
    out->stats =
        aligner::TensorStats{s->nan_count(), s->inf_count(), s->min(), s->max(), s->sum(), s->l2()};
  }
  out->device = t->device();
}

void FillTensors(const flatbuffers::Vector<flatbuffers::Offset<wire::TensorSig>>* v,
                 std::vector<aligner::TensorInfo>* out) {
  out->resize(v ? v->size() : 0);
  for (size_t i = 0; i < out->size(); ++i) {
    FillTensor(v->Get(static_cast<flatbuffers::uoffset_t>(i)), &(*out)[i]);
  }
}

aligner::CollectiveEvent Collective(const wire::CollectiveRecord& c) {
  aligner::CollectiveEvent e;
  e.communicator = c.communicator();
  e.seq = c.seq();
  e.phase = c.phase() == wire::CollectivePhase::Entered ? aligner::CollectivePhase::kEntered
                                                        : aligner::CollectivePhase::kCompleted;
  e.kind = static_cast<aligner::CollectiveKind>(c.kind());
  e.dtype = static_cast<aligner::DType>(c.dtype());
  e.count = c.count();
  e.root = c.root();
  e.reduce_op = c.reduce_op();
  if (c.outputs()) {
    for (const auto* t : *c.outputs()) {
      const auto* f = t->fingerprint();
      e.outputs.push_back(f ? aligner::Fp128{f->lo(), f->hi()} : aligner::Fp128{});
    }
  }
  e.lane = c.lane();
  e.op_index = c.op_index();
  e.step = c.step();
  e.site = c.site();
  e.time_ns = c.time_ns();
  return e;
}

std::unique_ptr<rocksdb::Iterator> RangeIterator(const Store& store, Cf cf,
                                                 const rocksdb::Slice* upper) {
  rocksdb::ReadOptions options;
  options.iterate_upper_bound = upper;
  options.readahead_size = 2 << 20;
  // A whole-trace scan would evict the hot blocks ingest and pages use.
  options.fill_cache = false;
  return std::unique_ptr<rocksdb::Iterator>(store.db()->NewIterator(options, store.cf(cf)));
}

Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return Status::Ok();
  return Internal(std::string(what) + ": " + s.ToString());
}

}  // namespace

void OpDetailFromRecord(const wire::OpRecord& r, aligner::OpDetail* d) {
  d->lane = r.lane();
  d->op_index = r.op_index();
  d->step = r.step();
  d->name = r.name();
  d->site = r.site();
  d->seq_nr = r.seq_nr();
  d->backward = r.backward();
  const auto* inputs = r.inputs();
  d->inputs.resize(inputs ? inputs->size() : 0);
  for (size_t i = 0; i < d->inputs.size(); ++i) {
    const auto* v = inputs->Get(static_cast<flatbuffers::uoffset_t>(i));
    aligner::InputValue& in = d->inputs[i];
    in.kind = static_cast<aligner::ValueKind>(v->kind());
    in.scalar_bits = 0;
    in.scalar_dtype = aligner::DType::kUnknown;
    FillTensor(v->kind() == wire::ValueKind::Tensor ? v->tensor() : nullptr, &in.tensor);
    FillTensors(v->kind() == wire::ValueKind::TensorList ? v->tensors() : nullptr, &in.tensors);
    if (v->kind() == wire::ValueKind::Scalar) {
      in.scalar_bits = v->scalar_bits();
      in.scalar_dtype = static_cast<aligner::DType>(v->scalar_dtype());
    }
  }
  FillTensors(r.outputs(), &d->outputs);
  d->kernels.clear();
  if (r.kernels()) d->kernels.assign(r.kernels()->begin(), r.kernels()->end());
  d->start_ns = r.start_ns();
  d->duration_ns = r.duration_ns();
  d->nondeterministic = r.nondeterministic();
  d->replicated = r.replicated();
}

Result<aligner::RankTrace> LoadRankTrace(const Store& store, uint64_t run, uint32_t rank,
                                         bool with_collectives, const std::atomic<bool>* cancel) {
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
  it_ = RangeIterator(*store_, Cf::kOps, &upper_slice_);
}

StoreDetails::~StoreDetails() = default;

Result<aligner::RankTrace> StoreDetails::LoadRank(uint32_t rank, const std::atomic<bool>* cancel) {
  std::lock_guard<std::mutex> lock(mu_);
  aligner::RankTrace trace;
  trace.rank = rank;
  const std::string begin = keys::LanePrefix(run_, rank, 0);
  const std::string_view prefix(begin.data(), 12);  // run | rank
  {
    OpChunkView chunk;
    aligner::OpDetail scratch;
    aligner::LaneTrace* lane = nullptr;
    uint64_t n = 0;
    for (it_->Seek(begin); it_->Valid(); it_->Next()) {
      if ((++n & 0xFF) == 0 && cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
        return Unavailable("daemon is stopping");
      }
      auto key = it_->key();
      if (!key.starts_with(rocksdb::Slice(prefix.data(), prefix.size()))) break;
      if (key.size() != 24) continue;
      const uint32_t lane_id = keys::GetU32(key.data() + 12);
      const uint64_t key_op = keys::GetU64(key.data() + 16);
      const bool same_lane = lane != nullptr && lane->lane == lane_id;
      if (!chunk.Open(key_op, it_->value().ToStringView())) {
        // A corrupt chunk is a hole in the trace, never a silent pass. Its
        // first op is unknown: the hole runs from after the lane's last op
        // to the key's op (the chunk's last).
        const uint64_t from =
            same_lane && !lane->ops.empty() ? lane->ops.back().op_index + 1 : key_op;
        trace.gaps.push_back({lane_id, std::min(from, key_op), key_op});
        continue;
      }
      for (size_t i = 0; i < chunk.size(); ++i) {
        const uint64_t idx = chunk.op_index(i);
        const auto record = chunk.record(i);
        auto op = wire::OpenStored<wire::OpRecord>(record.data(), record.size());
        if (!op.ok()) {
          trace.gaps.push_back({lane_id, idx, idx});
          continue;
        }
        if (lane == nullptr || lane->lane != lane_id) {
          trace.lanes.push_back({lane_id, {}});
          lane = &trace.lanes.back();
        }
        // Overlapping chunks (a rank that re-sent op indices under a new
        // session) keep the trace strictly ascending: the first one wins.
        if (!lane->ops.empty() && idx <= lane->ops.back().op_index) continue;
        OpDetailFromRecord(**op, &scratch);
        lane->ops.push_back(aligner::MakeOpEvent(scratch, boundaries_.Of(scratch.site)));
      }
    }
    OPGUARD_RETURN_IF_ERROR(FromRocks(it_->status(), "reading trace"));
  }
  {
    // events: run | rank | 'g' | lane | first_op -> GapNotice
    std::string gap_prefix = keys::RunBegin(run_);
    keys::PutU32(&gap_prefix, rank);
    gap_prefix.push_back(keys::kGapKind);
    std::string gap_upper = gap_prefix;
    gap_upper.back() = static_cast<char>(keys::kGapKind + 1);
    rocksdb::Slice gap_upper_slice(gap_upper);
    auto it = RangeIterator(*store_, Cf::kEvents, &gap_upper_slice);
    wire::AlignedStorage storage;
    for (it->Seek(gap_prefix); it->Valid(); it->Next()) {
      auto gap = OpenValue<wire::GapNotice>(it->value(), &storage);
      if (!gap.ok()) continue;
      trace.gaps.push_back({(*gap)->lane(), (*gap)->first_op(), (*gap)->last_op()});
    }
    OPGUARD_RETURN_IF_ERROR(FromRocks(it->status(), "reading gap notices"));
  }
  return trace;
}

Result<std::map<uint32_t, std::vector<aligner::CollectiveEvent>>> LoadCollectives(
    const Store& store, uint64_t run) {
  std::map<uint32_t, std::vector<aligner::CollectiveEvent>> out;
  const std::string begin = keys::RunBegin(run), upper = keys::RunBegin(run + 1);
  rocksdb::Slice upper_slice(upper);
  auto it = RangeIterator(store, Cf::kCollectives, &upper_slice);
  wire::AlignedStorage storage;
  for (it->Seek(begin); it->Valid(); it->Next()) {
    auto key = it->key();
    if (key.size() != 29) continue;
    auto c = OpenValue<wire::CollectiveRecord>(it->value(), &storage);
    if (!c.ok()) continue;
    out[keys::GetU32(key.data() + 24)].push_back(Collective(**c));
  }
  OPGUARD_RETURN_IF_ERROR(FromRocks(it->status(), "reading collectives"));
  return out;
}

Result<std::vector<CollectiveGapRange>> LoadCollectiveGaps(const Store& store, uint64_t run,
                                                           const std::vector<uint32_t>& ranks) {
  std::vector<CollectiveGapRange> out;
  for (uint32_t rank : ranks) {
    std::string prefix = keys::RunBegin(run);
    keys::PutU32(&prefix, rank);
    prefix.push_back(keys::kCollectiveGapKind);
    std::string upper = prefix;
    upper.back() = static_cast<char>(keys::kCollectiveGapKind + 1);
    rocksdb::Slice upper_slice(upper);
    auto it = RangeIterator(store, Cf::kEvents, &upper_slice);
    wire::AlignedStorage storage;
    for (it->Seek(prefix); it->Valid(); it->Next()) {
      auto gap = OpenValue<wire::GapNotice>(it->value(), &storage);
      if (!gap.ok()) continue;
      out.push_back({rank, (*gap)->communicator(), (*gap)->first_seq(), (*gap)->last_seq()});
    }
    OPGUARD_RETURN_IF_ERROR(FromRocks(it->status(), "reading collective gap notices"));
  }
  return out;
}

Result<std::vector<aligner::Communicator>> LoadCommunicators(const Store& store, uint64_t run) {
  std::vector<aligner::Communicator> out;
  std::string prefix = keys::RunBegin(run);
  prefix.push_back(keys::kCommunicatorKind);
  std::string upper = prefix;
  upper.back() = static_cast<char>(keys::kCommunicatorKind + 1);
  rocksdb::Slice upper_slice(upper);
  auto it = RangeIterator(store, Cf::kStrings, &upper_slice);
  wire::AlignedStorage storage;
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    auto def = OpenValue<wire::CommunicatorDef>(it->value(), &storage);
    if (!def.ok()) continue;
    aligner::Communicator c;
    c.id = (*def)->id();
    c.name = (*def)->name() ? (*def)->name()->str() : std::string();
    if ((*def)->ranks()) c.ranks.assign((*def)->ranks()->begin(), (*def)->ranks()->end());
    out.push_back(std::move(c));
  }
  OPGUARD_RETURN_IF_ERROR(FromRocks(it->status(), "reading communicators"));
  return out;
}

std::optional<aligner::OpDetail> StoreDetails::Find(uint32_t rank, uint32_t lane,
                                                    uint64_t op_index) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Chunks are keyed by their last op: the first key >= (rank, lane, op) is
  // the only chunk that can hold the op. The last chunk decoded is kept, as
  // pivots look up neighbouring ops.
  const std::string key = keys::OpKey(run_, rank, lane, op_index);
  if (!(cached_valid_ && cached_key_.size() == 24 && cached_key_.compare(0, 16, key, 0, 16) == 0 &&
        op_index <= keys::GetU64(cached_key_.data() + 16) && chunk_.size() > 0 &&
        op_index >= chunk_.op_index(0))) {
    cached_valid_ = false;
    it_->Seek(key);
    if (!it_->Valid() || it_->key().size() != 24 ||
        !it_->key().starts_with(rocksdb::Slice(key.data(), 16))) {
      return std::nullopt;
    }
    cached_key_.assign(it_->key().data(), it_->key().size());
    if (!chunk_.Open(keys::GetU64(cached_key_.data() + 16), it_->value().ToStringView(),
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
    uint32_t occurrence = 0;
    if (const auto* lines = Lines(def->file); lines != nullptr && def->line >= 1 &&
                                               def->line <= lines->size()) {
      text = aligner::TrimmedLine((*lines)[def->line - 1]);
      for (uint32_t i = 0; i + 1 < def->line; ++i) {
        if (aligner::TrimmedLine((*lines)[i]) == text) ++occurrence;
      }
    }
    id = aligner::BoundaryId(path, function, def->line, text, occurrence);
  }
  by_site_.emplace(site, id);
  return id;
}

const std::vector<std::string>* SiteBoundaries::Lines(uint64_t file) {
  auto [it, added] = files_.try_emplace(file);
  if (added) {
    std::string content;
    auto s = store_->db()->Get(rocksdb::ReadOptions(), store_->cf(Cf::kSources),
                               keys::SourceKey(run_, file), &content);
    if (s.ok()) {
      std::vector<std::string> lines;
      size_t start = 0;
      while (start <= content.size()) {
        size_t end = content.find('\n', start);
        if (end == std::string::npos) end = content.size();
        lines.emplace_back(content, start, end - start);
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
  auto defs = store_->GetDefs(run_, keys::kStringKind, {id});
  std::optional<std::string> v;
  if (auto it = defs.find(id); it != defs.end()) v = it->second;
  strings_[id] = v;
  return v;
}

std::optional<aligner::StringResolver::Site> StoreStrings::SiteOf(uint64_t site_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = sites_.find(site_id); it != sites_.end()) return it->second;
  auto defs = store_->GetDefs(run_, keys::kSiteKind, {site_id});
  std::optional<Site> v;
  if (auto it = defs.find(site_id); it != defs.end() && it->second.size() == 20) {
    const char* p = it->second.data();
    v = Site{keys::GetU64(p), keys::GetU32(p + 8), keys::GetU64(p + 12)};
  }
  sites_[site_id] = v;
  return v;
}

}  // namespace opguard::daemon
