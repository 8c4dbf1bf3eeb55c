#include "opguard/daemon/report_wire.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "opguard/aligner/render.h"

namespace opguard::daemon {
namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

template <typename T>
std::vector<T> Vec(const flatbuffers::Vector<T>* v) {
  return v ? std::vector<T>(v->begin(), v->end()) : std::vector<T>();
}

Offset<flatbuffers::Vector<Offset<flatbuffers::String>>> Strings(
    FlatBufferBuilder& b, const std::vector<std::string>& v) {
  std::vector<Offset<flatbuffers::String>> out;
  out.reserve(v.size());
  for (const auto& s : v) out.push_back(b.CreateString(s));
  return b.CreateVector(out);
}

std::vector<std::string> StringsFrom(const flatbuffers::Vector<Offset<flatbuffers::String>>* v) {
  std::vector<std::string> out;
  if (v) {
    for (const auto* s : *v) out.push_back(Str(s));
  }
  return out;
}

wire::Fp128 Fp(const aligner::Fp128& f) { return wire::Fp128(f.lo, f.hi); }
aligner::Fp128 Fp(const wire::Fp128* f) {
  return f ? aligner::Fp128{f->lo(), f->hi()} : aligner::Fp128{};
}

// ---- report views ------------------------------------------------------------

Offset<wire::SiteView> SiteToWire(FlatBufferBuilder& b, const aligner::SiteInfo& s) {
  auto file = b.CreateString(s.file);
  auto function = b.CreateString(s.function);
  return wire::CreateSiteView(b, s.id, file, s.line, function);
}

aligner::SiteInfo SiteFromWire(const wire::SiteView* w) {
  aligner::SiteInfo s;
  if (w == nullptr) return s;
  s.id = w->id();
  s.file = Str(w->file());
  s.line = w->line();
  s.function = Str(w->function());
  return s;
}

Offset<wire::TensorView> TensorToWire(FlatBufferBuilder& b, const aligner::TensorView& t) {
  auto dtype = b.CreateString(t.dtype);
  auto shape = b.CreateVector(t.shape);
  Offset<wire::TensorStats> stats;
  if (t.stats) {
    stats = wire::CreateTensorStats(b, t.stats->nan_count, t.stats->inf_count, t.stats->min,
                                    t.stats->max, t.stats->sum, t.stats->l2);
  }
  wire::Fp128 fp = Fp(t.fingerprint);
  return wire::CreateTensorView(b, &fp, dtype, shape, stats);
}

aligner::TensorView TensorFromWire(const wire::TensorView* w) {
  aligner::TensorView t;
  if (w == nullptr) return t;
  t.fingerprint = Fp(w->fingerprint());
  t.dtype = Str(w->dtype());
  t.shape = Vec(w->shape());
  if (const auto* s = w->stats()) {
    t.stats =
        aligner::TensorStats{s->nan_count(), s->inf_count(), s->min(), s->max(), s->sum(), s->l2()};
  }
  return t;
}

Offset<flatbuffers::Vector<Offset<wire::TensorView>>> TensorsToWire(
    FlatBufferBuilder& b, const std::vector<aligner::TensorView>& v) {
  std::vector<Offset<wire::TensorView>> out;
  for (const auto& t : v) out.push_back(TensorToWire(b, t));
  return b.CreateVector(out);
}

std::vector<aligner::TensorView> TensorsFromWire(
    const flatbuffers::Vector<Offset<wire::TensorView>>* v) {
  std::vector<aligner::TensorView> out;
  if (v) {
    for (const auto* t : *v) out.push_back(TensorFromWire(t));
  }
  return out;
}

Offset<wire::OpView> OpViewToWire(FlatBufferBuilder& b, const aligner::OpView& v) {
  auto op = b.CreateString(v.op);
  auto site = SiteToWire(b, v.site);
  auto forward_site = SiteToWire(b, v.forward_site);
  auto outputs = TensorsToWire(b, v.outputs);
  std::vector<Offset<wire::InputView>> inputs;
  for (const auto& in : v.inputs) {
    auto kind = b.CreateString(in.kind);
    auto tensors = TensorsToWire(b, in.tensors);
    auto scalar_dtype = b.CreateString(in.scalar_dtype);
    inputs.push_back(wire::CreateInputView(b, kind, tensors, in.scalar_bits, scalar_dtype));
  }
  auto inputs_vec = b.CreateVector(inputs);
  auto kernels = Strings(b, v.kernels);
  wire::Fp128 od = Fp(v.output_digest), id = Fp(v.input_digest);
  return wire::CreateOpView(b, v.rank, v.lane, v.op_index, v.step, op, site, v.seq_nr, v.backward,
                            v.start_ns, v.detail_available, outputs, inputs_vec, kernels, &od, &id,
                            forward_site, v.trusted);
}

aligner::OpView OpViewFromWire(const wire::OpView* w) {
  aligner::OpView v;
  if (w == nullptr) return v;
  v.rank = w->rank();
  v.lane = w->lane();
  v.op_index = w->op_index();
  v.step = w->step();
  v.op = Str(w->op());
  v.site = SiteFromWire(w->site());
  v.forward_site = SiteFromWire(w->forward_site());
  v.seq_nr = w->seq_nr();
  v.backward = w->backward();
  v.start_ns = w->start_ns();
  v.detail_available = w->detail_available();
  v.trusted = w->trusted();
  v.outputs = TensorsFromWire(w->outputs());
  if (w->inputs()) {
    for (const auto* in : *w->inputs()) {
      aligner::InputView iv;
      iv.kind = Str(in->kind());
      iv.tensors = TensorsFromWire(in->tensors());
      iv.scalar_bits = in->scalar_bits();
      iv.scalar_dtype = Str(in->scalar_dtype());
      v.inputs.push_back(std::move(iv));
    }
  }
  v.kernels = StringsFrom(w->kernels());
  v.output_digest = Fp(w->output_digest());
  v.input_digest = Fp(w->input_digest());
  return v;
}

Offset<wire::FirstDivergence> FirstToWire(FlatBufferBuilder& b,
                                          const std::optional<aligner::FirstDivergence>& f) {
  if (!f) return 0;
  auto op = b.CreateString(f->op);
  auto ref = OpViewToWire(b, f->reference);
  auto sus = OpViewToWire(b, f->suspect);
  auto differing = b.CreateVector(f->differing_outputs);
  auto producer = f->producer ? OpViewToWire(b, *f->producer) : Offset<wire::OpView>();
  auto producer_run = b.CreateString(f->producer_run);
  auto candidate = f->trusted_candidate ? OpViewToWire(b, *f->trusted_candidate) : Offset<wire::OpView>();
  return wire::CreateFirstDivergence(b, f->rank, f->lane, f->step, op, ref, sus, f->inputs_equal,
                                     differing, producer, producer_run, f->trusted_before, candidate,
                                     f->code_changed);
}

std::optional<aligner::FirstDivergence> FirstFromWire(const wire::FirstDivergence* w) {
  if (w == nullptr) return std::nullopt;
  aligner::FirstDivergence f;
  f.rank = w->rank();
  f.lane = w->lane();
  f.step = w->step();
  f.op = Str(w->op());
  f.reference = OpViewFromWire(w->reference());
  f.suspect = OpViewFromWire(w->suspect());
  f.inputs_equal = w->inputs_equal();
  f.code_changed = w->code_changed();
  f.differing_outputs = Vec(w->differing_outputs());
  if (w->producer() != nullptr) f.producer = OpViewFromWire(w->producer());
  f.producer_run = Str(w->producer_run());
  f.trusted_before = w->trusted_before();
  if (w->trusted_candidate() != nullptr) f.trusted_candidate = OpViewFromWire(w->trusted_candidate());
  return f;
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

}  // namespace

wire::DiffStatus StatusToWire(aligner::DiffStatus s) { return static_cast<wire::DiffStatus>(s); }

aligner::DiffStatus StatusFromWire(wire::DiffStatus s) {
  auto v = static_cast<uint8_t>(s);
  return v <= static_cast<uint8_t>(aligner::DiffStatus::kPartial)
             ? static_cast<aligner::DiffStatus>(v)
             : aligner::DiffStatus::kPartial;
}

Offset<wire::RankDiff> RankDiffToWire(FlatBufferBuilder& b, const aligner::RankDiff& d) {
  auto first = FirstToWire(b, d.first_divergence);
  auto observed = FirstToWire(b, d.first_observed);
  std::vector<Offset<wire::MissingRange>> missing;
  for (const auto& m : d.missing) {
    missing.push_back(
        wire::CreateMissingRange(b, b.CreateString(m.run), m.rank, m.lane, m.first_op, m.last_op));
  }
  auto missing_vec = b.CreateVector(missing);
  std::vector<Offset<wire::LaneDiff>> lanes;
  for (const auto& l : d.lanes) {
    lanes.push_back(wire::CreateLaneDiff(b, l.lane, StatusToWire(l.status), l.ref_ops, l.sus_ops,
                                         l.aligned, l.reordered, l.unaligned_ref, l.unaligned_sus,
                                         l.pivot_ref_op.has_value(), l.pivot_ref_op.value_or(0),
                                         l.pivot_sus_op.value_or(0), l.largest_window, l.degraded));
  }
  auto lanes_vec = b.CreateVector(lanes);
  auto notes = Strings(b, d.notes);
  std::vector<wire::CommPosition> comms;
  for (const auto& c : d.summary.comms)
    comms.emplace_back(c.communicator, c.last_seq_before, c.first_seq_after);
  auto summary = wire::CreateDivergenceSummary(b, d.summary.rank, StatusToWire(d.summary.status),
                                               d.summary.lane, d.summary.step, d.summary.op_index,
                                               b.CreateVectorOfStructs(comms));
  return wire::CreateRankDiff(
      b, d.rank, StatusToWire(d.status), first, observed, d.aligned, d.aligned_total,
      d.unaligned_before_ref, d.unaligned_before_sus, d.unaligned_total_ref, d.unaligned_total_sus,
      d.skipped_nondeterministic, d.reordered, missing_vec, lanes_vec, notes, summary, d.skipped_trusted);
}

aligner::RankDiff RankDiffFromWire(const wire::RankDiff& w) {
  aligner::RankDiff d;
  d.rank = w.rank();
  d.status = StatusFromWire(w.status());
  d.first_divergence = FirstFromWire(w.first_divergence());
  d.first_observed = FirstFromWire(w.first_observed());
  d.aligned = w.aligned();
  d.aligned_total = w.aligned_total();
  d.unaligned_before_ref = w.unaligned_before_ref();
  d.unaligned_before_sus = w.unaligned_before_sus();
  d.unaligned_total_ref = w.unaligned_total_ref();
  d.unaligned_total_sus = w.unaligned_total_sus();
  d.skipped_nondeterministic = w.skipped_nondeterministic();
  d.skipped_trusted = w.skipped_trusted();
  d.reordered = w.reordered();
  if (w.missing()) {
    for (const auto* m : *w.missing()) {
      d.missing.push_back({Str(m->run()), m->rank(), m->lane(), m->first_op(), m->last_op()});
    }
  }
  if (w.lanes()) {
    for (const auto* l : *w.lanes()) {
      aligner::LaneDiff ld;
      ld.lane = l->lane();
      ld.status = StatusFromWire(l->status());
      ld.ref_ops = l->ref_ops();
      ld.sus_ops = l->sus_ops();
      ld.aligned = l->aligned();
      ld.reordered = l->reordered();
      ld.unaligned_ref = l->unaligned_ref();
      ld.unaligned_sus = l->unaligned_sus();
      if (l->has_pivot()) {
        ld.pivot_ref_op = l->pivot_ref_op();
        ld.pivot_sus_op = l->pivot_sus_op();
      }
      ld.largest_window = l->largest_window();
      ld.degraded = l->degraded();
      d.lanes.push_back(ld);
    }
  }
  d.notes = StringsFrom(w.notes());
  if (const auto* s = w.summary()) {
    d.summary.rank = s->rank();
    d.summary.status = StatusFromWire(s->status());
    d.summary.lane = s->lane();
    d.summary.step = s->step();
    d.summary.op_index = s->op_index();
    if (s->comms()) {
      for (const auto* c : *s->comms()) {
        d.summary.comms.push_back({c->communicator(), c->last_seq_before(), c->first_seq_after()});
      }
    }
  } else {
    d.summary.rank = d.rank;
  }
  return d;
}

Offset<wire::ReplicaGroup> ReplicaGroupToWire(FlatBufferBuilder& b, const aligner::ReplicaReport& r,
                                              const std::string& node) {
  auto node_s = b.CreateString(node);
  auto ranks = b.CreateVector(r.ranks);
  std::vector<Offset<wire::RankDiff>> pairs;
  for (const auto& p : r.pairs) pairs.push_back(RankDiffToWire(b, p));
  auto pairs_vec = b.CreateVector(pairs);
  auto first = FirstToWire(b, r.first_divergence);
  auto odd = b.CreateVector(r.odd_ranks);
  auto notes = Strings(b, r.notes);
  return wire::CreateReplicaGroup(b, node_s, StatusToWire(r.status), ranks, pairs_vec, first, odd,
                                  notes, r.replicated_only, r.compared_ops);
}

aligner::ReplicaReport ReplicaGroupFromWire(const wire::ReplicaGroup& w) {
  aligner::ReplicaReport r;
  r.status = StatusFromWire(w.status());
  r.ranks = Vec(w.ranks());
  if (w.pairs()) {
    for (const auto* p : *w.pairs()) r.pairs.push_back(RankDiffFromWire(*p));
  }
  r.first_divergence = FirstFromWire(w.first_divergence());
  r.odd_ranks = Vec(w.odd_ranks());
  r.notes = StringsFrom(w.notes());
  r.replicated_only = w.replicated_only();
  r.compared_ops = w.compared_ops();
  return r;
}

Offset<wire::CollectiveRecord> CollectiveToWire(FlatBufferBuilder& b,
                                                const aligner::CollectiveEvent& e) {
  std::vector<Offset<wire::TensorSig>> outputs;
  for (const auto& f : e.outputs) {
    wire::Fp128 fp = Fp(f);
    wire::TensorSigBuilder t(b);
    t.add_fingerprint(&fp);
    outputs.push_back(t.Finish());
  }
  auto outputs_vec = b.CreateVector(outputs);
  wire::CollectiveRecordBuilder c(b);
  c.add_communicator(e.communicator);
  c.add_seq(e.seq);
  c.add_phase(static_cast<wire::CollectivePhase>(e.phase));
  c.add_kind(static_cast<wire::CollectiveKind>(e.kind));
  c.add_dtype(static_cast<wire::DType>(e.dtype));
  c.add_count(e.count);
  c.add_root(e.root);
  c.add_reduce_op(e.reduce_op);
  c.add_outputs(outputs_vec);
  c.add_lane(e.lane);
  c.add_op_index(e.op_index);
  c.add_step(e.step);
  c.add_site(e.site);
  c.add_time_ns(e.time_ns);
  return c.Finish();
}

aligner::CollectiveEvent CollectiveFromWire(const wire::CollectiveRecord& w) {
  aligner::CollectiveEvent e;
  e.communicator = w.communicator();
  e.seq = w.seq();
  e.phase = w.phase() == wire::CollectivePhase::Entered ? aligner::CollectivePhase::kEntered
                                                        : aligner::CollectivePhase::kCompleted;
  e.kind = static_cast<aligner::CollectiveKind>(w.kind());
  e.dtype = static_cast<aligner::DType>(w.dtype());
  e.count = w.count();
  e.root = w.root();
  e.reduce_op = w.reduce_op();
  if (w.outputs()) {
    for (const auto* t : *w.outputs()) e.outputs.push_back(Fp(t->fingerprint()));
  }
  e.lane = w.lane();
  e.op_index = w.op_index();
  e.step = w.step();
  e.site = w.site();
  e.time_ns = w.time_ns();
  return e;
}

namespace {

// Identity of a collective summary for grouping: every field but time_ns.
std::string GroupKey(const aligner::CollectiveEvent& e) {
  std::string key;
  auto put = [&key](const auto& v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(e.communicator);
  put(e.seq);
  put(e.phase);
  put(e.kind);
  put(e.dtype);
  put(e.count);
  put(e.root);
  put(e.reduce_op);
  put(e.lane);
  put(e.op_index);
  put(e.step);
  put(e.site);
  for (const auto& f : e.outputs) {
    put(f.lo);
    put(f.hi);
  }
  return key;
}

}  // namespace

Offset<flatbuffers::Vector<Offset<wire::CollectiveGroup>>> CollectiveGroupsToWire(
    FlatBufferBuilder& b, const std::map<uint32_t, std::vector<aligner::CollectiveEvent>>& by_rank) {
  struct Group {
    aligner::CollectiveEvent record;
    std::vector<uint32_t> ranks;
  };
  std::vector<Group> groups;
  std::unordered_map<std::string, size_t> index;
  for (const auto& [rank, events] : by_rank) {
    for (const auto& e : events) {
      auto [it, added] = index.emplace(GroupKey(e), groups.size());
      if (added) {
        groups.push_back({e, {rank}});
        continue;
      }
      Group& g = groups[it->second];
      g.ranks.push_back(rank);  // by_rank is ordered: ranks stay ascending
      if (e.time_ns != 0 && (g.record.time_ns == 0 || e.time_ns < g.record.time_ns))
        g.record.time_ns = e.time_ns;
    }
  }
  std::vector<Offset<wire::CollectiveGroup>> out;
  out.reserve(groups.size());
  for (const Group& g : groups) {
    auto record = CollectiveToWire(b, g.record);
    out.push_back(wire::CreateCollectiveGroup(b, record, b.CreateVector(g.ranks)));
  }
  return b.CreateVector(out);
}

std::vector<aligner::RankCollectives> CollectivesFromWire(const wire::CollectivesAnswer& a) {
  std::vector<aligner::RankCollectives> out;
  std::unordered_map<uint32_t, size_t> slot;
  if (a.ranks()) {
    for (const auto* r : *a.ranks()) {
      if (!slot.emplace(r->rank(), out.size()).second) continue;
      aligner::RankCollectives rc;
      rc.rank = r->rank();
      if (r->events()) {
        rc.events.reserve(r->events()->size());
        for (const auto* e : *r->events()) rc.events.push_back(CollectiveFromWire(*e));
      }
      out.push_back(std::move(rc));
    }
  }
  if (a.groups()) {
    for (const auto* g : *a.groups()) {
      if (!g->record() || !g->ranks()) continue;
      aligner::CollectiveEvent e = CollectiveFromWire(*g->record());
      for (uint32_t rank : *g->ranks()) {
        // A group naming a rank the answer does not list is malformed: the
        // rank's presence (and so `partial`) is decided by `ranks` alone.
        if (auto it = slot.find(rank); it != slot.end()) out[it->second].events.push_back(e);
      }
    }
  }
  for (auto& rc : out) {
    std::stable_sort(rc.events.begin(), rc.events.end(), [](const auto& x, const auto& y) {
      return std::tie(x.communicator, x.seq) < std::tie(y.communicator, y.seq);
    });
  }
  return out;
}

aligner::Communicator CommunicatorFromWire(const wire::CommunicatorDef& w) {
  aligner::Communicator c;
  c.id = w.id();
  c.name = Str(w.name());
  c.ranks = Vec(w.ranks());
  return c;
}

aligner::DiffReport MergeDiffAnswer(const wire::DiffAnswer& a) {
  std::vector<aligner::RankDiff> ranks;
  if (a.ranks()) {
    for (const auto* r : *a.ranks()) ranks.push_back(RankDiffFromWire(*r));
  }
  aligner::DiffReport report = aligner::MergeRankDiffs(std::move(ranks), Vec(a.expected_ranks()));
  for (auto& n : StringsFrom(a.notes())) report.notes.push_back(std::move(n));
  if (a.communicators()) {
    std::map<uint64_t, std::string> labels;
    for (const auto* c : *a.communicators()) {
      labels.emplace(c->id(), aligner::CommunicatorLabel(CommunicatorFromWire(*c)));
    }
    for (auto& e : report.explained) {
      if (auto it = labels.find(e.communicator); it != labels.end()) e.communicator_name = it->second;
    }
  }
  return report;
}

aligner::CollectivesReport CheckCollectivesAnswer(const wire::CollectivesAnswer& a) {
  std::vector<aligner::RankCollectives> ranks = CollectivesFromWire(a);
  std::vector<aligner::Communicator> comms;
  std::set<uint64_t> seen;
  if (a.communicators()) {
    for (const auto* c : *a.communicators()) {
      if (seen.insert(c->id()).second) comms.push_back(CommunicatorFromWire(*c));
    }
  }
  aligner::StringTable strings;
  if (a.strings()) {
    for (const auto* s : *a.strings()) strings.AddString(s->id(), Str(s->text()));
  }
  if (a.sites()) {
    for (const auto* s : *a.sites())
      strings.AddSite(s->id(), {s->file(), s->line(), s->function()});
  }
  aligner::CollectivesReport report =
      aligner::CheckCollectives(ranks, comms, &strings, Vec(a.expected_ranks()));
  if (a.gaps()) {
    for (const auto* g : *a.gaps()) {
      std::ostringstream o;
      o << "rank " << g->rank() << " dropped collective records: communicator ";
      auto def = std::find_if(comms.begin(), comms.end(),
                              [&](const aligner::Communicator& c) { return c.id == g->communicator(); });
      const std::string label = def != comms.end() ? aligner::CommunicatorLabel(*def) : "";
      if (label.empty()) {
        o << "#" << std::hex << g->communicator() << std::dec;
      } else {
        o << label;
      }
      o << " seq " << g->first_seq() << ".." << g->last_seq()
        << " (its progress there is unknown, not absent)";
      report.notes.push_back(o.str());
    }
    // Missing records can hide a desync or make a rank look behind: the
    // consistency verdict is not certain.
    if (a.gaps()->size() != 0 && report.status == aligner::DiffStatus::kIdentical) {
      report.status = aligner::DiffStatus::kIncomplete;
    }
  }
  for (auto& n : StringsFrom(a.notes())) report.notes.push_back(std::move(n));
  return report;
}

nlohmann::json NodesJson(const flatbuffers::Vector<Offset<wire::NodeAnswer>>* nodes) {
  nlohmann::json out = nlohmann::json::array();
  if (nodes == nullptr) return out;
  for (const auto* n : *nodes) {
    out.push_back(
        {{"endpoint", Str(n->endpoint())},
         {"node", Str(n->node())},
         {"ranks", Vec(n->ranks())},
         {"answered", n->answered()},
         {"error", n->error() ? nlohmann::json(n->error()->str()) : nlohmann::json(nullptr)},
         {"seconds", n->seconds()}});
  }
  return out;
}

nlohmann::json RanksJson(const wire::RanksAnswer& a) {
  nlohmann::json collectives = nullptr, nodes = nlohmann::json::array();
  aligner::DiffStatus status = aligner::DiffStatus::kIdentical;
  std::vector<uint32_t> missing;
  std::vector<std::string> notes;
  if (a.collectives()) {
    auto report = CheckCollectivesAnswer(*a.collectives());
    collectives = aligner::ToJson(report);
    status = report.status;
    missing = report.missing_ranks;
    nodes = NodesJson(a.collectives()->nodes());
  }
  nlohmann::json replicas = nlohmann::json::array();
  std::set<uint32_t> odd;
  if (a.replicas()) {
    for (const auto* g : *a.replicas()) {
      auto r = ReplicaGroupFromWire(*g);
      auto j = aligner::ToJson(r);
      j["node"] = Str(g->node());
      replicas.push_back(std::move(j));
      odd.insert(r.odd_ranks.begin(), r.odd_ranks.end());
      // Precedence as for diffs: partial > incomplete > diverged > identical.
      if (static_cast<int>(r.status) > static_cast<int>(status) &&
          status != aligner::DiffStatus::kPartial) {
        status = r.status;
      }
    }
  }
  if (!a.replicas() || a.replicas()->size() == 0) {
    notes.push_back(
        "no replica comparison: name the ranks that must hold identical bits with --replicas");
  }
  // Ranks a cross-rank check singles out: outside the majority of a
  // collective's outputs, or of replicas at their pivot.
  if (collectives.is_object()) {
    for (const auto& m : collectives["mismatches"]) {
      for (const auto& r : m["minority_ranks"]) odd.insert(r.get<uint32_t>());
    }
  }
  return {{"format", aligner::kReportFormat},
          {"kind", "ranks"},
          {"status", aligner::DiffStatusName(status)},
          {"odd_ranks", std::vector<uint32_t>(odd.begin(), odd.end())},
          {"missing_ranks", missing},
          {"collectives", collectives},
          {"replicas", replicas},
          {"nodes", nodes},
          {"notes", notes}};
}

std::string RanksText(const wire::RanksAnswer& a) {
  std::ostringstream o;
  if (a.collectives()) o << aligner::ToText(CheckCollectivesAnswer(*a.collectives()));
  if (a.replicas() && a.replicas()->size() != 0) {
    for (const auto* g : *a.replicas()) {
      o << "replicas on " << Str(g->node()) << ":\n" << aligner::ToText(ReplicaGroupFromWire(*g));
    }
  } else {
    o << "note: no replica comparison (name replicas with --replicas R,R,...)\n";
  }
  return o.str();
}

void OpDetailFromRecord(const wire::OpRecord& r, aligner::OpDetail* d) {
  d->lane = r.lane();
  d->op_index = r.op_index();
  d->step = r.step();
  d->name = r.name();
  d->site = r.site();
  d->seq_nr = r.seq_nr();
  d->backward = r.backward();
  d->forward_site = r.forward_site();
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
  d->trusted = r.trusted();
}

}  // namespace opguard::daemon
