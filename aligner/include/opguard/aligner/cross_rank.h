// Cross-rank checks inside one run: collective matching (desyncs, outputs
// that must agree), live collective progress, data-parallel replicas.
//
// Collectives are small (tens of bytes each, far fewer than ops), so for a
// cluster query each daemon ships its ranks' collective summaries (grouped:
// identical records of several ranks travel once) and the coordinator runs
// CheckCollectives once; replicas are compared where their traces are (a
// daemon compares the replicas it holds).
#pragma once

#include <cstdint>
#include <vector>

#include "opguard/aligner/diff.h"
#include "opguard/aligner/report.h"
#include "opguard/aligner/trace.h"
#include "opguard/common/status.h"

namespace opguard::aligner {

struct RankCollectives {
  uint32_t rank = 0;
  std::vector<CollectiveEvent> events;
};

// Matches collectives by (communicator, seq) across member ranks; reports
// desyncs, output mismatches of all-reduce / all-gather / broadcast, and the
// live state of every communicator. `communicators` gives membership (a
// communicator without a definition takes the ranks seen in its records);
// `expected_ranks` non-empty: ranks absent from `ranks` make it `partial`.
CollectivesReport CheckCollectives(const std::vector<RankCollectives>& ranks,
                                   const std::vector<Communicator>& communicators,
                                   const StringResolver* strings,
                                   const std::vector<uint32_t>& expected_ranks = {});

// Compares ranks that must compute identical bits (data-parallel replicas,
// or any ranks the caller says should agree) op by op, each against the
// lowest rank of `replicas`. When any trace has ops marked replicated
// (OpEvent::kReplicated: the optimizer's step, regions the program marked),
// only those are compared; otherwise whole traces are. ctx's reference and
// suspect sources both refer to the one run. Names the ranks outside the
// majority at the earliest pivot.
Result<ReplicaReport> CompareReplicas(const std::vector<const RankTrace*>& replicas,
                                      const DiffContext& ctx);

}  // namespace opguard::aligner
