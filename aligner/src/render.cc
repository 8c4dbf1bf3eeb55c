#include "opguard/aligner/render.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include "opguard/aligner/diagnosis.h"
#include "opguard/common/hex.h"

namespace opguard::aligner {

using nlohmann::json;

const char* DiffStatusName(DiffStatus s) {
  switch (s) {
    case DiffStatus::kIdentical: return "identical";
    case DiffStatus::kDiverged: return "diverged";
    case DiffStatus::kIncomplete: return "incomplete";
    case DiffStatus::kPartial: return "partial";
  }
  return "identical";
}

// The 16 digest bytes in order (lo holds bytes 0..7 little-endian, hi bytes
// 8..15): the same text `opguard fingerprint` prints and the daemon's trace
// JSON shows, so a user can compare them directly.
std::string FpHex(const Fp128& fp) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    uint8_t byte = static_cast<uint8_t>((i < 8 ? fp.lo : fp.hi) >> (8 * (i % 8)));
    out[2 * i] = kDigits[byte >> 4];
    out[2 * i + 1] = kDigits[byte & 15];
  }
  return out;
}

namespace {

std::string Hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// Whether the pivot ran other kernels in the two runs. Unknown (nullopt)
// unless both runs recorded kernels for it: an empty list is also what a run
// without kernel recording (OPGUARD_KERNELS) carries.
std::optional<bool> KernelsDiffer(const FirstDivergence& f) {
  if (f.reference.kernels.empty() || f.suspect.kernels.empty()) return std::nullopt;
  return f.reference.kernels != f.suspect.kernels;
}

// ---- to JSON ----------------------------------------------------------------

json Stats(const std::optional<TensorStats>& s) {
  if (!s) return nullptr;
  // NaN and infinities are not JSON numbers: they become null (min/max of a
  // tensor can be infinite).
  auto num = [](double d) -> json { return std::isfinite(d) ? json(d) : json(nullptr); };
  return json{{"nan_count", s->nan_count}, {"inf_count", s->inf_count}, {"min", num(s->min)},
              {"max", num(s->max)},         {"sum", num(s->sum)},           {"l2", num(s->l2)}};
}

json Tensor(const TensorView& t) {
  return json{{"fingerprint", FpHex(t.fingerprint)}, {"dtype", t.dtype}, {"shape", t.shape},
              {"stats", Stats(t.stats)}};
}

json Site(const SiteInfo& s) {
  return json{{"file", s.file}, {"line", s.line}, {"function", s.function}, {"id", Hex64(s.id)}};
}

// The paper's "input signatures": one entry per input; a scalar is its raw
// bits, a tensor its fingerprint, a list an array of fingerprints.
json Signatures(const OpView& v) {
  json a = json::array();
  for (const InputView& in : v.inputs) {
    if (in.kind == "scalar") {
      a.push_back(in.scalar_bits);
    } else if (in.kind == "tensor" && !in.tensors.empty()) {
      a.push_back(FpHex(in.tensors[0].fingerprint));
    } else if (in.kind == "tensor_list") {
      json l = json::array();
      for (const TensorView& t : in.tensors) l.push_back(FpHex(t.fingerprint));
      a.push_back(l);
    } else {
      a.push_back(nullptr);
    }
  }
  return a;
}

json View(const OpView& v) {
  json outputs = json::array(), inputs = json::array();
  for (const TensorView& t : v.outputs) outputs.push_back(Tensor(t));
  for (const InputView& in : v.inputs) {
    json tensors = json::array();
    for (const TensorView& t : in.tensors) tensors.push_back(Tensor(t));
    inputs.push_back(json{{"kind", in.kind}, {"tensors", tensors}, {"scalar_bits", in.scalar_bits},
                          {"scalar_dtype", in.scalar_dtype}});
  }
  return json{{"rank", v.rank},
              {"lane", v.lane},
              {"op_index", v.op_index},
              {"step", v.step},
              {"op", v.op},
              {"site", Site(v.site)},
              {"forward_site", v.forward_site.id != 0 ? Site(v.forward_site) : json(nullptr)},
              {"seq_nr", v.seq_nr},
              {"backward", v.backward},
              {"start_ns", v.start_ns},
              {"detail_available", v.detail_available},
              {"trusted", v.trusted},
              {"output_digest", FpHex(v.output_digest)},
              {"input_digest", FpHex(v.input_digest)},
              {"outputs", outputs},
              {"inputs", inputs},
              {"input_signatures", Signatures(v)},
              {"kernels", v.kernels}};
}

// Where the pivot's forward was called, when it is a backward op with a site
// of its own; null when neither run recorded one.
json ForwardSites(const FirstDivergence& f) {
  if (f.reference.forward_site.id == 0 && f.suspect.forward_site.id == 0) return nullptr;
  return json{{"reference", Site(f.reference.forward_site)}, {"suspect", Site(f.suspect.forward_site)}};
}

json Divergence(const std::optional<FirstDivergence>& f) {
  if (!f) return nullptr;
  const std::optional<bool> kernels_differ = KernelsDiffer(*f);
  return json{{"rank", f->rank},
              {"lane", f->lane},
              {"step", f->step},
              {"op", f->op},
              {"op_index", {{"reference", f->reference.op_index}, {"suspect", f->suspect.op_index}}},
              {"site", {{"reference", Site(f->reference.site)}, {"suspect", Site(f->suspect.site)}}},
              {"forward_site", ForwardSites(*f)},
              {"inputs_equal", f->inputs_equal},
              {"code_changed", f->code_changed},
              {"differing_outputs", f->differing_outputs},
              {"producer", f->producer ? json{{"run", f->producer_run}, {"op", View(*f->producer)}} : json(nullptr)},
              {"kernels_differ", kernels_differ ? json(*kernels_differ) : json(nullptr)},
              {"trusted_before", f->trusted_before},
              {"trusted_candidate", f->trusted_candidate ? View(*f->trusted_candidate) : json(nullptr)},
              {"reference", View(f->reference)},
              {"suspect", View(f->suspect)}};
}

json Summary(const RankSummary& s) {
  json comms = json::array();
  for (const CommPosition& c : s.comms) {
    comms.push_back(json{{"communicator", Hex64(c.communicator)},
                         {"last_seq_before", c.last_seq_before},
                         {"first_seq_after", c.first_seq_after}});
  }
  return json{{"rank", s.rank},   {"status", DiffStatusName(s.status)}, {"lane", s.lane},
              {"step", s.step},   {"op_index", s.op_index},            {"comms", comms}};
}

json Member(const CollectiveMember& m) {
  json outs = json::array();
  for (const Fp128& f : m.outputs) outs.push_back(FpHex(f));
  return json{{"rank", m.rank},   {"kind", m.kind},       {"dtype", m.dtype},
              {"count", m.count}, {"root", m.root},       {"step", m.step},
              {"lane", m.lane},   {"op_index", m.op_index}, {"site", Site(m.site)},
              {"outputs", outs}};
}

// ---- text ---------------------------------------------------------------------

std::string SiteText(const SiteInfo& s) {
  if (s.file.empty() && s.function.empty()) return s.id == 0 ? "unknown site" : "site #" + Hex64(s.id);
  std::string out = s.file.empty() ? "?" : s.file;
  if (s.line != 0) out += ":" + std::to_string(s.line);
  if (!s.function.empty()) out += " in " + s.function;
  return out;
}

std::string ShortFp(const Fp128& f) { return FpHex(f).substr(0, 12) + "…"; }

std::string ShapeText(const TensorView& t) {
  std::string s = t.dtype + "[";
  for (size_t k = 0; k < t.shape.size(); ++k) s += (k ? ", " : "") + std::to_string(t.shape[k]);
  return s + "]";
}

std::string SigText(const OpView& v) {
  std::string s = "[";
  for (size_t k = 0; k < v.inputs.size(); ++k) {
    const InputView& in = v.inputs[k];
    if (k) s += ", ";
    if (in.kind == "scalar") {
      s += std::to_string(in.scalar_bits);
    } else if (in.kind == "tensor" && !in.tensors.empty()) {
      s += ShortFp(in.tensors[0].fingerprint);
    } else if (in.kind == "tensor_list") {
      s += "list(" + std::to_string(in.tensors.size()) + ")";
    } else {
      s += "none";
    }
  }
  return s + "]";
}

std::string Num(double d) {
  std::ostringstream o;
  o.precision(6);
  o << d;
  return o.str();
}

// The pivot's kernels: the first pair that differs (names can be long: the
// full lists are in the JSON), or that they are the same, or that only one
// run recorded them.
void KernelsText(std::ostringstream& o, const FirstDivergence& f, std::optional<bool> differ) {
  const std::vector<std::string>& r = f.reference.kernels;
  const std::vector<std::string>& s = f.suspect.kernels;
  if (!differ) {
    if (!r.empty() || !s.empty()) {
      o << "  kernels recorded in the " << (r.empty() ? "suspect" : "reference") << " run only (not compared)\n";
    }
    return;
  }
  if (!*differ) {
    o << "  kernels: the same " << r.size() << " in both runs\n";
    return;
  }
  size_t k = 0;
  while (k < r.size() && k < s.size() && r[k] == s[k]) ++k;
  auto at = [k](const std::vector<std::string>& v) { return k < v.size() ? v[k] : std::string("(none)"); };
  o << "  other kernels ran: kernel " << k + 1 << " of " << r.size() << " (reference) and " << s.size()
    << " (suspect) differs\n    reference: " << at(r) << "\n    suspect:   " << at(s) << "\n";
}

void PivotText(std::ostringstream& o, const FirstDivergence& f, const char* headline) {
  o << headline << " · rank " << f.rank << " · step " << f.step << " · " << f.op << "  ("
    << SiteText(f.suspect.site) << ")\n";
  o << "  reference: op #" << f.reference.op_index << " · step " << f.reference.step;
  if (f.reference.rank != f.rank) o << " · rank " << f.reference.rank;
  o << " · " << SiteText(f.reference.site) << "\n";
  o << "  suspect:   op #" << f.suspect.op_index << " · step " << f.suspect.step << " · "
    << SiteText(f.suspect.site) << (f.lane != 0 ? " · lane " + std::to_string(f.lane) : "") << "\n";
  if (f.suspect.forward_site.id != 0) {
    o << "  in the backward of the forward at " << SiteText(f.suspect.forward_site) << "\n";
  }
}

void EvidenceText(std::ostringstream& o, const FirstDivergence& f) {
  const std::optional<bool> kernels_differ = KernelsDiffer(f);
  if (f.op.rfind("opguard::replica_state[", 0) == 0) {
    // Recorded by OpGuard after an optimizer step (online SDC mode): a
    // snapshot with no inputs, not a computation.
    o << "replica state differs → this copy changed since the replicas last agreed: in memory, in the "
         "update that wrote it, or in what that update read\n";
  } else if (f.code_changed) {
    // Both lines and both argument lists follow (sites above, signatures below).
    o << "the code here differs between the runs (an edited line or other arguments: reference "
      << SiteText(f.reference.site) << ", suspect " << SiteText(f.suspect.site)
      << "), output differs → the edit\n";
  } else if (f.inputs_equal && MovesDataOnly(f.op)) {
    o << "inputs identical (fingerprints equal), output differs, but " << f.op
      << " only moves data → the recording is suspect, not the op (record the suspect again)\n";
  } else if (f.inputs_equal && kernels_differ == true) {
    o << "inputs identical (fingerprints equal), output differs → the op itself, which ran other kernels "
         "(another algorithm: a different GEMM kernel, say)\n";
  } else if (f.inputs_equal) {
    o << "inputs identical (fingerprints equal), output differs → the op itself (kernel race, SDC, wrong code)\n";
  } else if (f.producer) {
    const OpView& p = *f.producer;
    o << "inputs differ, output differs → an input comes from op #" << p.op_index << " " << p.op << " ("
      << SiteText(p.site) << ") of the " << f.producer_run << " run, which has no partner in the "
      << (f.producer_run == "suspect" ? "reference" : "suspect") << "\n";
  } else if (f.trusted_candidate) {
    const OpView& c = *f.trusted_candidate;
    o << "inputs differ, output differs → an input was made without fingerprints: probably by trusted op #"
      << c.op_index << " " << c.op << " (" << SiteText(c.site)
      << "), the latest trusted op before it with an output of that dtype and shape (" << f.trusted_before
      << " trusted op(s) before it were not compared); record again without OPGUARD_TRUSTED to confirm\n";
  } else if (f.trusted_before > 0) {
    o << "inputs differ, output differs → a producer upstream that was not recorded (or not aligned), or one of "
      << f.trusted_before << " trusted op(s) before it, recorded without fingerprints: record again without "
         "OPGUARD_TRUSTED to find it\n";
  } else {
    o << "inputs differ, output differs → a producer upstream that was not recorded (or not aligned)\n";
  }
  const OpView& r = f.reference;
  const OpView& s = f.suspect;
  if (r.detail_available && s.detail_available) {
    for (uint32_t k : f.differing_outputs) {
      o << "  output " << k << ": ";
      if (k < r.outputs.size() && k < s.outputs.size()) {
        const TensorView& a = r.outputs[k];
        const TensorView& b = s.outputs[k];
        o << ShapeText(b) << " · reference " << ShortFp(a.fingerprint) << " suspect " << ShortFp(b.fingerprint);
        if (a.stats && b.stats) {
          o << " · sum " << Num(a.stats->sum) << " vs " << Num(b.stats->sum) << " · max " << Num(a.stats->max)
            << " vs " << Num(b.stats->max);
          if (a.stats->nan_count + b.stats->nan_count + a.stats->inf_count + b.stats->inf_count > 0) {
            o << " · nan " << a.stats->nan_count << " vs " << b.stats->nan_count << " · inf "
              << a.stats->inf_count << " vs " << b.stats->inf_count;
          }
        }
      } else {
        o << "present in one run only";
      }
      o << "\n";
    }
    o << "  input signatures:\n    reference: " << SigText(r) << "\n    suspect:   " << SigText(s) << "\n";
    KernelsText(o, f, kernels_differ);
  } else {
    o << "  (full records of the pivot not available: fingerprints and stats not shown)\n";
  }
}

std::string Ranks(const std::vector<uint32_t>& v) {
  std::string s;
  for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
  return s.empty() ? "none" : s;
}

std::string CommText(const std::string& name, uint64_t id) { return name.empty() ? "#" + Hex64(id) : name; }

}  // namespace

