#include "query/alignment_view.h"

#include <algorithm>
#include <future>
#include <set>

#include "opguard/aligner/diff.h"

namespace opguard::daemon {
namespace {

constexpr size_t kCachedViews = 2;  // a viewer flips between two lanes or ranks

std::string CacheKey(const RunState& ref, const RunState& sus, uint32_t rank, uint32_t lane) {
  auto ops = [rank](const RunState& run) {
    auto it = run.ranks.find(rank);
    return it == run.ranks.end() ? uint64_t{0} : it->second.ops;
  };
  return std::to_string(ref.id) + "/" + std::to_string(sus.id) + "/" + std::to_string(rank) + "/" +
         std::to_string(lane) + "/" + std::to_string(ops(ref)) + "/" + std::to_string(ops(sus));
}

// Pairs in reference order, with each side's unpaired ops placed before the
// first pair that follows them in that run.
void BuildRows(const aligner::Alignment& a, AlignmentView* v) {
  std::vector<bool> sus_paired(v->sus.ops.size());
  for (const auto& p : a.pairs) sus_paired[p.sus] = true;
  int64_t next_ref = 0, next_sus = 0;
  auto sus_until = [&](int64_t end) {
    for (; next_sus < end; ++next_sus) {
      if (!sus_paired[next_sus]) v->rows.push_back({-1, next_sus, 0});
    }
  };
  for (const auto& p : a.pairs) {
    for (; next_ref < p.ref; ++next_ref) v->rows.push_back({next_ref, -1, 0});
    next_ref = p.ref + 1;
    sus_until(p.sus);
    const auto& r = v->ref.ops[p.ref];
    const auto& s = v->sus.ops[p.sus];
    uint32_t flags = p.flags;
    // Trusted ops (recorded without fingerprints) are never compared.
    if (!(r.outputs == s.outputs) && !r.trusted() && !s.trusted()) {
      flags |= AlignmentView::kDiffers;
      if (v->first_differing_row < 0 && !r.nondeterministic() && !s.nondeterministic()) {
        v->first_differing_row = static_cast<int64_t>(v->rows.size());
      }
    }
    v->rows.push_back({p.ref, p.sus, flags});
  }
  for (; next_ref < static_cast<int64_t>(v->ref.ops.size()); ++next_ref)
    v->rows.push_back({next_ref, -1, 0});
  sus_until(static_cast<int64_t>(v->sus.ops.size()));
  v->pairs = a.pairs.size();
}

nlohmann::json OpJson(const aligner::OpEvent& e, const StoreStrings& strings) {
  auto text = [&](uint64_t id) -> nlohmann::json {
    auto s = strings.String(id);
    if (!s) return nullptr;
    return *s;
  };
  nlohmann::json site = nullptr;
  if (auto s = strings.SiteOf(e.site)) {
    site = {{"file", text(s->file)}, {"line", s->line}, {"function", text(s->function)}};
  }
  return {{"op_index", e.op_index},
          {"step", e.step},
          {"name", text(e.name)},
          {"site", site},
          {"nondeterministic", e.nondeterministic()},
          {"trusted", e.trusted()}};
}

}  // namespace

Result<std::shared_ptr<const AlignmentView>> AlignmentViews::Get(const RunState& ref,
                                                                 const RunState& sus, uint32_t rank,
                                                                 uint32_t lane,
                                                                 const CancelToken* cancel) {
  const std::string key = CacheKey(ref, sus, rank, lane);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first == key) {
        cache_.splice(cache_.begin(), cache_, it);
        return it->second;
      }
    }
  }
  if (!ref.ranks.count(rank) || !sus.ranks.count(rank)) {
    return NotFound("rank " + std::to_string(rank) + " is not held here for both '" + ref.name +
                    "' and '" + sus.name + "'");
  }
  RunReader ref_reader(store_, ref, traces_), sus_reader(store_, sus, traces_);
  auto ref_loading = std::async(std::launch::async, [&] { return ref_reader.Rank(rank, cancel); });
  auto sus_loaded = sus_reader.Rank(rank, cancel);
  auto ref_loaded = ref_loading.get();
  OPGUARD_ASSIGN_OR_RETURN(SharedTrace ref_trace, std::move(ref_loaded));
  OPGUARD_ASSIGN_OR_RETURN(SharedTrace sus_trace, std::move(sus_loaded));
  auto view = std::make_shared<AlignmentView>(store_, ref.id, sus.id);
  std::set<uint32_t> lanes;
  bool found = false;
  for (const bool reference : {true, false}) {
    for (const auto& l : (reference ? ref_trace : sus_trace)->lanes) {
      lanes.insert(l.lane);
      if (l.lane != lane) continue;
      found = true;
      (reference ? view->ref : view->sus) = l;  // a copy: the cache keeps its own
    }
  }
  if (!found)
    return NotFound("rank " + std::to_string(rank) + " has no lane " + std::to_string(lane));
  view->lanes.assign(lanes.begin(), lanes.end());
  view->ref.lane = view->sus.lane = lane;
  // The options DiffRank uses by default, so rows pair what `diff` pairs.
  BuildRows(aligner::AlignLane(view->ref.ops, view->sus.ops, aligner::DiffOptions{}.align),
            view.get());
  std::lock_guard<std::mutex> lock(mu_);
  cache_.emplace_front(key, view);
  if (cache_.size() > kCachedViews) cache_.pop_back();
  return std::shared_ptr<const AlignmentView>(view);
}

