#include "encoder.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string_view>

#include "opguard/idl/envelope.h"
#include "staging.h"

namespace opguard::shim {
namespace {

namespace fb = flatbuffers;
namespace w = opguard::wire;

// Batch buffers: nearly all of one size, each alive until its batch is
// acknowledged. Buffers that large come straight from mmap in glibc, so every
// fresh one page-faults its way in (up to a fifth of the sender thread's time
// in opguard-loadgen at full rate). This keeps up to 8 freed buffers (a few
// MiB) for the next batches.
// Process-lifetime (buffers may be freed after the encoder is gone) and
// fork-safe: the lock is only ever tried, and a held one (say, copied locked
// into a forked child) just means plain new/delete.
class RecyclingAllocator final : public fb::Allocator {
 public:
  static RecyclingAllocator* Get() {
    static auto* instance = new RecyclingAllocator();  // never destroyed
    return instance;
  }

  uint8_t* allocate(size_t size) override {
    if (!busy_.test_and_set(std::memory_order_acquire)) {
      uint8_t* p = nullptr;
      for (size_t i = 0; i < count_; ++i) {
        if (free_[i].size == size) {
          p = free_[i].p;
          free_[i] = free_[--count_];
          break;
        }
      }
      busy_.clear(std::memory_order_release);
      if (p != nullptr) return p;
    }
    return new uint8_t[size];
  }

  void deallocate(uint8_t* p, size_t size) override {
    if (!busy_.test_and_set(std::memory_order_acquire)) {
      const bool kept = count_ < kKeep;
      if (kept) free_[count_++] = {p, size};
      busy_.clear(std::memory_order_release);
      if (kept) return;
    }
    delete[] p;
  }

 private:
  static constexpr size_t kKeep = 8;
  struct Block {
    uint8_t* p;
    size_t size;
  };
  std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  Block free_[kKeep] = {};
  size_t count_ = 0;
};

// One Batch under construction.
class Builder {
 public:
  // `initial_bytes`: a batch's expected size, so that building it does not
  // reallocate (and copy) the buffer on the way.
  explicit Builder(size_t initial_bytes) : fbb_(initial_bytes, RecyclingAllocator::Get()) {}

  fb::FlatBufferBuilder& fbb() { return fbb_; }
  uint32_t records() const { return records_; }
  bool empty() const { return entries_ == 0; }

  std::vector<fb::Offset<w::StringDef>> strings;
  std::vector<fb::Offset<w::SiteDef>> sites;
  std::vector<fb::Offset<w::CommunicatorDef>> communicators;
  std::vector<fb::Offset<w::OpRecord>> ops;
  std::vector<fb::Offset<w::CollectiveRecord>> collectives;
  std::vector<fb::Offset<w::StepMark>> steps;
  std::vector<fb::Offset<w::SourceFile>> sources;
  std::vector<fb::Offset<w::GapNotice>> gaps;
  // Per-record scratch, reused so that encoding a record allocates nothing.
  std::vector<fb::Offset<w::Value>> inputs_scratch;
  std::vector<fb::Offset<w::TensorSig>> tensors_scratch;
  std::vector<fb::Offset<w::TensorSig>> list_scratch;

  void CountEntry(bool is_record) {
    ++entries_;
    if (is_record) ++records_;
  }

  EncodedBatch Finish(const BatchIdentity& id, uint64_t seq, const AnnounceInfo* announce,
                      bool end_of_run) {
    fb::Offset<w::RunAnnounce> ann;
    if (announce != nullptr) ann = BuildAnnounce(*announce);
    auto run = fbb_.CreateString(id.run);
    auto s = Vec(strings);
    auto si = Vec(sites);
    auto c = Vec(communicators);
    auto o = Vec(ops);
    auto co = Vec(collectives);
    auto st = Vec(steps);
    auto so = Vec(sources);
    auto g = Vec(gaps);
    w::BatchBuilder b(fbb_);
    b.add_run(run);
    b.add_rank(id.rank);
    b.add_session(id.session);
    b.add_seq(seq);
    if (announce != nullptr) b.add_announce(ann);
    if (!strings.empty()) b.add_strings(s);
    if (!sites.empty()) b.add_sites(si);
    if (!communicators.empty()) b.add_communicators(c);
    if (!ops.empty()) b.add_ops(o);
    if (!collectives.empty()) b.add_collectives(co);
    if (!steps.empty()) b.add_steps(st);
    if (!sources.empty()) b.add_sources(so);
    if (!gaps.empty()) b.add_gaps(g);
    b.add_end_of_run(end_of_run);
    w::FinishEnvelope(fbb_, b.Finish());
    EncodedBatch out;
    out.seq = seq;
    out.records = records_;
    out.buffer = fbb_.Release();
    Reset();
    return out;
  }

