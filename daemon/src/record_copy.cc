#include "record_copy.h"

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
constexpr size_t kChunkHeader = 8;  // magic | count
constexpr size_t kChunkEntry = 16;  // op_index | offset | size

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

size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }

}  // namespace

bool IsOpChunk(std::string_view value) {
  return value.size() >= kChunkHeader && std::memcmp(value.data(), kChunkMagic, 4) == 0;
}

void OpChunkWriter::Clear() {
  entries_.clear();
  records_.clear();
}

void OpChunkWriter::Add(uint64_t op_index, const uint8_t* data, size_t size) {
  entries_.push_back(
      {op_index, static_cast<uint32_t>(records_.size()), static_cast<uint32_t>(size)});
  records_.append(reinterpret_cast<const char*>(data), size);
  records_.resize(Align8(records_.size()), '\0');
}

std::string_view OpChunkWriter::Finish() {
  const size_t head = Align8(kChunkHeader + kChunkEntry * entries_.size());
  out_.resize(head + records_.size());
  char* p = out_.data();
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
  std::memcpy(p + head, records_.data(), records_.size());
  return out_;
}

bool OpChunkView::Open(uint64_t key_op, std::string_view value, bool copy) {
  ops_.clear();
  records_.clear();
  const char* data = value.data();
  if (copy || reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    storage_.resize((value.size() + 7) / 8);
    if (!value.empty()) std::memcpy(storage_.data(), value.data(), value.size());
    data = reinterpret_cast<const char*>(storage_.data());
  }
  if (!IsOpChunk(value)) {
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

}  // namespace opguard::daemon
