// Two-run diff: the first divergent op of each rank, then the first diverging
// rank(s) of the cluster (docs/alignment.md).
//
// Daemon flow for `opguard diff REF SUSPECT`:
//   1. each daemon, for each rank it holds: DiffRank(ref_trace, sus_trace, ctx)
//      -> RankDiff (small: pivots, counts, per-communicator positions);
//   2. it ships the RankDiff answers to the receiving daemon as FlatBuffers
//      (wire::RankDiff, daemon's report_wire.h);
//   3. the receiver calls MergeRankDiffs(answers, expected_ranks), which
//      applies collective-aware causality and marks missing ranks `partial`.
// All functions are pure and thread-compatible: call them from any thread,
// several ranks in parallel if wanted.
#pragma once

#include <cstdint>
#include <vector>

#include "opguard/aligner/align.h"
#include "opguard/aligner/report.h"
#include "opguard/aligner/trace.h"
#include "opguard/common/cancel.h"
#include "opguard/common/status.h"

namespace opguard::aligner {

struct DiffOptions {
  AlignOptions align;
  // A gap (missing records) before the pivot makes the rank `incomplete`.
  // When > 0, gaps that end more than this many certified pairs before the
  // pivot are tolerated instead (noted in the report). 0: never tolerated.
  uint64_t tolerate_gaps_older_than = 0;
};

// What DiffRank may consult besides the compact traces. Any pointer may be
// null: reports then show ids in hex / views without detail.
struct DiffContext {
  const DetailSource* reference_details = nullptr;
  const DetailSource* suspect_details = nullptr;
  const StringResolver* reference_strings = nullptr;
  const StringResolver* suspect_strings = nullptr;
  DiffOptions options;
  // Checked before each lane is aligned (a lane's alignment is bounded by
  // AlignOptions): a cancelled diff returns the token's error.
  const CancelToken* cancel = nullptr;
};

// Aligns every lane of `sus` against the same lane of `ref`, walks the pairs
// and reports the rank's first divergence. `ref.rank` and `sus.rank` may
// differ (replica comparison). Fails only on malformed input (op indices not
// ascending within a lane, duplicate lanes, > 2^32 ops in a lane). Long
// traces have their op order checked on a second thread, next to the
// alignment.
Result<RankDiff> DiffRank(const RankTrace& ref, const RankTrace& sus, const DiffContext& ctx);

// Collective-aware causality over per-rank summaries (any subset of ranks):
// a diverged rank r is explained by rank q via collective (C, s) when both are
// members of C, q diverged before it took part in s, and r took part in s at
// or before its own first divergence. Returns the explanations; the diverged
// ranks not explained are `diverging` (ascending).
struct Causality {
  std::vector<uint32_t> diverging;
  std::vector<Explanation> explained;
  bool cyclic = false;  // every diverged rank was explained by another; see docs
};
Causality ExplainDivergences(const std::vector<RankSummary>& summaries);

// Merges per-rank answers from any number of daemons into the cluster answer.
// `expected_ranks` empty: whatever answered is everything. Ranks expected but
// absent are listed in missing_ranks and make the status `partial`.
DiffReport MergeRankDiffs(std::vector<RankDiff> answers, const std::vector<uint32_t>& expected_ranks);

}  // namespace opguard::aligner
