// The value format of the meta column family: run metadata and per-rank
// state as JSON (small, rarely written, readable with ldb when debugging).
// Private to the storage room (store.cc and its tests).
#pragma once

#include <nlohmann/json.hpp>

#include "registry/run_state.h"

namespace opguard::daemon {

nlohmann::json RankToJson(const RankState& r);
RankState RankFromJson(const nlohmann::json& j);
// Run metadata without ranks (ranks are stored under their own keys).
nlohmann::json RunMetaToJson(const RunState& r);
RunState RunMetaFromJson(const nlohmann::json& j);

}  // namespace opguard::daemon
