// Preflight: two self-replays of one job (same code, data and settings)
// compared op for op, to learn what a later diff must not take as evidence
// (docs/alignment.md, "Preflight").
//
//  * stable boundaries: ops both runs recorded, in order (alignment pairs);
//  * bitwise nondeterministic ops: pairs whose inputs are equal and whose
//    outputs differ. Same code, same bytes in, other bytes out: the op itself
//    does not compute the same bits twice (an atomic accumulation, a race).
//    They are named by structural key (OpEvent::key: op, boundary id, dtypes
//    and shapes), which a later run of the same code reproduces, so a diff can
//    mark its ops with OpEvent::kNondeterministic;
//  * downstream pairs: outputs differ because the inputs already did. Those
//    are consequences and are counted, not marked.
//
// Pure and thread-compatible, like diff.h: a daemon calls PreflightRank for
// each rank it holds (any thread) and MergePreflight over the answers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "opguard/aligner/diff.h"
#include "opguard/aligner/report.h"
#include "opguard/aligner/trace.h"

namespace opguard::aligner {

// One structural key found nondeterministic, at its first pair.
struct NondeterministicBoundary {
  uint64_t key = 0;  // OpEvent::key of run A's op (run B's when it differs: both listed)
  uint32_t rank = 0;
  uint32_t lane = 0;
  uint64_t step = 0;
  uint64_t op_index_a = 0;
  uint64_t op_index_b = 0;
  std::string op;      // resolved op name
  SiteInfo site;       // run A's call site
  uint64_t pairs = 0;  // nondeterministic pairs with this key on this rank
};

struct RankPreflight {
  uint32_t rank = 0;
  uint64_t ops_a = 0;  // compared ops (within max_steps)
  uint64_t ops_b = 0;
  uint64_t stable = 0;            // pairs: present in both runs, in order
  uint64_t equal = 0;             // pairs whose outputs agree bit for bit
  uint64_t nondeterministic = 0;  // pairs with equal inputs and differing outputs
  uint64_t downstream = 0;        // pairs whose outputs differ after their inputs did
  uint64_t skipped = 0;           // pairs already flagged (uninitialised memory) or trusted
  std::vector<NondeterministicBoundary> boundaries;  // by first pair, (step, lane) order
  // The earliest nondeterministic pair as a pivot view (reference = run A,
  // suspect = run B, inputs_equal true); nullopt when there is none.
  std::optional<FirstDivergence> first;
  std::vector<std::string> notes;  // gaps, lanes one run lacks, degraded alignment
};

// Compares `a` and `b` (the same rank of two self-replays), counting only ops
// of steps below `max_steps` (0: every step): a job stopped after N steps
// leaves a partly recorded last step that is not compared. ctx gives details
// and strings for the views (run A as reference, B as suspect), the
// alignment options and the cancel token; its tolerate_gaps option is unused.
// Fails only on malformed traces (as DiffRank).
Result<RankPreflight> PreflightRank(const RankTrace& a, const RankTrace& b, const DiffContext& ctx,
                                    uint64_t max_steps = 0);

struct PreflightReport {
  uint64_t stable = 0;
  uint64_t equal = 0;
  uint64_t nondeterministic = 0;
  uint64_t downstream = 0;
  // Every nondeterministic boundary of every rank, one entry per key (the
  // earliest pair's), by (step, rank, lane, op index).
  std::vector<NondeterministicBoundary> boundaries;
  std::optional<FirstDivergence> first;  // the earliest by (step, rank)
  std::vector<RankPreflight> ranks;      // ascending rank
  std::vector<std::string> notes;
};
PreflightReport MergePreflight(std::vector<RankPreflight> ranks);

// A plan applied to a trace: flags every op whose structural key is in
// `sorted_keys` (ascending) OpEvent::kNondeterministic, so DiffRank walks
// past it and counts it. Returns how many ops it flagged.
uint64_t MarkNondeterministic(RankTrace& trace, const std::vector<uint64_t>& sorted_keys);

}  // namespace opguard::aligner
