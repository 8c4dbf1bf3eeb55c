#include "record_copy.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace opguard::daemon {
namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

template <typename T>
Offset<flatbuffers::Vector<T>> CopyScalars(FlatBufferBuilder& b, const flatbuffers::Vector<T>* v) {
  if (v == nullptr) return 0;
  return b.CreateVector(v->data(), v->size());
}

Offset<wire::TensorStats> CopyStats(FlatBufferBuilder& b, const wire::TensorStats* s) {
  if (s == nullptr) return 0;
  wire::TensorStatsBuilder sb(b);
  sb.add_nan_count(s->nan_count());
  sb.add_inf_count(s->inf_count());
  sb.add_min(s->min());
  sb.add_max(s->max());
  sb.add_sum(s->sum());
  sb.add_l2(s->l2());
  return sb.Finish();
}

Offset<flatbuffers::Vector<Offset<wire::TensorSig>>> CopySigs(
    FlatBufferBuilder& b, const flatbuffers::Vector<Offset<wire::TensorSig>>* v) {
  if (v == nullptr) return 0;
  Offset<wire::TensorSig> stack[16];
  std::vector<Offset<wire::TensorSig>> heap;
  Offset<wire::TensorSig>* out = stack;
  if (v->size() > 16) {
    heap.resize(v->size());
    out = heap.data();
  }
  for (uint32_t i = 0; i < v->size(); ++i) out[i] = CopyTensorSig(b, v->Get(i));
  return b.CreateVector(out, v->size());
}

Offset<wire::Value> CopyValue(FlatBufferBuilder& b, const wire::Value* v) {
  auto tensor = v->tensor() ? CopyTensorSig(b, v->tensor()) : 0;
  auto tensors = CopySigs(b, v->tensors());
  wire::ValueBuilder vb(b);
  vb.add_scalar_bits(v->scalar_bits());
  if (!tensor.IsNull()) vb.add_tensor(tensor);
  if (!tensors.IsNull()) vb.add_tensors(tensors);
  vb.add_kind(v->kind());
  vb.add_scalar_dtype(v->scalar_dtype());
  return vb.Finish();
}

}  // namespace

Offset<wire::TensorSig> CopyTensorSig(FlatBufferBuilder& b, const wire::TensorSig* t) {
  auto shape = CopyScalars(b, t->shape());
  auto stats = CopyStats(b, t->stats());
  wire::TensorSigBuilder tb(b);
  if (t->fingerprint()) tb.add_fingerprint(t->fingerprint());
  if (!shape.IsNull()) tb.add_shape(shape);
  if (!stats.IsNull()) tb.add_stats(stats);
  tb.add_device(t->device());
  tb.add_dtype(t->dtype());
  return tb.Finish();
}

Offset<wire::OpRecord> CopyOpRecord(FlatBufferBuilder& b, const wire::OpRecord* op) {
  Offset<flatbuffers::Vector<Offset<wire::Value>>> inputs = 0;
  if (const auto* in = op->inputs()) {
    Offset<wire::Value> stack[16];
    std::vector<Offset<wire::Value>> heap;
    Offset<wire::Value>* out = stack;
    if (in->size() > 16) {
      heap.resize(in->size());
      out = heap.data();
    }
    for (uint32_t i = 0; i < in->size(); ++i) out[i] = CopyValue(b, in->Get(i));
    inputs = b.CreateVector(out, in->size());
  }
  auto outputs = CopySigs(b, op->outputs());
  auto kernels = CopyScalars(b, op->kernels());
  wire::OpRecordBuilder ob(b);
  ob.add_op_index(op->op_index());
  ob.add_step(op->step());
  ob.add_name(op->name());
  ob.add_site(op->site());
  ob.add_seq_nr(op->seq_nr());
  ob.add_start_ns(op->start_ns());
  ob.add_duration_ns(op->duration_ns());
  if (!inputs.IsNull()) ob.add_inputs(inputs);
  if (!outputs.IsNull()) ob.add_outputs(outputs);
  if (!kernels.IsNull()) ob.add_kernels(kernels);
  ob.add_lane(op->lane());
  ob.add_backward(op->backward());
  ob.add_nondeterministic(op->nondeterministic());
  ob.add_replicated(op->replicated());
  return ob.Finish();
}

