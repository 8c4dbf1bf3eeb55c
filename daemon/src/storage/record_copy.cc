#include "storage/record_copy.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "opguard/common/utf8.h"

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
  ob.add_forward_site(op->forward_site());
  ob.add_trusted(op->trusted());
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
  std::string repaired;  // text that is not UTF-8 is stored repaired (ingest.cc)
  auto name = c->name() ? b.CreateString(RepairedUtf8(c->name()->string_view(), &repaired)) : 0;
  auto ranks = CopyScalars(b, c->ranks());
  wire::CommunicatorDefBuilder cb(b);
  cb.add_id(c->id());
  if (!name.IsNull()) cb.add_name(name);
  if (!ranks.IsNull()) cb.add_ranks(ranks);
  cb.add_size(c->size());
  return cb.Finish();
}

Offset<wire::GapNotice> CopyGapNotice(FlatBufferBuilder& b, const wire::GapNotice* g) {
  std::string repaired;
  auto reason = g->reason() ? b.CreateString(RepairedUtf8(g->reason()->string_view(), &repaired)) : 0;
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

// ---- copying a record's bytes -------------------------------------------------

namespace {

// Byte size of each field of the tables a record is made of, in vtable
// order (field k has vtable offset 4 + 2k). Offsets (tables, vectors) are 4.
// Field types never change (common.fbs rules); a field appended to one of
// these tables is not listed, so records that set it are rebuilt instead.
constexpr uint8_t kTensorStatsFields[] = {8, 8, 8, 8, 8, 8};
constexpr uint8_t kTensorSigFields[] = {16, 1, 4, 4, 2};
constexpr uint8_t kValueFields[] = {1, 4, 8, 1, 4};
constexpr uint8_t kOpRecordFields[] = {4, 8, 8, 8, 8, 8, 1, 4, 4, 4, 8, 8, 1, 1, 8, 1};
static_assert(wire::TensorStats::VT_L2 == 4 + 2 * (sizeof(kTensorStatsFields) - 1));
static_assert(wire::TensorSig::VT_DEVICE == 4 + 2 * (sizeof(kTensorSigFields) - 1));
static_assert(wire::Value::VT_TENSORS == 4 + 2 * (sizeof(kValueFields) - 1));
static_assert(wire::OpRecord::VT_TRUSTED == 4 + 2 * (sizeof(kOpRecordFields) - 1));

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
