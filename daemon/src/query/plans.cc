#include "query/plans.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "opguard/aligner/render.h"
#include "query/trace_cache.h"

namespace opguard::daemon {
namespace {

using nlohmann::json;

constexpr int kPlanFormat = 1;

std::string KeyHex(uint64_t key) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(key));
  return buf;
}

std::optional<uint64_t> ParseKeyHex(const std::string& hex) {
  if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    return std::nullopt;
  return std::strtoull(hex.c_str(), nullptr, 16);
}

std::string Setting(const std::vector<std::pair<std::string, std::string>>& kv,
                    const std::string& key) {
  for (const auto& [k, v] : kv) {
    if (k == key) return v;
  }
  return "(unset)";
}

json SiteJson(const aligner::SiteInfo& s) {
  return json{{"file", s.file}, {"line", s.line}, {"function", s.function}, {"id", KeyHex(s.id)}};
}

json RankJson(const aligner::RankPreflight& r) {
  return json{{"rank", r.rank},
              {"ops", {{"a", r.ops_a}, {"b", r.ops_b}}},
              {"stable", r.stable},
              {"equal", r.equal},
              {"nondeterministic", r.nondeterministic},
              {"downstream", r.downstream},
              {"skipped", r.skipped}};
}

// The pivot's own JSON (docs/report-format.md, FirstDivergence), from the
// renderer diff uses: the first nondeterministic op reads like a pivot.
json PivotJson(const std::optional<aligner::FirstDivergence>& first) {
  if (!first) return nullptr;
  aligner::DiffReport r;
  r.first_divergence = first;
  return aligner::ToJson(r)["first_divergence"];
}

}  // namespace

PlanConfig PlanConfig::Of(const RunState& run) {
  PlanConfig c;
  c.world_size = run.world_size;
  for (const auto& [k, v] : run.versions) {
    if (k == "torch") c.torch = v;
  }
  c.determinism = run.determinism;
  std::sort(c.determinism.begin(), c.determinism.end());
  return c;
}

json PlanConfig::ToJson() const {
  json d = json::object();
  for (const auto& [k, v] : determinism) d[k] = v;
  return json{{"world_size", world_size}, {"torch", torch}, {"determinism", d}};
}

PlanConfig PlanConfig::FromJson(const json& j) {
  PlanConfig c;
  c.world_size = j.at("world_size").get<uint32_t>();
  c.torch = j.at("torch").get<std::string>();
  for (const auto& [k, v] : j.at("determinism").items())
    c.determinism.emplace_back(k, v.get<std::string>());
  std::sort(c.determinism.begin(), c.determinism.end());
  return c;
}

std::optional<std::string> ConfigDifference(const PlanConfig& expected, const std::string& run_name,
                                            const PlanConfig& run) {
  const std::string in_run = ", run '" + run_name + "' ";
  if (expected.world_size != run.world_size) {
    return "world size " + std::to_string(expected.world_size) + in_run + "has " +
           std::to_string(run.world_size);
  }
  if (expected.torch != run.torch) {
    return "torch " + (expected.torch.empty() ? std::string("(unknown)") : expected.torch) +
           in_run + "ran " + (run.torch.empty() ? std::string("(unknown)") : run.torch);
  }
  // The first determinism setting (by name) that one of them applied
  // otherwise or not at all.
  std::vector<std::string> names;
  for (const auto& [k, v] : expected.determinism) names.push_back(k);
  for (const auto& [k, v] : run.determinism) names.push_back(k);
  std::sort(names.begin(), names.end());
  for (const std::string& k : names) {
    const std::string e = Setting(expected.determinism, k), r = Setting(run.determinism, k);
    if (e != r) return "determinism " + k + "=" + e + in_run + "applied " + k + "=" + r;
  }
  return std::nullopt;
}

std::optional<std::string> ConfigMismatch(const std::string& plan_name, const PlanConfig& plan,
                                          const std::string& run_name, const PlanConfig& run) {
  auto difference = ConfigDifference(plan, run_name, run);
  if (!difference) return std::nullopt;
  return "plan '" + plan_name + "' was made for " + *difference;
}

Status CheckPlanName(const std::string& name) {
  const bool printable = std::all_of(name.begin(), name.end(), [](char c) {
    return c > ' ' && c < 127 && c != '/' && c != '?' && c != '#' && c != '%' && c != '\\';
  });
  if (name.empty() || name.size() > 200 || !printable) {
    return InvalidArgument("invalid plan name '" + name +
                           "' (1..200 printable bytes without '/', '?', '#', '%', '\\' or spaces)");
  }
  return Status::Ok();
}