json ToJson(const RankDiff& r) {
  json missing = json::array(), lanes = json::array();
  for (const MissingRange& m : r.missing) {
    missing.push_back(json{{"run", m.run}, {"rank", m.rank}, {"lane", m.lane}, {"first_op", m.first_op},
                           {"last_op", m.last_op}});
  }
  for (const LaneDiff& l : r.lanes) {
    lanes.push_back(json{{"lane", l.lane},
                         {"status", DiffStatusName(l.status)},
                         {"ops", {{"reference", l.ref_ops}, {"suspect", l.sus_ops}}},
                         {"aligned", l.aligned},
                         {"reordered", l.reordered},
                         {"unaligned", {{"reference", l.unaligned_ref}, {"suspect", l.unaligned_sus}}},
                         {"pivot_op_index",
                          l.pivot_ref_op ? json{{"reference", *l.pivot_ref_op}, {"suspect", *l.pivot_sus_op}}
                                         : json(nullptr)},
                         {"largest_window", l.largest_window},
                         {"degraded", l.degraded}});
  }
  return json{{"rank", r.rank},
              {"status", DiffStatusName(r.status)},
              {"first_divergence", Divergence(r.first_divergence)},
              {"first_observed", Divergence(r.first_observed)},
              {"aligned", r.aligned},
              {"aligned_total", r.aligned_total},
              {"unaligned_before", {{"reference", r.unaligned_before_ref}, {"suspect", r.unaligned_before_sus}}},
              {"unaligned_total", {{"reference", r.unaligned_total_ref}, {"suspect", r.unaligned_total_sus}}},
              {"skipped_nondeterministic", r.skipped_nondeterministic},
              {"skipped_trusted", r.skipped_trusted},
              {"reordered", r.reordered},
              {"missing", missing},
              {"lanes", lanes},
              {"notes", r.notes},
              {"summary", Summary(r.summary)}};
}

