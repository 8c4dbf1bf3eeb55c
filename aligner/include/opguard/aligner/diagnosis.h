// The written diagnosis: the most likely kind of cause of a two-run
// divergence, from the evidence already in the report, by rules anyone can
// read (docs/report-format.md, "Diagnosis"). The first rule that applies
// decides; each names the op, line and rank it blames. Pure: the daemon's
// HTTP answer, the CLI and the viewer all render the same result.
#pragma once

#include <optional>
#include <string>

#include "opguard/aligner/report.h"

namespace opguard::aligner {

struct Diagnosis {
  // Stable identifier of the rule that fired: "missing_records",
  // "replica_state", "code_edit", "suspect_recording", "algorithm_selection", "op_itself",
  // "unpaired_producer", "trusted_producer", "unrecorded_producer".
  std::string cause;
  std::string text;  // one or two sentences, with the ops, lines and ranks
  // Set when the first divergence reached other ranks through collectives:
  // they diverged because of it, not on their own.
  std::string spread;
};

// nullopt when the runs are identical (nothing to diagnose).
std::optional<Diagnosis> Diagnose(const DiffReport& report);

// Ops that only move or reinterpret bits (views, transposes, copies,
// concatenations): equal inputs cannot give them different outputs, so such
// a pivot says the recording is wrong, not the op. `op` may carry the
// backward node's suffix ("aten::t [MmBackward0]").
bool MovesDataOnly(const std::string& op);

}  // namespace opguard::aligner
