#include "opguard/aligner/diff.h"

#include <algorithm>
#include <future>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "lanes.h"
#include "view.h"

namespace opguard::aligner {
namespace {

// Traces of at least this many ops (both runs together) have their order
// checked on a second thread while the lanes are aligned: the check is a
// pass over every op (memory-bound: ~15 ms for two 1M-op traces), the
// alignment does not depend on it, and a diff of long traces is waited for.
constexpr size_t kConcurrentOrderCheckOps = size_t{1} << 16;

size_t OpCount(const RankTrace& t) {
  size_t n = 0;
  for (const LaneTrace& l : t.lanes) n += l.ops.size();
  return n;
}

// The step a gap belongs to: that of the last recorded op before it (the
// first one after it when the gap opens the lane).
uint64_t GapStep(const LaneTrace* lane, const Gap& g) {
  if (lane == nullptr || lane->ops.empty()) return 0;
  auto it = std::lower_bound(lane->ops.begin(), lane->ops.end(), g.first_op,
                             [](const OpEvent& e, uint64_t v) { return e.op_index < v; });
  if (it != lane->ops.begin()) return std::prev(it)->step;
  return it->step;
}

struct LaneWork {
  uint32_t lane = 0;
  const LaneTrace* ref = nullptr;
  const LaneTrace* sus = nullptr;
  Alignment al;
  std::optional<size_t> pivot;  // index into al.pairs
  uint64_t walked = 0;          // pairs before the pivot (all pairs if none)
  uint64_t skipped_nd = 0;
  uint64_t skipped_trusted = 0;  // before the pivot (all if none)
  std::vector<MissingRange> blocking;   // gaps before the pivot that were not tolerated
  std::vector<std::string> tolerated;
  // Steps of the blocking gaps, per run, to compare with other lanes' pivots.
  std::optional<uint64_t> min_gap_step_ref, min_gap_step_sus;
  uint64_t sus_start_ns = 0;
  bool has_start = false;
};

// Certified pairs between a gap and the pivot (or the end): how much agreeing
// evidence lies after the missing records.
uint64_t PairsAfter(const LaneWork& w, bool ref_side, uint64_t last_op) {
  uint64_t count = 0;
  for (uint64_t k = 0; k < w.walked; ++k) {
    const Pair& p = w.al.pairs[k];
    uint64_t idx = ref_side ? w.ref->ops[p.ref].op_index : w.sus->ops[p.sus].op_index;
    if (idx > last_op) ++count;
  }
  return count;
}

void CheckGaps(LaneWork& w, const std::vector<Gap>& gaps, bool ref_side, uint32_t rank,
               const DiffOptions& opt) {
  const LaneTrace* lane = ref_side ? w.ref : w.sus;
  std::optional<uint64_t> pivot_op;
  if (w.pivot) {
    const Pair& p = w.al.pairs[*w.pivot];
    pivot_op = ref_side ? w.ref->ops[p.ref].op_index : w.sus->ops[p.sus].op_index;
  }
  for (const Gap& g : gaps) {
    if (g.lane != w.lane) continue;
    if (pivot_op && g.first_op > *pivot_op) continue;  // after the pivot: irrelevant
    const char* run = ref_side ? "reference" : "suspect";
    if (opt.tolerate_gaps_older_than > 0 && lane != nullptr && w.ref != nullptr && w.sus != nullptr) {
      uint64_t after = PairsAfter(w, ref_side, g.last_op);
      if (after > opt.tolerate_gaps_older_than) {
        w.tolerated.push_back(std::string(run) + " lane " + std::to_string(g.lane) + " ops #" +
                              std::to_string(g.first_op) + "..#" + std::to_string(g.last_op) +
                              " missing; tolerated (" + std::to_string(after) +
                              " certified pairs after it)");
        continue;
      }
    }
    w.blocking.push_back(MissingRange{run, rank, g.lane, g.first_op, g.last_op});
    uint64_t step = GapStep(lane, g);
    auto& slot = ref_side ? w.min_gap_step_ref : w.min_gap_step_sus;
    slot = slot ? std::min(*slot, step) : step;
  }
}

enum class Order { kBefore, kAfter, kUnknown };

// Position of a collective relative to the rank's pivot, in the suspect run.
Order CollectiveVsPivot(const CollectiveEvent& c, uint32_t lane, uint64_t op_index, uint64_t step,
                        bool has_time, uint64_t time_ns) {
  if (c.lane == lane) return c.op_index <= op_index ? Order::kBefore : Order::kAfter;
  // Other lane: op indices are not comparable; wall clock on the same rank is.
  if (has_time && c.time_ns != 0) return c.time_ns <= time_ns ? Order::kBefore : Order::kAfter;
  if (c.step != step) return c.step < step ? Order::kBefore : Order::kAfter;
  return Order::kUnknown;
}

// Calls `f` with each of `side`'s input tensors whose fingerprint `other`
// does not have at the same position.
template <typename F>
void ForEachDifferingInput(const OpView& side, const OpView& other, F f) {
  for (size_t k = 0; k < side.inputs.size(); ++k) {
    const auto& tensors = side.inputs[k].tensors;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const bool same = k < other.inputs.size() && t < other.inputs[k].tensors.size() &&
                        other.inputs[k].tensors[t].fingerprint == tensors[t].fingerprint;
      if (!same) f(tensors[t]);
    }
  }
}

std::vector<Fp128> DifferingInputs(const OpView& side, const OpView& other) {
  std::vector<Fp128> out;
  ForEachDifferingInput(side, other, [&out](const TensorView& t) { out.push_back(t.fingerprint); });
  return out;
}

// Unpaired ops whose details FindUnpairedProducer loads, nearest the pivot
// first: a producer is almost always a few ops upstream, and each load is a
// store read.
constexpr int kProducerCandidates = 256;

// The latest op before position `pivot` of `lane` that no pair covers and
// whose outputs include one of `wanted`.
std::optional<OpView> FindUnpairedProducer(const LaneTrace& lane, const std::vector<Pair>& pairs, bool ref_side,
                                           uint32_t pivot, const std::vector<Fp128>& wanted, uint32_t rank,
                                           const DetailSource* details, const StringResolver* strings) {
  if (details == nullptr || wanted.empty()) return std::nullopt;
  std::vector<uint8_t> paired(pivot, 0);
  for (const Pair& p : pairs) {
    uint32_t pos = ref_side ? p.ref : p.sus;
    if (pos < pivot) paired[pos] = 1;
  }
  int loaded = 0;
  for (uint32_t pos = pivot; pos-- > 0 && loaded < kProducerCandidates;) {
    if (paired[pos]) continue;
    ++loaded;
    std::optional<OpDetail> d = details->Find(rank, lane.lane, lane.ops[pos].op_index);
    if (!d) continue;
    for (const TensorInfo& out : d->outputs) {
      if (std::find(wanted.begin(), wanted.end(), out.fingerprint) != wanted.end()) {
        return MakeOpView(rank, lane.lane, lane.ops[pos], details, strings);
      }
    }
  }
  return std::nullopt;
}

// The dtype and shape of each of `side`'s differing input tensors.
std::vector<std::pair<std::string, std::vector<int64_t>>> DifferingInputLayouts(const OpView& side,
                                                                                const OpView& other) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  ForEachDifferingInput(side, other, [&out](const TensorView& t) { out.emplace_back(t.dtype, t.shape); });
  return out;
}