nlohmann::json AlignmentPageJson(const AlignmentView& v, uint64_t from, uint64_t count,
                                 std::optional<uint64_t> locate_sus) {
  nlohmann::json rows = nlohmann::json::array();
  const uint64_t end = std::min<uint64_t>(v.rows.size(), from + count);
  for (uint64_t i = from; i < end; ++i) {
    const auto& row = v.rows[i];
    nlohmann::json flags = nlohmann::json::array();
    if (row.flags & aligner::Pair::kReordered) flags.push_back("reordered");
    if (row.flags & aligner::Pair::kChangedSite) flags.push_back("changed_site");
    if (row.flags & aligner::Pair::kByData) flags.push_back("by_data");
    const bool paired = row.ref >= 0 && row.sus >= 0;
    const bool trusted = paired && (v.ref.ops[row.ref].trusted() || v.sus.ops[row.sus].trusted());
    rows.push_back(
        {{"row", i},
         {"reference", row.ref >= 0 ? OpJson(v.ref.ops[row.ref], v.ref_strings) : nullptr},
         {"suspect", row.sus >= 0 ? OpJson(v.sus.ops[row.sus], v.sus_strings) : nullptr},
         {"link", !paired                                 ? "unaligned"
                  : (row.flags & AlignmentView::kDiffers) ? "differs"
                  : trusted                               ? "trusted"  // paired, never compared
                                                          : "equal"},
         {"flags", flags}});
  }
  nlohmann::json located = nullptr;
  if (locate_sus) {
    for (size_t i = 0; i < v.rows.size(); ++i) {
      const auto& row = v.rows[i];
      if (row.sus >= 0 && v.sus.ops[row.sus].op_index == *locate_sus) {
        located = i;
        break;
      }
    }
  }
  return {{"lane", v.ref.lane},
          {"lanes", v.lanes},
          {"rows_total", v.rows.size()},
          {"pairs", v.pairs},
          {"ops", {{"reference", v.ref.ops.size()}, {"suspect", v.sus.ops.size()}}},
          {"first_differing_row",
           v.first_differing_row >= 0 ? nlohmann::json(v.first_differing_row) : nullptr},
          {"located", located},
          {"from", from},
          {"rows", rows}};
}

}  // namespace opguard::daemon