json DiagnosisJson(const DiffReport& r) {
  const std::optional<Diagnosis> d = Diagnose(r);
  if (!d) return nullptr;
  return json{{"cause", d->cause}, {"text", d->text}, {"spread", d->spread.empty() ? json(nullptr) : json(d->spread)}};
}

json ToJson(const DiffReport& r) {
  json ranks = json::array(), explained = json::array();
  for (const RankDiff& d : r.ranks) ranks.push_back(ToJson(d));
  for (const Explanation& e : r.explained) {
    explained.push_back(json{{"rank", e.rank},
                             {"from_rank", e.from_rank},
                             {"communicator", Hex64(e.communicator)},
                             {"communicator_name", e.communicator_name},
                             {"seq", e.seq}});
  }
  return json{{"format", kReportFormat},
              {"kind", "diff"},
              {"status", DiffStatusName(r.status)},
              {"first_divergence", Divergence(r.first_divergence)},
              {"unaligned_before", {{"reference", r.unaligned_before_ref}, {"suspect", r.unaligned_before_sus}}},
              {"aligned", r.aligned},
              {"diverging_ranks", r.diverging_ranks},
              {"explained", explained},
              {"incomplete_ranks", r.incomplete_ranks},
              {"missing_ranks", r.missing_ranks},
              {"skipped_nondeterministic", r.skipped_nondeterministic},
              {"skipped_trusted", r.skipped_trusted},
              {"diagnosis", DiagnosisJson(r)},
              {"ranks", ranks},
              {"notes", r.notes}};
}