// Trusted mode: the latest paired trusted op before pair `pivot` (suspect
// side) with an output of a layout in `wanted`. Its output was not
// fingerprinted, so this is a candidate, not a proof: the differing input
// may also come from an earlier trusted op of the same layout, another lane
// or a collective.
std::optional<OpView> FindTrustedCandidate(const LaneWork& w, size_t pivot,
                                           const std::vector<std::pair<std::string, std::vector<int64_t>>>& wanted,
                                           uint32_t rank, const DetailSource* details,
                                           const StringResolver* strings) {
  if (details == nullptr || wanted.empty()) return std::nullopt;
  int loaded = 0;
  for (size_t k = pivot; k-- > 0 && loaded < kProducerCandidates;) {
    const OpEvent& se = w.sus->ops[w.al.pairs[k].sus];
    if (!se.trusted() && !w.ref->ops[w.al.pairs[k].ref].trusted()) continue;
    ++loaded;
    std::optional<OpDetail> d = details->Find(rank, w.lane, se.op_index);
    if (!d) continue;
    for (const TensorInfo& out : d->outputs) {
      for (const auto& [dtype, shape] : wanted) {
        if (dtype == DTypeName(out.dtype) && shape == out.shape) {
          return MakeOpView(rank, w.lane, se, details, strings);
        }
      }
    }
  }
  return std::nullopt;
}