Offset<wire::CollectiveRecord> CopyCollectiveRecord(FlatBufferBuilder& b,
                                                    const wire::CollectiveRecord* c) {
  auto inputs = CopySigs(b, c->inputs());
  auto outputs = CopySigs(b, c->outputs());
  wire::CollectiveRecordBuilder cb(b);
  cb.add_communicator(c->communicator());
  cb.add_seq(c->seq());
  cb.add_count(c->count());
  cb.add_op_index(c->op_index());
  cb.add_step(c->step());
  cb.add_site(c->site());
  cb.add_time_ns(c->time_ns());
  if (!inputs.IsNull()) cb.add_inputs(inputs);
  if (!outputs.IsNull()) cb.add_outputs(outputs);
  cb.add_root(c->root());
  cb.add_lane(c->lane());
  cb.add_phase(c->phase());
  cb.add_kind(c->kind());
  cb.add_dtype(c->dtype());
  cb.add_reduce_op(c->reduce_op());
  return cb.Finish();
}

Offset<wire::CommunicatorDef> CopyCommunicatorDef(FlatBufferBuilder& b,
                                                  const wire::CommunicatorDef* c) {
  auto name = c->name() ? b.CreateString(c->name()) : 0;
  auto ranks = CopyScalars(b, c->ranks());
  wire::CommunicatorDefBuilder cb(b);
  cb.add_id(c->id());
  if (!name.IsNull()) cb.add_name(name);
  if (!ranks.IsNull()) cb.add_ranks(ranks);
  cb.add_size(c->size());
  return cb.Finish();
}

Offset<wire::GapNotice> CopyGapNotice(FlatBufferBuilder& b, const wire::GapNotice* g) {
  auto reason = g->reason() ? b.CreateString(g->reason()) : 0;
  wire::GapNoticeBuilder gb(b);
  gb.add_first_op(g->first_op());
  gb.add_last_op(g->last_op());
  gb.add_records_dropped(g->records_dropped());
  gb.add_communicator(g->communicator());
  gb.add_first_seq(g->first_seq());
  gb.add_last_seq(g->last_seq());
  if (!reason.IsNull()) gb.add_reason(reason);
  gb.add_lane(g->lane());
  return gb.Finish();
}

// ---- ops chunks ---------------------------------------------------------------

namespace {

constexpr char kChunkMagic[4] = {'O', 'G', 'C', '1'};
constexpr char kPackedMagic[4] = {'O', 'G', 'Z', '1'};
constexpr size_t kChunkHeader = 8;    // magic | count
constexpr size_t kChunkEntry = 16;    // op_index | offset | size
constexpr size_t kPackedHeader = 12;  // magic | codec | raw size
// Larger than any chunk ingest writes (at most kOpChunkMaxBytes plus one
// record of at most ingest.max_message_bytes): a bound on what a damaged
// header can make a reader allocate.
constexpr uint32_t kMaxRawChunk = 1u << 30;
// ZSTD level for ChunkCodec::kZstd: the fastest regular level (ingest runs it
// on every chunk, on the daemon's one ingest thread).
constexpr int kZstdLevel = 1;

void PutLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutLe64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t GetLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{u[0]} | (uint32_t{u[1]} << 8) | (uint32_t{u[2]} << 16) | (uint32_t{u[3]} << 24);
}
uint64_t GetLe64(const char* p) { return uint64_t{GetLe32(p)} | (uint64_t{GetLe32(p + 4)} << 32); }

constexpr size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }

bool IsPlainChunk(std::string_view value) {
  return value.size() >= kChunkHeader && std::memcmp(value.data(), kChunkMagic, 4) == 0;
}
bool IsPackedChunk(std::string_view value) {
  return value.size() >= kPackedHeader && std::memcmp(value.data(), kPackedMagic, 4) == 0;
}

}  // namespace

bool IsOpChunk(std::string_view value) { return IsPlainChunk(value) || IsPackedChunk(value); }

