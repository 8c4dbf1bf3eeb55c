// Internal: checks and look-ups over a rank's lanes, shared by the two-run
// diff and preflight.
#pragma once

#include <cstdint>

#include "opguard/aligner/trace.h"
#include "opguard/common/status.h"

namespace opguard::aligner {

// The lane with id `lane`, or null.
const LaneTrace* FindLane(const RankTrace& t, uint32_t lane);

// What AlignLane needs of a trace to be safe: each lane once, indexable by
// a Pair's 32-bit positions. `which` names the run in the error.
Status ValidateLanes(const RankTrace& t, const char* which);

// Ascending op indices on every lane: a pass over every op.
Status ValidateOrder(const RankTrace& t, const char* which);

}  // namespace opguard::aligner