FirstDivergence MakeDivergence(const LaneWork& w, uint32_t ref_rank, uint32_t sus_rank,
                               const DiffContext& ctx) {
  const Pair& p = w.al.pairs[*w.pivot];
  const OpEvent& re = w.ref->ops[p.ref];
  const OpEvent& se = w.sus->ops[p.sus];
  FirstDivergence fd;
  fd.rank = sus_rank;
  fd.lane = w.lane;
  fd.step = se.step;
  fd.reference = MakeOpView(ref_rank, w.lane, re, ctx.reference_details, ctx.reference_strings);
  fd.suspect = MakeOpView(sus_rank, w.lane, se, ctx.suspect_details, ctx.suspect_strings);
  fd.op = fd.suspect.op;
  fd.inputs_equal = re.inputs == se.inputs;
  fd.code_changed = (p.flags & Pair::kChangedSite) != 0;
  if (fd.reference.detail_available && fd.suspect.detail_available) {
    size_t a = fd.reference.outputs.size(), b = fd.suspect.outputs.size();
    for (size_t k = 0; k < std::max(a, b); ++k) {
      if (k >= a || k >= b || !(fd.reference.outputs[k].fingerprint == fd.suspect.outputs[k].fingerprint)) {
        fd.differing_outputs.push_back(static_cast<uint32_t>(k));
      }
    }
    if (!fd.inputs_equal) {
      fd.producer = FindUnpairedProducer(*w.sus, w.al.pairs, false, p.sus, DifferingInputs(fd.suspect, fd.reference),
                                         sus_rank, ctx.suspect_details, ctx.suspect_strings);
      fd.producer_run = "suspect";
      if (!fd.producer) {
        fd.producer = FindUnpairedProducer(*w.ref, w.al.pairs, true, p.ref, DifferingInputs(fd.reference, fd.suspect),
                                           ref_rank, ctx.reference_details, ctx.reference_strings);
        fd.producer_run = fd.producer ? "reference" : "";
      }
      if (!fd.producer && w.skipped_trusted > 0) {
        fd.trusted_candidate = FindTrustedCandidate(w, *w.pivot, DifferingInputLayouts(fd.suspect, fd.reference),
                                                    sus_rank, ctx.suspect_details, ctx.suspect_strings);
      }
    }
  }
  fd.trusted_before = w.skipped_trusted;
  return fd;
}

// Positions < limit of one side that no pair covers. Each position is in at
// most one pair, so counting the pairs below the limit is enough.
uint64_t UnalignedBefore(const std::vector<Pair>& pairs, size_t total, bool ref_side, uint32_t limit) {
  uint64_t covered = 0;
  for (const Pair& p : pairs) covered += (ref_side ? p.ref : p.sus) < limit ? 1 : 0;
  return std::min<uint64_t>(total, limit) - covered;
}

}  // namespace