ChunkCodec ChunkCodecByName(const std::string& name) {
  if (name == "lz4" || name == "snappy") return ChunkCodec::kLz4;
  if (name == "zstd") return ChunkCodec::kZstd;
  return ChunkCodec::kNone;
}

struct OpChunkWriter::Codecs {
  std::vector<uint64_t> lz4_state;  // LZ4_sizeofState() bytes, 8-aligned
  ZSTD_CCtx* zstd = nullptr;
  ~Codecs() { ZSTD_freeCCtx(zstd); }
};

OpChunkWriter::OpChunkWriter() : records_(kHeadRoom, '\0') {
  static_assert(kHeadRoom == Align8(kChunkHeader + kChunkEntry * kOpChunkMaxRecords));
}
OpChunkWriter::~OpChunkWriter() = default;
OpChunkWriter::OpChunkWriter(OpChunkWriter&&) noexcept = default;
OpChunkWriter& OpChunkWriter::operator=(OpChunkWriter&&) noexcept = default;

void OpChunkWriter::Clear() {
  entries_.clear();
  records_.resize(kHeadRoom);
}

void OpChunkWriter::Add(uint64_t op_index, const uint8_t* data, size_t size) {
  uint8_t* p = Reserve(op_index, size);
  if (size != 0) std::memcpy(p, data, size);
}

uint8_t* OpChunkWriter::Reserve(uint64_t op_index, size_t size) {
  const size_t at = records_.size();
  entries_.push_back(
      {op_index, static_cast<uint32_t>(at - kHeadRoom), static_cast<uint32_t>(size)});
  records_.resize(Align8(at + size), '\0');
  return reinterpret_cast<uint8_t*>(records_.data() + at);
}

std::string_view OpChunkWriter::Finish(ChunkCodec codec) {
  const size_t head = Align8(kChunkHeader + kChunkEntry * entries_.size());
  const size_t body = record_bytes();
  char* p = nullptr;
  if (head <= kHeadRoom) {
    p = records_.data() + (kHeadRoom - head);  // both multiples of 8: records keep their phase
  } else {  // more entries than Accepts() lets in: copy behind a header
    out_.resize(head + body);
    p = out_.data();
    std::memcpy(p + head, records_.data() + kHeadRoom, body);
  }
  std::memcpy(p, kChunkMagic, 4);
  PutLe32(p + 4, static_cast<uint32_t>(entries_.size()));
  char* e = p + kChunkHeader;
  for (const Entry& entry : entries_) {
    PutLe64(e, entry.op_index);
    PutLe32(e + 8, static_cast<uint32_t>(head + entry.offset));
    PutLe32(e + 12, entry.size);
    e += kChunkEntry;
  }
  std::memset(e, 0, static_cast<size_t>(p + head - e));
  const std::string_view raw(p, head + body);
  if (codec == ChunkCodec::kNone || raw.size() > kMaxRawChunk) return raw;

  if (!codecs_) codecs_ = std::make_unique<Codecs>();
  size_t bound = 0;
  if (codec == ChunkCodec::kLz4) {
    bound = static_cast<size_t>(LZ4_compressBound(static_cast<int>(raw.size())));
  } else {
    bound = ZSTD_compressBound(raw.size());
  }
  packed_.resize(kPackedHeader + bound);
  char* q = packed_.data();
  std::memcpy(q, kPackedMagic, 4);
  PutLe32(q + 4, static_cast<uint32_t>(codec));
  PutLe32(q + 8, static_cast<uint32_t>(raw.size()));
  size_t packed = 0;
  if (codec == ChunkCodec::kLz4) {
    if (codecs_->lz4_state.empty()) {
      codecs_->lz4_state.resize((static_cast<size_t>(LZ4_sizeofState()) + 7) / 8);
    }
    const int n =
        LZ4_compress_fast_extState(codecs_->lz4_state.data(), raw.data(), q + kPackedHeader,
                                   static_cast<int>(raw.size()), static_cast<int>(bound), 1);
    packed = n > 0 ? static_cast<size_t>(n) : 0;
  } else {
    if (codecs_->zstd == nullptr) codecs_->zstd = ZSTD_createCCtx();
    const size_t n = codecs_->zstd == nullptr
                         ? 0
                         : ZSTD_compressCCtx(codecs_->zstd, q + kPackedHeader, bound, raw.data(),
                                             raw.size(), kZstdLevel);
    packed = ZSTD_isError(n) ? 0 : n;
  }
  if (packed == 0) return raw;  // cannot happen with a bound-sized buffer; store it plain
  packed_.resize(kPackedHeader + packed);
  return packed_;
}