json ToJson(const CollectivesReport& r) {
  json desyncs = json::array(), mismatches = json::array(), live = json::array();
  for (const CollectiveDesync& d : r.desyncs) {
    json members = json::array();
    for (const CollectiveMember& m : d.members) members.push_back(Member(m));
    desyncs.push_back(json{{"communicator", Hex64(d.communicator)}, {"communicator_name", d.communicator_name},
                           {"seq", d.seq}, {"fields", d.fields}, {"members", members}});
  }
  for (const CollectiveMismatch& m : r.mismatches) {
    json members = json::array();
    for (const CollectiveMember& x : m.members) members.push_back(Member(x));
    mismatches.push_back(json{{"communicator", Hex64(m.communicator)}, {"communicator_name", m.communicator_name},
                              {"seq", m.seq}, {"kind", m.kind}, {"groups", m.groups},
                              {"minority_ranks", m.minority_ranks}, {"members", members}});
  }
  for (const CommunicatorLive& c : r.live) {
    json ranks = json::array();
    for (const RankProgress& p : c.ranks) {
      ranks.push_back(json{{"rank", p.rank}, {"last_entered", p.last_entered}, {"last_completed", p.last_completed},
                           {"last_step", p.last_step}, {"last_site", Site(p.last_site)}});
    }
    json kinds = json::array();
    for (const auto& k : c.kinds) kinds.push_back(json{{"from_seq", k.first_seq}, {"to_seq", k.last_seq}, {"kind", k.kind}});
    live.push_back(json{{"communicator", Hex64(c.communicator)},
                        {"name", c.name},
                        {"ranks", ranks},
                        {"pending_seq", c.pending_seq ? json(*c.pending_seq) : json(nullptr)},
                        {"pending_kind", c.pending_kind},
                        {"waiting", c.waiting},
                        {"not_joined", c.not_joined},
                        {"waiting_since_ns", c.waiting_since_ns},
                        {"kinds", kinds}});
  }
  return json{{"format", kReportFormat},   {"kind", "collectives"},       {"status", DiffStatusName(r.status)},
              {"collectives", r.collectives}, {"desyncs", desyncs},       {"mismatches", mismatches},
              {"live", live},               {"waiting", r.waiting},        {"missing_ranks", r.missing_ranks},
              {"notes", r.notes}};
}