Result<RankDiff> DiffRank(const RankTrace& ref, const RankTrace& sus, const DiffContext& ctx) {
  OPGUARD_RETURN_IF_ERROR(ValidateLanes(ref, "reference"));
  OPGUARD_RETURN_IF_ERROR(ValidateLanes(sus, "suspect"));
  auto validate_order = [&ref, &sus] {
    Status s = ValidateOrder(ref, "reference");
    return s.ok() ? ValidateOrder(sus, "suspect") : s;
  };
  // Alignment reads keys only; nothing it computes leaves before the order
  // is known to be fine.
  std::future<Status> order;
  if (OpCount(ref) + OpCount(sus) >= kConcurrentOrderCheckOps) {
    order = std::async(std::launch::async, validate_order);
  } else {
    OPGUARD_RETURN_IF_ERROR(validate_order());
  }
  const DiffOptions& opt = ctx.options;

  std::set<uint32_t> lane_ids;
  for (const LaneTrace& l : ref.lanes) lane_ids.insert(l.lane);
  for (const LaneTrace& l : sus.lanes) lane_ids.insert(l.lane);
  for (const Gap& g : ref.gaps) lane_ids.insert(g.lane);
  for (const Gap& g : sus.gaps) lane_ids.insert(g.lane);

  RankDiff out;
  out.rank = sus.rank;
  std::vector<LaneWork> work;
  work.reserve(lane_ids.size());
  for (uint32_t id : lane_ids) {
    OPGUARD_RETURN_IF_ERROR(CheckCancel(ctx.cancel));
    LaneWork& w = work.emplace_back();
    w.lane = id;
    w.ref = FindLane(ref, id);
    w.sus = FindLane(sus, id);
    if (w.ref && w.sus) w.al = AlignLane(w.ref->ops, w.sus->ops, opt.align);
  }
  if (order.valid()) OPGUARD_RETURN_IF_ERROR(order.get());
  for (LaneWork& w : work) {
    const uint32_t id = w.lane;
    LaneDiff ld;
    ld.lane = id;
    ld.ref_ops = w.ref ? w.ref->ops.size() : 0;
    ld.sus_ops = w.sus ? w.sus->ops.size() : 0;
    if (w.ref && w.sus) {
      for (size_t k = 0; k < w.al.pairs.size(); ++k) {
        const Pair& p = w.al.pairs[k];
        const OpEvent& re = w.ref->ops[p.ref];
        const OpEvent& se = w.sus->ops[p.sus];
        // Preflight-nondeterministic ops are never evidence, either way.
        if (re.nondeterministic() || se.nondeterministic()) {
          ++w.skipped_nd;
          continue;
        }
        // Trusted ops carry no fingerprints: nothing to compare (a run
        // recorded in full mode against a trusted one compares only the
        // ops neither side trusted).
        if (re.trusted() || se.trusted()) {
          ++w.skipped_trusted;
          continue;
        }
        if (!(re.outputs == se.outputs)) {
          w.pivot = k;
          break;
        }
      }
      w.walked = w.pivot ? *w.pivot : w.al.pairs.size();
    } else if (ld.ref_ops + ld.sus_ops > 0) {
      out.notes.push_back("lane " + std::to_string(id) + " recorded only in the " +
                          (w.ref ? "reference" : "suspect") + " run: its ops are unaligned");
    }
    CheckGaps(w, ref.gaps, true, sus.rank, opt);
    CheckGaps(w, sus.gaps, false, sus.rank, opt);
    for (std::string& t : w.tolerated) out.notes.push_back(std::move(t));

    ld.aligned = w.al.pairs.size();
    ld.reordered = w.al.reordered;
    ld.unaligned_ref = ld.ref_ops - ld.aligned;
    ld.unaligned_sus = ld.sus_ops - ld.aligned;
    ld.largest_window = w.al.largest_window;
    ld.degraded = w.al.degraded;
    if (w.pivot) {
      const Pair& p = w.al.pairs[*w.pivot];
      ld.pivot_ref_op = w.ref->ops[p.ref].op_index;
      ld.pivot_sus_op = w.sus->ops[p.sus].op_index;
    }
    ld.status = !w.blocking.empty() ? DiffStatus::kIncomplete
                : w.pivot           ? DiffStatus::kDiverged
                                    : DiffStatus::kIdentical;
    for (const std::string& n : w.al.notes) out.notes.push_back("lane " + std::to_string(id) + ": " + n);
    out.aligned_total += ld.aligned;
    out.unaligned_total_ref += ld.unaligned_ref;
    out.unaligned_total_sus += ld.unaligned_sus;
    out.reordered += ld.reordered;
    out.skipped_nondeterministic += w.skipped_nd;
    out.skipped_trusted += w.skipped_trusted;
    out.lanes.push_back(ld);
  }

  // The rank's pivot: the earliest lane pivot by (step, start time, lane).
  // Details are fetched for candidate pivots only, never for whole traces.
  LaneWork* best = nullptr;
  for (LaneWork& w : work) {
    if (!w.pivot) continue;
    const OpEvent& se = w.sus->ops[w.al.pairs[*w.pivot].sus];
    if (ctx.suspect_details != nullptr) {
      if (auto d = ctx.suspect_details->Find(sus.rank, w.lane, se.op_index)) {
        w.sus_start_ns = d->start_ns;
        w.has_start = d->start_ns != 0;
      }
    }
    if (best == nullptr) {
      best = &w;
      continue;
    }
    const OpEvent& be = best->sus->ops[best->al.pairs[*best->pivot].sus];
    bool earlier = se.step != be.step ? se.step < be.step
                   : (w.has_start && best->has_start && w.sus_start_ns != best->sus_start_ns)
                       ? w.sus_start_ns < best->sus_start_ns
                       : w.lane < best->lane;
    if (earlier) best = &w;
  }

  // Missing records that could hide the real first divergence: on the pivot's
  // lane before the pivot, or on another lane no later (by step) than it.
  bool incomplete = false;
  for (LaneWork& w : work) {
    if (w.blocking.empty()) continue;
    bool blocks = true;
    if (best != nullptr && &w != best) {
      const Pair& bp = best->al.pairs[*best->pivot];
      uint64_t ref_step = best->ref->ops[bp.ref].step, sus_step = best->sus->ops[bp.sus].step;
      blocks = (w.min_gap_step_ref && *w.min_gap_step_ref <= ref_step) ||
               (w.min_gap_step_sus && *w.min_gap_step_sus <= sus_step);
    }
    if (blocks) {
      incomplete = true;
      out.missing.insert(out.missing.end(), w.blocking.begin(), w.blocking.end());
    } else {
      out.notes.push_back("lane " + std::to_string(w.lane) +
                          ": records missing only after the pivot's step; pivot stands");
    }
  }

  if (best != nullptr) {
    FirstDivergence fd = MakeDivergence(*best, ref.rank, sus.rank, ctx);
    const Pair& p = best->al.pairs[*best->pivot];
    out.aligned = best->walked;
    out.unaligned_before_ref = UnalignedBefore(best->al.pairs, best->ref->ops.size(), true, p.ref);
    out.unaligned_before_sus = UnalignedBefore(best->al.pairs, best->sus->ops.size(), false, p.sus);

    RankSummary& s = out.summary;
    s.lane = best->lane;
    s.step = fd.suspect.step;
    s.op_index = fd.suspect.op_index;
    std::map<uint64_t, CommPosition> comms;
    for (const CollectiveEvent& c : sus.collectives) {
      CommPosition& cp = comms[c.communicator];
      cp.communicator = c.communicator;
      Order o = CollectiveVsPivot(c, s.lane, s.op_index, s.step, best->has_start, best->sus_start_ns);
      int64_t seq = static_cast<int64_t>(c.seq);
      if (o == Order::kBefore) cp.last_seq_before = std::max(cp.last_seq_before, seq);
      if (o == Order::kAfter && (cp.first_seq_after < 0 || seq < cp.first_seq_after)) cp.first_seq_after = seq;
    }
    for (auto& [id, cp] : comms) s.comms.push_back(cp);

    if (incomplete) {
      out.status = DiffStatus::kIncomplete;
      out.first_observed = std::move(fd);
    } else {
      out.status = DiffStatus::kDiverged;
      out.first_divergence = std::move(fd);
    }
  } else {
    out.status = incomplete ? DiffStatus::kIncomplete : DiffStatus::kIdentical;
    out.aligned = out.aligned_total;
    out.unaligned_before_ref = out.unaligned_total_ref;
    out.unaligned_before_sus = out.unaligned_total_sus;
  }
  out.summary.rank = sus.rank;
  out.summary.status = out.status;
  return out;
}