namespace {

// Decompresses a packed chunk into `storage` (8-aligned); false if damaged.
bool Unpack(std::string_view value, std::vector<uint64_t>* storage, size_t* raw_size) {
  const uint32_t codec = GetLe32(value.data() + 4);
  const uint32_t raw = GetLe32(value.data() + 8);
  if (raw < kChunkHeader || raw > kMaxRawChunk) return false;
  storage->resize((raw + 7) / 8);
  char* dst = reinterpret_cast<char*>(storage->data());
  const char* src = value.data() + kPackedHeader;
  const size_t src_size = value.size() - kPackedHeader;
  if (codec == static_cast<uint32_t>(ChunkCodec::kLz4)) {
    if (src_size > static_cast<size_t>(INT32_MAX)) return false;
    const int n = LZ4_decompress_safe(src, dst, static_cast<int>(src_size), static_cast<int>(raw));
    if (n < 0 || static_cast<uint32_t>(n) != raw) return false;
  } else if (codec == static_cast<uint32_t>(ChunkCodec::kZstd)) {
    thread_local std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(),
                                                                         ZSTD_freeDCtx);
    if (!dctx) return false;
    const size_t n = ZSTD_decompressDCtx(dctx.get(), dst, raw, src, src_size);
    if (ZSTD_isError(n) || n != raw) return false;
  } else {
    return false;
  }
  *raw_size = raw;
  return true;
}

}  // namespace

bool OpChunkView::Open(uint64_t key_op, std::string_view value, bool copy) {
  ops_.clear();
  records_.clear();
  const char* data = value.data();
  if (IsPackedChunk(value)) {
    size_t raw = 0;
    if (!Unpack(value, &storage_, &raw)) return false;
    data = reinterpret_cast<const char*>(storage_.data());
    value = std::string_view(data, raw);
    if (!IsPlainChunk(value)) return false;
  } else if (copy || reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    storage_.resize((value.size() + 7) / 8);
    if (!value.empty()) std::memcpy(storage_.data(), value.data(), value.size());
    data = reinterpret_cast<const char*>(storage_.data());
  }
  if (!IsPlainChunk(value)) {
    ops_.push_back(key_op);
    records_.emplace_back(data, value.size());
    return true;
  }
  const uint32_t count = GetLe32(data + 4);
  if (count == 0 || count > (value.size() - kChunkHeader) / kChunkEntry) return false;
  ops_.reserve(count);
  records_.reserve(count);
  const char* e = data + kChunkHeader;
  for (uint32_t i = 0; i < count; ++i, e += kChunkEntry) {
    const uint64_t op = GetLe64(e);
    const uint32_t offset = GetLe32(e + 8), size = GetLe32(e + 12);
    if (offset % 8 != 0 || offset > value.size() || size > value.size() - offset) return false;
    if (!ops_.empty() && op <= ops_.back()) return false;
    ops_.push_back(op);
    records_.emplace_back(data + offset, size);
  }
  // The key is the last op of the chunk; anything else is not a chunk we wrote.
  return ops_.back() == key_op;
}

size_t OpChunkView::LowerBound(uint64_t op) const {
  return static_cast<size_t>(std::lower_bound(ops_.begin(), ops_.end(), op) - ops_.begin());
}

// ---- copying a record's bytes -------------------------------------------------

