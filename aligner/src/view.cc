#include "view.h"

#include <cstdio>

namespace opguard::aligner {
namespace {

TensorView ToView(const TensorInfo& t) {
  return TensorView{t.fingerprint, DTypeName(t.dtype), t.shape, t.stats};
}

const char* KindName(ValueKind k) {
  switch (k) {
    case ValueKind::kTensor: return "tensor";
    case ValueKind::kScalar: return "scalar";
    case ValueKind::kTensorList: return "tensor_list";
    case ValueKind::kNone: break;
  }
  return "none";
}

}  // namespace

std::string ResolveString(const StringResolver* strings, uint64_t id) {
  if (strings != nullptr) {
    if (auto s = strings->String(id)) return *s;
  }
  // Unknown ids stay visible and greppable rather than silently empty.
  char buf[24];
  std::snprintf(buf, sizeof buf, "#%016llx", static_cast<unsigned long long>(id));
  return buf;
}

SiteInfo ResolveSite(const StringResolver* strings, uint64_t site_id) {
  SiteInfo site;
  site.id = site_id;
  if (site_id == 0 || strings == nullptr) return site;
  if (auto s = strings->SiteOf(site_id)) {
    site.file = ResolveString(strings, s->file);
    site.line = s->line;
    site.function = ResolveString(strings, s->function);
  }
  return site;
}

OpView MakeOpView(uint32_t rank, uint32_t lane, const OpEvent& e, const DetailSource* details,
                  const StringResolver* strings) {
  OpView v;
  v.rank = rank;
  v.lane = lane;
  v.op_index = e.op_index;
  v.step = e.step;
  v.op = ResolveString(strings, e.name);
  v.site = ResolveSite(strings, e.site);
  v.output_digest = e.outputs;
  v.input_digest = e.inputs;
  v.trusted = e.trusted();
  if (details == nullptr) return v;
  std::optional<OpDetail> d = details->Find(rank, lane, e.op_index);
  if (!d) return v;
  v.detail_available = true;
  v.seq_nr = d->seq_nr;
  v.backward = d->backward;
  v.forward_site = ResolveSite(strings, d->forward_site);
  v.start_ns = d->start_ns;
  for (const TensorInfo& t : d->outputs) v.outputs.push_back(ToView(t));
  for (const InputValue& in : d->inputs) {
    InputView iv;
    iv.kind = KindName(in.kind);
    if (in.kind == ValueKind::kTensor) iv.tensors.push_back(ToView(in.tensor));
    if (in.kind == ValueKind::kTensorList) {
      for (const TensorInfo& t : in.tensors) iv.tensors.push_back(ToView(t));
    }
    if (in.kind == ValueKind::kScalar) {
      iv.scalar_bits = in.scalar_bits;
      iv.scalar_dtype = DTypeName(in.scalar_dtype);
    }
    v.inputs.push_back(std::move(iv));
  }
  for (uint64_t k : d->kernels) v.kernels.push_back(ResolveString(strings, k));
  return v;
}

}  // namespace opguard::aligner