Causality ExplainDivergences(const std::vector<RankSummary>& summaries) {
  Causality out;
  std::vector<const RankSummary*> diverged;
  for (const RankSummary& s : summaries) {
    if (s.status == DiffStatus::kDiverged) diverged.push_back(&s);
  }
  std::sort(diverged.begin(), diverged.end(),
            [](const RankSummary* a, const RankSummary* b) { return a->rank < b->rank; });
  // communicator -> (rank, first seq after its divergence) for senders.
  std::map<uint64_t, std::vector<std::pair<const RankSummary*, int64_t>>> senders;
  for (const RankSummary* q : diverged) {
    for (const CommPosition& cp : q->comms) {
      if (cp.first_seq_after >= 0) senders[cp.communicator].emplace_back(q, cp.first_seq_after);
    }
  }
  for (const RankSummary* r : diverged) {
    std::optional<Explanation> best;
    uint64_t best_step = 0;
    for (const CommPosition& cp : r->comms) {
      if (cp.last_seq_before < 0) continue;
      auto it = senders.find(cp.communicator);
      if (it == senders.end()) continue;
      for (const auto& [q, seq] : it->second) {
        if (q == r || seq > cp.last_seq_before) continue;
        // Prefer the earliest-diverged source, then the earliest collective.
        bool better = !best || q->step < best_step ||
                      (q->step == best_step && static_cast<uint64_t>(seq) < best->seq);
        if (better) {
          best = Explanation{r->rank, q->rank, cp.communicator, static_cast<uint64_t>(seq)};
          best_step = q->step;
        }
      }
    }
    if (best) {
      out.explained.push_back(*best);
    } else {
      out.diverging.push_back(r->rank);
    }
  }
  if (out.diverging.empty() && !diverged.empty()) {
    // Every diverged rank was reached by another: collective orders disagree
    // across communicators. Fall back to the earliest step rather than
    // answering "nobody".
    out.cyclic = true;
    uint64_t min_step = UINT64_MAX;
    for (const RankSummary* r : diverged) min_step = std::min(min_step, r->step);
    for (const RankSummary* r : diverged) {
      if (r->step == min_step) out.diverging.push_back(r->rank);
    }
  }
  return out;
}