json ToJson(const ReplicaReport& r) {
  json pairs = json::array();
  for (const RankDiff& d : r.pairs) pairs.push_back(ToJson(d));
  return json{{"format", kReportFormat},
              {"kind", "replicas"},
              {"status", DiffStatusName(r.status)},
              {"ranks", r.ranks},
              {"first_divergence", Divergence(r.first_divergence)},
              {"odd_ranks", r.odd_ranks},
              {"compared", r.replicated_only ? "replicated_ops" : "all_ops"},
              {"compared_ops", r.compared_ops},
              {"pairs", pairs},
              {"notes", r.notes}};
}

std::string ToText(const DiffReport& r) {
  std::ostringstream o;
  if (r.status == DiffStatus::kPartial) {
    o << "partial · no answer from rank(s) " << Ranks(r.missing_ranks) << " · what follows covers the others\n";
  }
  if (r.first_divergence) {
    PivotText(o, *r.first_divergence, "first divergence");
    o << "aligned " << r.aligned << " ops · unaligned before boundary: reference " << r.unaligned_before_ref
      << ", suspect " << r.unaligned_before_sus << "\n";
    EvidenceText(o, *r.first_divergence);
  }
  if (!r.incomplete_ranks.empty()) {
    o << "incomplete · records missing on rank(s) " << Ranks(r.incomplete_ranks)
      << (r.first_divergence ? " · an earlier origin may be hidden there\n" : " · no pivot claimed\n");
    for (const RankDiff& d : r.ranks) {
      for (const MissingRange& m : d.missing) {
        o << "  rank " << m.rank << " " << m.run << " lane " << m.lane << ": ops #" << m.first_op << "..#"
          << m.last_op << " missing\n";
      }
      if (d.first_observed) {
        o << "  rank " << d.rank << ": first difference seen after the gap: " << d.first_observed->op << " op #"
          << d.first_observed->suspect.op_index << " step " << d.first_observed->step << " ("
          << SiteText(d.first_observed->suspect.site) << ") — not a pivot\n";
      }
    }
  }
  if (!r.first_divergence && r.incomplete_ranks.empty()) {
    if (r.status == DiffStatus::kIdentical || r.status == DiffStatus::kPartial) {
      o << "identical · " << r.ranks.size() << " rank(s) · aligned " << r.aligned
        << " ops · unaligned: reference " << r.unaligned_before_ref << ", suspect " << r.unaligned_before_sus
        << "\n";
    }
  }
  if (r.diverging_ranks.size() > 1 || !r.explained.empty()) {
    o << "diverging rank(s): " << Ranks(r.diverging_ranks) << "\n";
  }
  for (const Explanation& e : r.explained) {
    o << "  rank " << e.rank << " ← rank " << e.from_rank << " via communicator "
      << CommText(e.communicator_name, e.communicator) << " seq " << e.seq << "\n";
  }
  if (r.skipped_nondeterministic > 0) {
    o << "skipped " << r.skipped_nondeterministic << " nondeterministic op(s) as evidence\n";
  }
  if (r.skipped_trusted > 0) {
    o << "skipped " << r.skipped_trusted << " trusted op(s): recorded without fingerprints (OPGUARD_TRUSTED)\n";
  }
  for (const std::string& n : r.notes) o << "note: " << n << "\n";
  if (const std::optional<Diagnosis> d = Diagnose(r)) {
    o << "diagnosis (" << d->cause << "): " << d->text << (d->spread.empty() ? "" : " " + d->spread) << "\n";
  }
  return o.str();
}

