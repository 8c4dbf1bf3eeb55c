// The JSON of the daemon's own answers (docs/daemon.md, "HTTP API"):
// `opguard status --json` and GET /api/status, `opguard runs --json` and
// GET /api/runs[/NAME]. The daemon builds the FlatBuffers answer once and
// every face renders it here, so the CLI prints what HTTP serves.
// Pure functions, any thread.
#pragma once

#include <nlohmann/json.hpp>

#include "opguard/idl/envelope.h"

namespace opguard::daemon {

nlohmann::json StatusJson(const wire::StatusAnswer& a);
nlohmann::json RunJson(const wire::RunSummary& run);
nlohmann::json RunsJson(const wire::ListRunsAnswer& a);  // {"runs": [...]}

}  // namespace opguard::daemon
