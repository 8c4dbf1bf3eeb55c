// Preflight plans: what two self-replays of one job taught about it, stored
// by name next to the runs (meta column family, storage/store.h) so that
// later diffs of the same configuration skip its nondeterministic ops
// (docs/report-format.md, "opguard preflight"; docs/alignment.md,
// "Preflight").
//
// A plan is one JSON document, built here once and sent as it is to every
// front end (the CLI prints it or renders its text from it). It survives the
// runs it was made from: the runs may be removed once the plan is stored.
//
// Pure functions over values, except PlanStore, which reads and writes the
// store (any thread: RocksDB is thread-safe; the last writer of a name wins).
// Private to the query room.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "opguard/aligner/preflight.h"
#include "opguard/common/cancel.h"
#include "opguard/common/status.h"
#include "registry/run_state.h"
#include "storage/store.h"

namespace opguard::daemon {

// The settings that decide whether a run computes the bits its plan's runs
// computed: a plan is used only for runs that applied the same ones.
struct PlanConfig {
  uint32_t world_size = 0;
  std::string torch;  // versions["torch"]; "" when the run sent none
  std::vector<std::pair<std::string, std::string>> determinism;  // sorted by key

  static PlanConfig Of(const RunState& run);
  nlohmann::json ToJson() const;
  static PlanConfig FromJson(const nlohmann::json& j);
  friend bool operator==(const PlanConfig&, const PlanConfig&) = default;
};

// The first setting (world size, torch, then determinism settings by name)
// in which `run_config` of run `run_name` differs from `expected`, as
// "world size 2, run 'r' has 4"; nullopt when they are the same.
std::optional<std::string> ConfigDifference(const PlanConfig& expected, const std::string& run_name,
                                            const PlanConfig& run_config);
// Why a plan does not apply to a run, in one line: "plan 'p' was made for "
// and the difference; nullopt when the configurations are the same.
std::optional<std::string> ConfigMismatch(const std::string& plan_name, const PlanConfig& plan,
                                          const std::string& run_name,
                                          const PlanConfig& run_config);

// Plan names: what a run name may be, and a name the CLI can pass back.
Status CheckPlanName(const std::string& name);

struct PlanInputs {
  std::string name;
  const RunState* run_a = nullptr;
  const RunState* run_b = nullptr;
  uint64_t max_steps = 0;
  int64_t owner_uid = kUnknownOwner;
  uint64_t created_ns = 0;
};
// The plan document of a finished preflight (format in docs/report-format.md).
nlohmann::json MakePlan(const PlanInputs& in, const aligner::PreflightReport& report);

// What a diff needs of a stored plan.
struct PlanUse {
  PlanConfig config;
  std::vector<uint64_t> keys;  // structural keys of its nondeterministic boundaries, ascending
};
Result<PlanUse> ReadPlanUse(const std::string& name, const nlohmann::json& plan);

class TraceCache;

// Compares the ranks of `a` and `b` this daemon holds (both runs' records
// here), steps below `max_steps` (0: all); notes ranks it lacks. Blocks for
// as long as the alignment takes: aligner worker threads only.
Result<aligner::PreflightReport> PreflightHere(const Store& store, TraceCache* traces,
                                               const RunState& a, const RunState& b,
                                               uint64_t max_steps, const CancelToken* cancel);

// A stored plan's document, from any thread.
Result<nlohmann::json> LoadPlan(const Store& store, const std::string& name);

class PlanStore {
 public:
  explicit PlanStore(Store* store) : store_(store) {}
  // Stores `plan` under its name (durable when it returns OK). `replace`:
  // an existing plan of that name is overwritten, else refused.
  Status Put(const nlohmann::json& plan, bool replace);
  Result<nlohmann::json> Get(const std::string& name) const;
  std::vector<nlohmann::json> List() const;  // by name; damaged documents are skipped
  Status Delete(const std::string& name);

 private:
  Store* store_;
};

}  // namespace opguard::daemon