namespace {

// Byte size of each field of the tables a record is made of, in vtable
// order (field k has vtable offset 4 + 2k). Offsets (tables, vectors) are 4.
// Field types never change (common.fbs rules); a field appended to one of
// these tables is not listed, so records that set it are rebuilt instead.
constexpr uint8_t kTensorStatsFields[] = {8, 8, 8, 8, 8, 8};
constexpr uint8_t kTensorSigFields[] = {16, 1, 4, 4, 2};
constexpr uint8_t kValueFields[] = {1, 4, 8, 1, 4};
constexpr uint8_t kOpRecordFields[] = {4, 8, 8, 8, 8, 8, 1, 4, 4, 4, 8, 8, 1, 1};
static_assert(wire::TensorStats::VT_L2 == 4 + 2 * (sizeof(kTensorStatsFields) - 1));
static_assert(wire::TensorSig::VT_DEVICE == 4 + 2 * (sizeof(kTensorSigFields) - 1));
static_assert(wire::Value::VT_TENSORS == 4 + 2 * (sizeof(kValueFields) - 1));
static_assert(wire::OpRecord::VT_REPLICATED == 4 + 2 * (sizeof(kOpRecordFields) - 1));

// The parts of one record inside a verified buffer: every table (its vtable
// offset and each field it sets, not the padding around them), vtable and
// vector reachable from the OpRecord.
class RecordParts {
 public:
  static constexpr size_t kMaxTables = 64;

  explicit RecordParts(const uint8_t* end) : end_(end) {}

  // False when the table sets a field not in `fields`, or the record has too
  // many tables.
  template <size_t N>
  bool Table(const void* table, const uint8_t (&fields)[N]) {
    const auto* t = static_cast<const uint8_t*>(table);
    const uint8_t* vt = t - flatbuffers::ReadScalar<flatbuffers::soffset_t>(t);
    const auto vt_size = flatbuffers::ReadScalar<flatbuffers::voffset_t>(vt);
    if (vt_size < 4 || tables_n_ == kMaxTables) return false;
    tables_[tables_n_] = t;
    vtables_[tables_n_] = vt;
    ++tables_n_;
    Data(t, sizeof(flatbuffers::soffset_t));
    for (size_t o = 4; o + 2 <= vt_size; o += 2) {
      const auto at = flatbuffers::ReadScalar<flatbuffers::voffset_t>(vt + o);
      if (at == 0) continue;
      const size_t k = (o - 4) / 2;
      if (k >= N) return false;
      Data(t + at, fields[k]);
    }
    return ok_;
  }
  template <typename T>
  void Vector(const flatbuffers::Vector<T>* v, size_t element_size) {
    Data(reinterpret_cast<const uint8_t*>(v),
         sizeof(flatbuffers::uoffset_t) + v->size() * element_size);
  }

  bool ok() const { return ok_; }
  size_t tables() const { return tables_n_; }
  const uint8_t* table(size_t i) const { return tables_[i]; }
  const uint8_t* vtable(size_t i) const { return vtables_[i]; }
  const uint8_t* lo() const { return lo_; }
  const uint8_t* hi() const { return hi_; }
  size_t data_bytes() const { return bytes_; }

 private:
  void Data(const uint8_t* p, size_t n) {
    // The Verifier checked every part this walk visits, but not that a
    // field lies inside its table's inline size: stay inside the buffer.
    if (p > end_ || n > static_cast<size_t>(end_ - p)) ok_ = false;
    lo_ = std::min(lo_, p);
    hi_ = std::max(hi_, p + n);
    bytes_ += n;
  }