 private:
  // Ready for the next batch; the vectors keep their capacity.
  void Reset() {
    fbb_.Clear();
    strings.clear();
    sites.clear();
    communicators.clear();
    ops.clear();
    collectives.clear();
    steps.clear();
    sources.clear();
    gaps.clear();
    records_ = 0;
    entries_ = 0;
  }

  template <typename T>
  fb::Offset<fb::Vector<fb::Offset<T>>> Vec(const std::vector<fb::Offset<T>>& v) {
    if (v.empty()) return 0;
    return fbb_.CreateVector(v);
  }

  fb::Offset<fb::Vector<fb::Offset<w::KeyValue>>> KvVec(const KeyValues& kvs) {
    if (kvs.empty()) return 0;
    std::vector<fb::Offset<w::KeyValue>> out;
    out.reserve(kvs.size());
    for (const auto& [k, v] : kvs) {
      out.push_back(w::CreateKeyValue(fbb_, fbb_.CreateString(k), fbb_.CreateString(v)));
    }
    // `key` is the table's sort key: readers may binary-search it.
    return fbb_.CreateVectorOfSortedTables(&out);
  }

  fb::Offset<w::RunAnnounce> BuildAnnounce(const AnnounceInfo& a) {
    auto job = fbb_.CreateString(a.job_id);
    auto node = fbb_.CreateString(a.node);
    auto framework = fbb_.CreateString(a.framework);
    auto versions = KvVec(a.versions);
    auto det = KvVec(a.determinism);
    auto env = KvVec(a.environment);
    w::RunAnnounceBuilder b(fbb_);
    b.add_job_id(job);
    b.add_local_rank(a.local_rank);
    b.add_world_size(a.world_size);
    b.add_node(node);
    b.add_pid(a.pid);
    b.add_framework(framework);
    if (!a.versions.empty()) b.add_versions(versions);
    if (!a.determinism.empty()) b.add_determinism(det);
    if (!a.environment.empty()) b.add_environment(env);
    b.add_start_ns(a.start_ns);
    return b.Finish();
  }

