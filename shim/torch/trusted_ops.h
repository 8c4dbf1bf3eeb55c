// Trusted mode (OPGUARD_TRUSTED): ops on an allow-list (GEMMs, elementwise
// math, views, as the opguard package's default list names them) are
// recorded without fingerprints: name, call site, dtypes and shapes only.
// Their bytes are never read, which is most of what a wide model's recording
// costs; the aligner does not compare them and, when a later op's inputs
// differ, names the latest trusted op that could have made them. Ops in the
// optimizer's step and other replicated regions are always fingerprinted:
// replicas are compared on them (`opguard ranks --replicas`).
#pragma once

#include <string>
#include <vector>

#include "thread_state.h"

namespace opguard::torch_adapter {

// Replaces the allow-list (fully qualified op names, "aten::mm"). Ops that
// start after the call see it.
void SetTrustedOps(std::vector<std::string> names);

// Whether op `name` (a RecordFunction name: its address is stable, so each
// thread remembers the answer by address) is on the allow-list.
bool IsTrustedOp(const char* name, ThreadState& ts);

}  // namespace opguard::torch_adapter