  const uint8_t* end_;
  bool ok_ = true;
  const uint8_t* tables_[kMaxTables];
  const uint8_t* vtables_[kMaxTables];
  size_t tables_n_ = 0;
  const uint8_t* lo_ = reinterpret_cast<const uint8_t*>(UINTPTR_MAX);
  const uint8_t* hi_ = nullptr;
  size_t bytes_ = 0;
};

bool WalkSig(RecordParts& p, const wire::TensorSig* t) {
  if (!p.Table(t, kTensorSigFields)) return false;
  if (const auto* shape = t->shape()) p.Vector(shape, sizeof(int64_t));
  if (const auto* stats = t->stats()) return p.Table(stats, kTensorStatsFields);
  return true;
}

bool WalkSigs(RecordParts& p, const flatbuffers::Vector<flatbuffers::Offset<wire::TensorSig>>* v) {
  if (v == nullptr) return true;
  p.Vector(v, sizeof(flatbuffers::uoffset_t));
  for (uint32_t i = 0; i < v->size(); ++i) {
    if (!WalkSig(p, v->Get(i))) return false;
  }
  return true;
}

bool WalkOp(RecordParts& p, const wire::OpRecord* op) {
  if (!p.Table(op, kOpRecordFields)) return false;
  if (const auto* in = op->inputs()) {
    p.Vector(in, sizeof(flatbuffers::uoffset_t));
    for (uint32_t i = 0; i < in->size(); ++i) {
      const wire::Value* v = in->Get(i);
      if (!p.Table(v, kValueFields)) return false;
      if (const auto* t = v->tensor(); t != nullptr && !WalkSig(p, t)) return false;
      if (!WalkSigs(p, v->tensors())) return false;
    }
  }
  if (!WalkSigs(p, op->outputs())) return false;
  if (const auto* k = op->kernels()) p.Vector(k, sizeof(uint64_t));
  return p.ok();
}

}  // namespace

bool AddOpRecordBytes(OpChunkWriter* w, const uint8_t* buffer, size_t size,
                      const wire::OpRecord* op) {
  RecordParts parts(buffer + size);
  if (!WalkOp(parts, op)) return false;
  const uint8_t* lo = parts.lo();
  const size_t span = static_cast<size_t>(parts.hi() - lo);
  // Compact: the span holds little besides the record (its own vtables,
  // padding). Records a builder interleaved with others are rebuilt instead.
  if (span > 2 * parts.data_bytes() + 64) return false;

  // Vtables outside the span (shared with earlier records) go in front of it,
  // each once.
  auto inside = [&](const uint8_t* vt) {
    return vt >= lo && vt + flatbuffers::ReadScalar<flatbuffers::voffset_t>(vt) <= lo + span;
  };
  const uint8_t* moved[RecordParts::kMaxTables];
  size_t moved_at[RecordParts::kMaxTables];
  size_t moved_n = 0;
  size_t pos = sizeof(flatbuffers::uoffset_t);  // after the root offset
  for (size_t i = 0; i < parts.tables(); ++i) {
    const uint8_t* vt = parts.vtable(i);
    if (inside(vt)) continue;
    size_t j = 0;
    while (j < moved_n && moved[j] != vt) ++j;
    if (j < moved_n) continue;
    moved[moved_n] = vt;
    moved_at[moved_n] = pos;
    ++moved_n;
    pos += flatbuffers::ReadScalar<flatbuffers::voffset_t>(vt);
  }
  // The span keeps its 8-byte phase relative to the buffer start, so every
  // scalar stays aligned as the Verifier requires.
  const size_t phase = static_cast<size_t>(lo - buffer) % 8;
  const size_t start = pos + ((phase + 8 - pos % 8) % 8);
  const size_t total = start + span;
  if (total > UINT32_MAX) return false;

  uint8_t* out = w->Reserve(op->op_index(), total);
  for (size_t j = 0; j < moved_n; ++j) {
    std::memcpy(out + moved_at[j], moved[j],
                flatbuffers::ReadScalar<flatbuffers::voffset_t>(moved[j]));
  }
  std::memset(out + pos, 0, start - pos);
  std::memcpy(out + start, lo, span);
  for (size_t i = 0; i < parts.tables(); ++i) {
    const uint8_t* vt = parts.vtable(i);
    if (inside(vt)) continue;  // copied along with the span
    size_t j = 0;
    while (moved[j] != vt) ++j;
    const size_t table_at = start + static_cast<size_t>(parts.table(i) - lo);
    flatbuffers::WriteScalar<flatbuffers::soffset_t>(
        out + table_at, static_cast<flatbuffers::soffset_t>(table_at - moved_at[j]));
  }
  flatbuffers::WriteScalar<flatbuffers::uoffset_t>(
      out, static_cast<flatbuffers::uoffset_t>(
               start + static_cast<size_t>(reinterpret_cast<const uint8_t*>(op) - lo)));
  return true;
}

}  // namespace opguard::daemon