std::string ToText(const CollectivesReport& r) {
  std::ostringstream o;
  if (r.status == DiffStatus::kPartial) o << "partial · no answer from rank(s) " << Ranks(r.missing_ranks) << "\n";
  for (const CollectiveDesync& d : r.desyncs) {
    o << "desync · communicator " << CommText(d.communicator_name, d.communicator) << " seq " << d.seq << " · ";
    for (size_t k = 0; k < d.fields.size(); ++k) o << (k ? ", " : "") << d.fields[k];
    o << " differ\n";
    for (const CollectiveMember& m : d.members) {
      o << "  rank " << m.rank << ": " << m.kind << " " << m.dtype << " x" << m.count;
      if (m.root >= 0) o << " root " << m.root;
      o << " · step " << m.step << " · " << SiteText(m.site) << "\n";
    }
  }
  for (const CollectiveMismatch& m : r.mismatches) {
    o << "output mismatch · " << m.kind << " · communicator " << CommText(m.communicator_name, m.communicator)
      << " seq " << m.seq;
    if (!m.minority_ranks.empty()) o << " · rank(s) " << Ranks(m.minority_ranks) << " disagree with the others";
    o << "\n";
    for (const auto& g : m.groups) {
      const CollectiveMember* any = nullptr;
      for (const CollectiveMember& x : m.members) {
        if (x.rank == g[0]) any = &x;
      }
      o << "  {" << Ranks(g) << "}";
      if (any != nullptr && !any->outputs.empty()) o << " " << ShortFp(any->outputs[0]);
      if (any != nullptr) o << " · " << SiteText(any->site);
      o << "\n";
    }
  }
  for (const CommunicatorLive& c : r.live) {
    if (!c.pending_seq || c.not_joined.empty()) continue;
    o << "waiting · communicator " << CommText(c.name, c.communicator) << " seq " << *c.pending_seq;
    if (!c.pending_kind.empty()) o << " (" << c.pending_kind << ")";
    o << " · waiting: " << Ranks(c.waiting) << " · not joined: " << Ranks(c.not_joined) << "\n";
    for (const RankProgress& p : c.ranks) {
      if (std::find(c.not_joined.begin(), c.not_joined.end(), p.rank) == c.not_joined.end()) continue;
      o << "  rank " << p.rank << ": last entered seq " << p.last_entered << ", completed " << p.last_completed;
      if (p.last_entered >= 0) o << " · step " << p.last_step << " · " << SiteText(p.last_site);
      o << "\n";
    }
  }
  if (r.desyncs.empty() && r.mismatches.empty() && !r.waiting) {
    o << "collectives consistent · " << r.collectives << " collective(s) on " << r.live.size()
      << " communicator(s)\n";
  }
  for (const std::string& n : r.notes) o << "note: " << n << "\n";
  return o.str();
}

std::string ToText(const ReplicaReport& r) {
  std::ostringstream o;
  o << "replicas " << Ranks(r.ranks) << " · " << DiffStatusName(r.status);
  if (!r.odd_ranks.empty()) o << " · disagreeing with the majority: rank(s) " << Ranks(r.odd_ranks);
  o << " · " << r.compared_ops << (r.replicated_only ? " replicated op(s)" : " op(s)") << " compared\n";
  if (r.first_divergence) {
    PivotText(o, *r.first_divergence, "first divergence");
    EvidenceText(o, *r.first_divergence);
  }
  for (const RankDiff& d : r.pairs) {
    if (d.status == DiffStatus::kIncomplete) o << "  rank " << d.rank << ": incomplete (records missing)\n";
  }
  for (const std::string& n : r.notes) o << "note: " << n << "\n";
  return o.str();
}

}  // namespace opguard::aligner