  fb::FlatBufferBuilder fbb_;
  uint32_t records_ = 0;
  uint32_t entries_ = 0;
};

bool ReadTensor(EntryReader& r, fb::FlatBufferBuilder& fbb, fb::Offset<w::TensorSig>* out) {
  TensorFixed t;
  const uint8_t* dims = nullptr;
  if (!r.Get(&t) || !r.GetDims(t.ndim, &dims)) return false;
  int64_t* shape_ptr = nullptr;
  auto shape = fbb.CreateUninitializedVector<int64_t>(t.ndim, &shape_ptr);
  if (t.ndim != 0) std::memcpy(shape_ptr, dims, size_t{t.ndim} * sizeof(int64_t));
  fb::Offset<w::TensorStats> stats;
  if (t.has_stats != 0) {
    stats = w::CreateTensorStats(fbb, t.stats.nan_count, t.stats.inf_count, t.stats.min,
                                 t.stats.max, t.stats.sum, t.stats.l2);
  }
  w::Fp128 fp(t.lo, t.hi);
  w::TensorSigBuilder b(fbb);
  b.add_fingerprint(&fp);
  b.add_dtype(static_cast<w::DType>(t.dtype));
  b.add_shape(shape);
  if (t.has_stats != 0) b.add_stats(stats);
  b.add_device(t.device);
  *out = b.Finish();
  return true;
}

bool ReadTensors(EntryReader& r, fb::FlatBufferBuilder& fbb, uint32_t n,
                 std::vector<fb::Offset<w::TensorSig>>* out) {
  out->clear();
  out->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    fb::Offset<w::TensorSig> t;
    if (!ReadTensor(r, fbb, &t)) return false;
    out->push_back(t);
  }
  return true;
}

bool EncodeOp(EntryReader& r, Builder& b) {
  auto& fbb = b.fbb();
  OpFixed op;
  if (!r.Get(&op)) return false;
  auto& inputs = b.inputs_scratch;
  auto& tensors = b.tensors_scratch;
  inputs.clear();
  for (uint32_t i = 0; i < op.num_inputs; ++i) {
    ValueFixed v;
    if (!r.Get(&v)) return false;
    auto kind = static_cast<w::ValueKind>(v.kind);
    fb::Offset<w::TensorSig> tensor;
    fb::Offset<fb::Vector<fb::Offset<w::TensorSig>>> list;
    if (kind == w::ValueKind::Tensor) {
      if (!ReadTensor(r, fbb, &tensor)) return false;
    } else if (kind == w::ValueKind::TensorList) {
      if (!ReadTensors(r, fbb, v.num_tensors, &b.list_scratch)) return false;
      list = fbb.CreateVector(b.list_scratch);
    }
    w::ValueBuilder vb(fbb);
    vb.add_kind(kind);
    if (kind == w::ValueKind::Tensor) vb.add_tensor(tensor);
    if (kind == w::ValueKind::Scalar) {
      vb.add_scalar_bits(v.scalar_bits);
      vb.add_scalar_dtype(static_cast<w::DType>(v.scalar_dtype));
    }
    if (kind == w::ValueKind::TensorList) vb.add_tensors(list);
    inputs.push_back(vb.Finish());
  }
  if (!ReadTensors(r, fbb, op.num_outputs, &tensors)) return false;
  auto outputs = fbb.CreateVector(tensors);
  auto in_vec = fbb.CreateVector(inputs);
  fb::Offset<fb::Vector<uint64_t>> kernels;
  if (op.num_kernels != 0) {
    const uint8_t* k = nullptr;
    if (!r.GetDims(op.num_kernels, &k)) return false;
    uint64_t* dst = nullptr;
    kernels = fbb.CreateUninitializedVector<uint64_t>(op.num_kernels, &dst);
    std::memcpy(dst, k, size_t{op.num_kernels} * sizeof(uint64_t));
  }
  w::OpRecordBuilder ob(fbb);
  ob.add_lane(op.lane);
  ob.add_op_index(op.op_index);
  ob.add_step(op.step);
  ob.add_name(op.name);
  ob.add_site(op.site);
  ob.add_seq_nr((op.flags & OPGUARD_OP_HAS_SEQ_NR) != 0 ? op.seq_nr : -1);
  ob.add_backward((op.flags & OPGUARD_OP_BACKWARD) != 0);
  ob.add_inputs(in_vec);
  ob.add_outputs(outputs);
  if (op.num_kernels != 0) ob.add_kernels(kernels);
  ob.add_start_ns(op.start_ns);
  ob.add_duration_ns(op.duration_ns);
  ob.add_nondeterministic((op.flags & OPGUARD_OP_NONDETERMINISTIC) != 0);
  ob.add_replicated((op.flags & OPGUARD_OP_REPLICATED) != 0);
  ob.add_forward_site(op.forward_site);
  ob.add_trusted((op.flags & OPGUARD_OP_TRUSTED) != 0);
  b.ops.push_back(ob.Finish());
  return true;
}

bool EncodeCollective(EntryReader& r, Builder& b) {
  auto& fbb = b.fbb();
  CollectiveFixed c;
  if (!r.Get(&c)) return false;
  auto& tensors = b.tensors_scratch;
  if (!ReadTensors(r, fbb, c.num_inputs, &tensors)) return false;
  auto inputs = fbb.CreateVector(tensors);
  if (!ReadTensors(r, fbb, c.num_outputs, &tensors)) return false;
  auto outputs = fbb.CreateVector(tensors);
  w::CollectiveRecordBuilder cb(fbb);
  cb.add_communicator(c.communicator);
  cb.add_seq(c.seq);
  cb.add_phase(static_cast<w::CollectivePhase>(c.phase));
  cb.add_kind(static_cast<w::CollectiveKind>(c.kind));
  cb.add_dtype(static_cast<w::DType>(c.dtype));
  cb.add_count(c.count);
  cb.add_root(c.root);
  cb.add_reduce_op(c.reduce_op);
  cb.add_inputs(inputs);
  cb.add_outputs(outputs);
  cb.add_lane(c.lane);
  cb.add_op_index(c.op_index);
  cb.add_step(c.step);
  cb.add_site(c.site);
  cb.add_time_ns(c.time_ns);
  b.collectives.push_back(cb.Finish());
  return true;
}

// Reads a source file for SourceFile; false if unreadable or too large.
bool ReadSource(const std::string& path, uint32_t max_bytes, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  auto size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > max_bytes) return false;
  in.seekg(0);
  out->assign(static_cast<size_t>(size), '\0');
  in.read(out->data(), size);
  return static_cast<bool>(in);
}

}  // namespace

