#include "opguard/aligner/preflight.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "opguard/aligner/align.h"
#include "lanes.h"
#include "view.h"

namespace opguard::aligner {
namespace {

// The lane's ops of steps below max_steps (0: all). Ops are in op order and
// steps never go back on a lane, but a filter costs no more than a search.
std::vector<OpEvent> Within(const LaneTrace& lane, uint64_t max_steps) {
  if (max_steps == 0) return lane.ops;
  std::vector<OpEvent> out;
  out.reserve(lane.ops.size());
  for (const OpEvent& e : lane.ops) {
    if (e.step < max_steps) out.push_back(e);
  }
  return out;
}

Status CheckTrace(const RankTrace& t, const char* which) {
  OPGUARD_RETURN_IF_ERROR(ValidateLanes(t, which));
  return ValidateOrder(t, which);
}

struct FirstPair {
  uint32_t lane = 0;
  OpEvent a, b;
};

FirstDivergence PivotView(const FirstPair& p, uint32_t rank_a, uint32_t rank_b,
                          const DiffContext& ctx) {
  FirstDivergence fd;
  fd.rank = rank_b;
  fd.lane = p.lane;
  fd.step = p.b.step;
  fd.reference = MakeOpView(rank_a, p.lane, p.a, ctx.reference_details, ctx.reference_strings);
  fd.suspect = MakeOpView(rank_b, p.lane, p.b, ctx.suspect_details, ctx.suspect_strings);
  fd.op = fd.suspect.op;
  fd.inputs_equal = true;
  if (fd.reference.detail_available && fd.suspect.detail_available) {
    const size_t na = fd.reference.outputs.size(), nb = fd.suspect.outputs.size();
    for (size_t k = 0; k < std::max(na, nb); ++k) {
      if (k >= na || k >= nb ||
          !(fd.reference.outputs[k].fingerprint == fd.suspect.outputs[k].fingerprint)) {
        fd.differing_outputs.push_back(static_cast<uint32_t>(k));
      }
    }
  }
  return fd;
}

}  // namespace

Result<RankPreflight> PreflightRank(const RankTrace& a, const RankTrace& b, const DiffContext& ctx,
                                    uint64_t max_steps) {
  OPGUARD_RETURN_IF_ERROR(CheckTrace(a, "run A"));
  OPGUARD_RETURN_IF_ERROR(CheckTrace(b, "run B"));
  RankPreflight out;
  out.rank = a.rank;
  std::set<uint32_t> lane_ids;
  for (const LaneTrace& l : a.lanes) lane_ids.insert(l.lane);
  for (const LaneTrace& l : b.lanes) lane_ids.insert(l.lane);
  if (!a.gaps.empty() || !b.gaps.empty()) {
    // What was dropped was not compared: a nondeterministic op in there is
    // not in the plan.
    out.notes.push_back("rank " + std::to_string(a.rank) + ": records missing in " +
                        (a.gaps.empty()   ? "run B"
                         : b.gaps.empty() ? "run A"
                                          : "both runs") +
                        "; ops in the gaps were not compared");
  }
  std::map<uint64_t, size_t> by_key;  // key -> index in out.boundaries
  std::optional<FirstPair> first;
  for (uint32_t id : lane_ids) {
    OPGUARD_RETURN_IF_ERROR(CheckCancel(ctx.cancel));
    const LaneTrace* la = FindLane(a, id);
    const LaneTrace* lb = FindLane(b, id);
    if (la == nullptr || lb == nullptr) {
      out.notes.push_back("rank " + std::to_string(a.rank) + " lane " + std::to_string(id) +
                          " recorded only in run " + (la ? "A" : "B") + ": not compared");
      continue;
    }
    const std::vector<OpEvent> ops_a = Within(*la, max_steps), ops_b = Within(*lb, max_steps);
    out.ops_a += ops_a.size();
    out.ops_b += ops_b.size();
    const Alignment al = AlignLane(ops_a, ops_b, ctx.options.align);
    for (const std::string& n : al.notes)
      out.notes.push_back("lane " + std::to_string(id) + ": " + n);
    out.stable += al.pairs.size();
    for (const Pair& p : al.pairs) {
      const OpEvent& ea = ops_a[p.ref];
      const OpEvent& eb = ops_b[p.sus];
      if (ea.nondeterministic() || eb.nondeterministic() || ea.trusted() || eb.trusted()) {
        ++out.skipped;
        continue;
      }
      if (ea.outputs == eb.outputs) {
        ++out.equal;
        continue;
      }
      if (!(ea.inputs == eb.inputs)) {
        ++out.downstream;
        continue;
      }
      ++out.nondeterministic;
      if (!first || std::tie(ea.step, id) < std::tie(first->a.step, first->lane)) {
        first = FirstPair{id, ea, eb};
      }
      for (uint64_t key : {ea.key, eb.key}) {
        auto [it, added] = by_key.emplace(key, out.boundaries.size());
        if (added) {
          NondeterministicBoundary nb;
          nb.key = key;
          nb.rank = a.rank;
          nb.lane = id;
          nb.step = ea.step;
          nb.op_index_a = ea.op_index;
          nb.op_index_b = eb.op_index;
          nb.op = ResolveString(ctx.reference_strings, ea.name);
          nb.site = ResolveSite(ctx.reference_strings, ea.site);
          out.boundaries.push_back(std::move(nb));
        }
        ++out.boundaries[it->second].pairs;
        if (ea.key == eb.key) break;
      }
    }
  }
  std::stable_sort(out.boundaries.begin(), out.boundaries.end(),
                   [](const NondeterministicBoundary& x, const NondeterministicBoundary& y) {
                     return std::tie(x.step, x.lane, x.op_index_a) <
                            std::tie(y.step, y.lane, y.op_index_a);
                   });
  if (first) out.first = PivotView(*first, a.rank, b.rank, ctx);
  return out;
}

PreflightReport MergePreflight(std::vector<RankPreflight> ranks) {
  std::sort(ranks.begin(), ranks.end(),
            [](const RankPreflight& x, const RankPreflight& y) { return x.rank < y.rank; });
  PreflightReport out;
  std::set<uint64_t> keys;
  for (const RankPreflight& r : ranks) {
    out.stable += r.stable;
    out.equal += r.equal;
    out.nondeterministic += r.nondeterministic;
    out.downstream += r.downstream;
    for (const auto& nb : r.boundaries) out.boundaries.push_back(nb);
    out.notes.insert(out.notes.end(), r.notes.begin(), r.notes.end());
    if (r.first && (!out.first || r.first->step < out.first->step)) out.first = r.first;
  }
  std::stable_sort(out.boundaries.begin(), out.boundaries.end(),
                   [](const NondeterministicBoundary& x, const NondeterministicBoundary& y) {
                     return std::tie(x.step, x.rank, x.lane, x.op_index_a) <
                            std::tie(y.step, y.rank, y.lane, y.op_index_a);
                   });
  // One entry per key: the same boundary on several ranks is one boundary of
  // the plan (its pair counts add up).
  std::vector<NondeterministicBoundary> unique;
  std::map<uint64_t, size_t> at;
  for (auto& nb : out.boundaries) {
    auto [it, added] = at.emplace(nb.key, unique.size());
    if (added) {
      unique.push_back(std::move(nb));
    } else {
      unique[it->second].pairs += nb.pairs;
    }
  }
  out.boundaries = std::move(unique);
  out.ranks = std::move(ranks);
  return out;
}

uint64_t MarkNondeterministic(RankTrace& trace, const std::vector<uint64_t>& sorted_keys) {
  uint64_t marked = 0;
  if (sorted_keys.empty()) return marked;
  for (LaneTrace& lane : trace.lanes) {
    for (OpEvent& e : lane.ops) {
      if (std::binary_search(sorted_keys.begin(), sorted_keys.end(), e.key)) {
        e.flags |= OpEvent::kNondeterministic;
        ++marked;
      }
    }
  }
  return marked;
}

}  // namespace opguard::aligner