json MakePlan(const PlanInputs& in, const aligner::PreflightReport& report) {
  json boundaries = json::array(), ranks = json::array();
  for (const auto& b : report.boundaries) {
    boundaries.push_back(json{{"key", KeyHex(b.key)},
                              {"op", b.op},
                              {"site", SiteJson(b.site)},
                              {"rank", b.rank},
                              {"lane", b.lane},
                              {"step", b.step},
                              {"op_index", {{"a", b.op_index_a}, {"b", b.op_index_b}}},
                              {"pairs", b.pairs}});
  }
  for (const auto& r : report.ranks) ranks.push_back(RankJson(r));
  const PlanConfig config = PlanConfig::Of(*in.run_a);
  return json{{"format", kPlanFormat},
              {"kind", "plan"},
              {"name", in.name},
              {"created_ns", in.created_ns},
              {"owner_uid", in.owner_uid},
              {"runs",
               {{{"name", in.run_a->name}, {"config", config.ToJson()}},
                {{"name", in.run_b->name}, {"config", PlanConfig::Of(*in.run_b).ToJson()}}}},
              {"config", config.ToJson()},
              {"max_steps", in.max_steps},
              {"stable", report.stable},
              {"equal", report.equal},
              {"nondeterministic", report.nondeterministic},
              {"downstream", report.downstream},
              {"boundaries", boundaries},
              {"first_nondeterministic", PivotJson(report.first)},
              {"ranks", ranks},
              {"notes", report.notes}};
}

Result<PlanUse> ReadPlanUse(const std::string& name, const json& plan) {
  try {
    PlanUse use;
    use.config = PlanConfig::FromJson(plan.at("config"));
    for (const auto& b : plan.at("boundaries")) {
      auto key = ParseKeyHex(b.at("key").get<std::string>());
      if (!key) return DataLoss("plan '" + name + "' is damaged: bad key " + b.at("key").dump());
      use.keys.push_back(*key);
    }
    std::sort(use.keys.begin(), use.keys.end());
    use.keys.erase(std::unique(use.keys.begin(), use.keys.end()), use.keys.end());
    return use;
  } catch (const std::exception& e) {
    return DataLoss("plan '" + name + "' is damaged: " + e.what());
  }
}

Result<aligner::PreflightReport> PreflightHere(const Store& store, TraceCache* traces,
                                               const RunState& a, const RunState& b,
                                               uint64_t max_steps, const CancelToken* cancel) {
  RunReader reader_a(&store, a, traces), reader_b(&store, b, traces);
  aligner::DiffContext ctx;
  ctx.reference_details = &reader_a.details();
  ctx.suspect_details = &reader_b.details();
  ctx.reference_strings = &reader_a.strings();
  ctx.suspect_strings = &reader_b.strings();
  ctx.cancel = cancel;
  std::vector<aligner::RankPreflight> ranks;
  std::vector<std::string> notes;
  const uint32_t world = std::max(a.world_size, b.world_size);
  for (uint32_t r = 0; r < std::max<uint32_t>(world, 1); ++r) {
    if (!a.ranks.count(r) || !b.ranks.count(r)) {
      notes.push_back("rank " + std::to_string(r) + ": not held here for both runs, not compared");
      continue;
    }
    OPGUARD_ASSIGN_OR_RETURN(SharedTrace ta, reader_a.Rank(r, cancel));
    OPGUARD_ASSIGN_OR_RETURN(SharedTrace tb, reader_b.Rank(r, cancel));
    OPGUARD_ASSIGN_OR_RETURN(auto p, aligner::PreflightRank(*ta, *tb, ctx, max_steps));
    ranks.push_back(std::move(p));
  }
  if (ranks.empty()) {
    return NotFound("runs '" + a.name + "' and '" + b.name + "' share no rank on this daemon");
  }
  aligner::PreflightReport report = aligner::MergePreflight(std::move(ranks));
  report.notes.insert(report.notes.begin(), notes.begin(), notes.end());
  return report;
}

Status PlanStore::Put(const json& plan, bool replace) {
  const std::string name = plan.at("name").get<std::string>();
  OPGUARD_RETURN_IF_ERROR(CheckPlanName(name));
  if (!replace && store_->GetPlan(name)) {
    return InvalidArgument("a plan named '" + name +
                           "' exists (--replace overwrites it; `opguard rm --plan " + name +
                           "` removes it)");
  }
  StoreBatch batch(store_);
  batch.PutPlan(name, plan.dump(-1, ' ', false, json::error_handler_t::replace));
  return store_->Write(&batch, /*sync=*/true);
}

Result<json> PlanStore::Get(const std::string& name) const { return LoadPlan(*store_, name); }

Result<json> LoadPlan(const Store& store, const std::string& name) {
  auto document = store.GetPlan(name);
  if (!document) return NotFound("no plan named '" + name + "' (see `opguard plans`)");
  try {
    return json::parse(*document);
  } catch (const std::exception& e) {
    return DataLoss("plan '" + name + "' is damaged: " + e.what());
  }
}

std::vector<json> PlanStore::List() const {
  std::vector<json> out;
  for (const auto& [name, document] : store_->ListPlans()) {
    json j = json::parse(document, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

Status PlanStore::Delete(const std::string& name) {
  if (!store_->GetPlan(name)) return NotFound("no plan named '" + name + "' (see `opguard plans`)");
  StoreBatch batch(store_);
  batch.DeletePlan(name);
  return store_->Write(&batch, /*sync=*/true);
}

}  // namespace opguard::daemon