std::vector<EncodedBatch> BatchEncoder::Encode(const uint8_t* data, size_t size,
                                               const AnnounceInfo* announce, bool end_of_run,
                                               uint64_t* next_seq, EncodeStats* stats,
                                               size_t max_batches, size_t* consumed) {
  std::vector<EncodedBatch> out;
  if (consumed != nullptr) *consumed = size;
  // A full batch of typical records (~300 bytes each) fits the first buffer;
  // a smaller cut needs at most what it holds.
  const size_t expected = std::min<size_t>(size_t{batch_records_} * 384, 2 * size) + (16 << 10);
  auto builder = std::make_unique<Builder>(std::clamp<size_t>(expected, 4 << 10, 16 << 20));
  auto finish = [&](bool last) {
    const AnnounceInfo* a = out.empty() ? announce : nullptr;
    out.push_back(builder->Finish(id_, (*next_seq)++, a, last && end_of_run));
  };
  EntryReader entries(data, size);
  while (!entries.done()) {
    EntryHeader h;
    const uint8_t* start = entries.pos();
    if (!entries.Get(&h) || h.size < sizeof(EntryHeader) || h.size % 8 != 0 ||
        h.size > static_cast<size_t>(data + size - start)) {
      break;  // cannot happen unless the writer is broken; stop rather than misread
    }
    EntryReader r(start + sizeof(EntryHeader), h.size - sizeof(EntryHeader));
    entries = EntryReader(start + h.size, static_cast<size_t>(data + size - (start + h.size)));
    auto& fbb = builder->fbb();
    bool is_record = false;
    switch (h.kind) {
      case EntryKind::kOp:
        is_record = EncodeOp(r, *builder);
        break;
      case EntryKind::kCollective:
        is_record = EncodeCollective(r, *builder);
        break;
      case EntryKind::kString: {
        StringFixed s;
        std::string_view text;
        if (r.Get(&s) && r.GetBytes(s.len, &text)) {
          builder->strings.push_back(w::CreateStringDef(fbb, s.id, fbb.CreateString(text)));
        }
        break;
      }
      case EntryKind::kSite: {
        SiteFixed s;
        if (r.Get(&s)) builder->sites.push_back(w::CreateSiteDef(fbb, s.id, s.file, s.line, s.function));
        break;
      }
      case EntryKind::kCommunicator: {
        CommunicatorFixed c;
        std::string_view name;
        if (r.Get(&c) && r.GetBytes(c.name_len, &name)) {
          std::vector<uint32_t> members(c.num_ranks);
          std::string_view raw;
          if (r.GetBytes(size_t{c.num_ranks} * sizeof(uint32_t), &raw)) {
            if (!raw.empty()) std::memcpy(members.data(), raw.data(), raw.size());
            auto n = fbb.CreateString(name);
            auto m = fbb.CreateVector(members);
            builder->communicators.push_back(w::CreateCommunicatorDef(fbb, c.id, n, c.size, m));
          }
        }
        break;
      }
      case EntryKind::kStep: {
        StepFixed s;
        if (r.Get(&s)) builder->steps.push_back(w::CreateStepMark(fbb, s.step, s.lane, s.op_index, s.time_ns));
        break;
      }
      case EntryKind::kSource: {
        SourceFixed s;
        std::string_view bytes;
        if (r.Get(&s) && r.GetBytes(s.len, &bytes)) {
          std::string content;
          if (s.from_path != 0) {
            if (!ReadSource(std::string(bytes), max_source_bytes_, &content)) {
              if (stats != nullptr) ++stats->sources_skipped;
              break;
            }
            bytes = content;
          }
          auto v = fbb.CreateVector(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
          builder->sources.push_back(w::CreateSourceFile(fbb, s.file, v));
        }
        break;
      }
      case EntryKind::kGap: {
        GapFixed g;
        std::string_view reason;
        if (r.Get(&g) && r.GetBytes(g.reason_len, &reason)) {
          auto rs = fbb.CreateString(reason);
          w::GapNoticeBuilder gb(fbb);
          gb.add_lane(g.lane);
          gb.add_first_op(g.first_op);
          gb.add_last_op(g.last_op);
          gb.add_records_dropped(g.count);
          gb.add_reason(rs);
          builder->gaps.push_back(gb.Finish());
        }
        break;
      }
      case EntryKind::kCollectiveGap: {
        CollectiveGapFixed g;
        std::string_view reason;
        if (r.Get(&g) && r.GetBytes(g.reason_len, &reason)) {
          auto rs = fbb.CreateString(reason.empty() ? std::string_view("shim buffer full") : reason);
          w::GapNoticeBuilder gb(fbb);
          gb.add_records_dropped(g.count);
          gb.add_reason(rs);
          gb.add_communicator(g.communicator);
          gb.add_first_seq(g.first_seq);
          gb.add_last_seq(g.last_seq);
          builder->gaps.push_back(gb.Finish());
        }
        break;
      }
    }
    builder->CountEntry(is_record);
    if (builder->records() >= batch_records_) {
      finish(/*last=*/false);
      if (out.size() >= max_batches && !entries.done()) {
        if (consumed != nullptr) *consumed = static_cast<size_t>(entries.pos() - data);
        return out;
      }
    }
  }
  // end_of_run always gets its own final batch (empty if need be), so it is
  // never attached to a batch that was cut before the end was known.
  if (!builder->empty() || end_of_run || (announce != nullptr && out.empty())) {
    finish(/*last=*/true);
  }
  return out;
}

}  // namespace opguard::shim