DiffReport MergeRankDiffs(std::vector<RankDiff> answers, const std::vector<uint32_t>& expected_ranks) {
  DiffReport out;
  std::sort(answers.begin(), answers.end(), [](const RankDiff& a, const RankDiff& b) { return a.rank < b.rank; });
  std::set<uint32_t> present;
  for (RankDiff& a : answers) {
    if (!present.insert(a.rank).second) {
      out.notes.push_back("rank " + std::to_string(a.rank) + " answered twice; first answer kept");
      continue;
    }
    out.ranks.push_back(std::move(a));
  }
  for (uint32_t r : std::set<uint32_t>(expected_ranks.begin(), expected_ranks.end())) {
    if (!present.count(r)) out.missing_ranks.push_back(r);
  }
  std::vector<RankSummary> summaries;
  bool any_diverged = false;
  for (const RankDiff& r : out.ranks) {
    summaries.push_back(r.summary);
    out.skipped_nondeterministic += r.skipped_nondeterministic;
    out.skipped_trusted += r.skipped_trusted;
    if (r.status == DiffStatus::kIncomplete) out.incomplete_ranks.push_back(r.rank);
    if (r.status == DiffStatus::kDiverged) any_diverged = true;
    for (const std::string& n : r.notes) out.notes.push_back("rank " + std::to_string(r.rank) + ": " + n);
  }
  Causality c = ExplainDivergences(summaries);
  out.diverging_ranks = c.diverging;
  out.explained = c.explained;
  if (c.cyclic) {
    out.notes.push_back("every diverged rank is reachable from another through collectives; "
                        "reporting the ranks with the earliest step");
  }
  const RankDiff* first = nullptr;
  for (const RankDiff& r : out.ranks) {
    if (std::find(c.diverging.begin(), c.diverging.end(), r.rank) == c.diverging.end()) continue;
    if (first == nullptr || r.summary.step < first->summary.step) first = &r;
  }
  if (first != nullptr) {
    out.first_divergence = first->first_divergence;
    out.aligned = first->aligned;
    out.unaligned_before_ref = first->unaligned_before_ref;
    out.unaligned_before_sus = first->unaligned_before_sus;
  } else {
    for (const RankDiff& r : out.ranks) {
      out.aligned += r.aligned;
      out.unaligned_before_ref += r.unaligned_before_ref;
      out.unaligned_before_sus += r.unaligned_before_sus;
    }
  }
  if (!out.missing_ranks.empty()) {
    out.status = DiffStatus::kPartial;
  } else if (!out.incomplete_ranks.empty()) {
    // A rank with missing records may hide the true origin; the diverged
    // ranks' pivots are real but "first" is not certain.
    out.status = DiffStatus::kIncomplete;
  } else if (any_diverged) {
    out.status = DiffStatus::kDiverged;
  } else {
    out.status = DiffStatus::kIdentical;
  }
  return out;
}

}  // namespace opguard::aligner
