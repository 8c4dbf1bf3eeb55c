#include "record_copy.h"

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

}  // namespace opguard::daemon
