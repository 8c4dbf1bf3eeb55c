// Report structures: what the aligner answers. Rendered as stable JSON
// (docs/report-format.md) and as short compiler-error-like text by render.h.
// Every string here is already resolved; reports carry no ids that need a
// string table (ids are kept alongside, in hex, for tools).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "opguard/aligner/trace.h"

namespace opguard::aligner {

enum class DiffStatus : uint8_t { kIdentical = 0, kDiverged, kIncomplete, kPartial };
const char* DiffStatusName(DiffStatus s);  // "identical" | "diverged" | "incomplete" | "partial"

struct SiteInfo {
  uint64_t id = 0;
  std::string file;      // "" when unknown
  uint32_t line = 0;
  std::string function;
};

struct TensorView {
  Fp128 fingerprint;
  std::string dtype;
  std::vector<int64_t> shape;
  std::optional<TensorStats> stats;
};

struct InputView {
  std::string kind;            // "none" | "tensor" | "scalar" | "tensor_list"
  std::vector<TensorView> tensors;  // one for "tensor", any for "tensor_list"
  uint64_t scalar_bits = 0;    // "scalar"
  std::string scalar_dtype;
};

// One side (reference or suspect) of a reported op.
struct OpView {
  uint32_t rank = 0;
  uint32_t lane = 0;
  uint64_t op_index = 0;
  uint64_t step = 0;
  std::string op;              // resolved op name
  SiteInfo site;
  // A backward op with its own site (a custom Function's backward, a
  // recompute): where its forward was called. id 0: none.
  SiteInfo forward_site;
  int64_t seq_nr = -1;
  bool backward = false;
  uint64_t start_ns = 0;
  bool detail_available = false;  // false: only the compact event was found
  bool trusted = false;        // recorded without fingerprints (trusted mode)
  std::vector<TensorView> outputs;
  std::vector<InputView> inputs;
  std::vector<std::string> kernels;
  Fp128 output_digest;
  Fp128 input_digest;
};

struct FirstDivergence {
  uint32_t rank = 0;           // the suspect's rank
  uint32_t lane = 0;
  uint64_t step = 0;           // the suspect's step
  std::string op;
  OpView reference;
  OpView suspect;
  bool inputs_equal = false;   // true: the op itself produced the difference
  // Paired across an edited line (align.h, kChangedSite): the code that ran
  // here differs between the runs, so the edit is what made the difference.
  bool code_changed = false;
  std::vector<uint32_t> differing_outputs;  // output positions whose fingerprints differ
  // Inputs differ: the recorded op without a partner, before the pivot, whose
  // output is one of the inputs that differ (the suspect run's, else the
  // reference's), when there is one. It was not compared (unaligned), so it
  // is where the difference entered: an op one run has and the other lacks.
  std::optional<OpView> producer;
  std::string producer_run;    // "suspect" | "reference"; empty without a producer
  // Trusted mode: paired trusted ops (recorded without fingerprints, so never
  // compared) walked on this lane before the pivot. When inputs differ and no
  // unpaired producer explains them, the difference may have entered in one
  // of those: the latest one (suspect run) with an output of the dtype and
  // shape of a differing input is named as the candidate.
  uint64_t trusted_before = 0;
  std::optional<OpView> trusted_candidate;
};

struct MissingRange {
  std::string run;             // "reference" | "suspect"
  uint32_t rank = 0;
  uint32_t lane = 0;
  uint64_t first_op = 0;
  uint64_t last_op = 0;
};

// Where a rank stands relative to one communicator, in the suspect run: the
// last collective it took part in at or before its first divergence (it may
// have received divergence there) and the first one after (it may have
// carried divergence out). Sequence numbers, -1 when none.
struct CommPosition {
  uint64_t communicator = 0;
  int64_t last_seq_before = -1;
  int64_t first_seq_after = -1;
};

// The part of a rank's answer that causality needs. O(communicators) in size;
// this is what peers send to the coordinator (with the pivot views).
struct RankSummary {
  uint32_t rank = 0;
  DiffStatus status = DiffStatus::kIdentical;
  uint32_t lane = 0;
  uint64_t step = 0;
  uint64_t op_index = 0;       // suspect op index of the first divergence
  std::vector<CommPosition> comms;
};

struct LaneDiff {
  uint32_t lane = 0;
  DiffStatus status = DiffStatus::kIdentical;
  uint64_t ref_ops = 0;
  uint64_t sus_ops = 0;
  uint64_t aligned = 0;        // pairs on this lane
  uint64_t reordered = 0;
  uint64_t unaligned_ref = 0;
  uint64_t unaligned_sus = 0;
  std::optional<uint64_t> pivot_ref_op;  // op indices of this lane's first mismatch
  std::optional<uint64_t> pivot_sus_op;
  uint64_t largest_window = 0;
  bool degraded = false;
};

// One rank's two-run answer.
struct RankDiff {
  uint32_t rank = 0;
  DiffStatus status = DiffStatus::kIdentical;  // identical | diverged | incomplete
  std::optional<FirstDivergence> first_divergence;  // status == diverged
  // status == incomplete: the first difference seen after missing records;
  // not a pivot (the real one may be in the missing range).
  std::optional<FirstDivergence> first_observed;
  uint64_t aligned = 0;        // pairs walked before the pivot on its lane (all pairs if none)
  uint64_t aligned_total = 0;  // pairs on all lanes
  uint64_t unaligned_before_ref = 0;  // on the pivot lane, before the pivot
  uint64_t unaligned_before_sus = 0;
  uint64_t unaligned_total_ref = 0;
  uint64_t unaligned_total_sus = 0;
  uint64_t skipped_nondeterministic = 0;  // paired nondeterministic ops walked past
  uint64_t skipped_trusted = 0;  // paired trusted ops walked past (not compared)
  uint64_t reordered = 0;
  std::vector<MissingRange> missing;
  std::vector<LaneDiff> lanes;
  std::vector<std::string> notes;  // degraded alignment, tolerated gaps, ...
  RankSummary summary;
};

// Why an explained rank diverged: the collective that carried it.
struct Explanation {
  uint32_t rank = 0;
  uint32_t from_rank = 0;
  uint64_t communicator = 0;
  uint64_t seq = 0;
  std::string communicator_name;  // CommunicatorLabel, when the answer carried the definition
};

// The merged, cluster-wide two-run answer.
struct DiffReport {
  DiffStatus status = DiffStatus::kIdentical;
  std::optional<FirstDivergence> first_divergence;  // earliest unexplained diverging rank
  uint64_t aligned = 0;
  uint64_t unaligned_before_ref = 0;
  uint64_t unaligned_before_sus = 0;
  std::vector<uint32_t> diverging_ranks;     // unexplained first divergences
  std::vector<Explanation> explained;
  std::vector<uint32_t> incomplete_ranks;
  std::vector<uint32_t> missing_ranks;       // expected but no answer (status partial)
  uint64_t skipped_nondeterministic = 0;     // over all ranks
  uint64_t skipped_trusted = 0;              // over all ranks
  std::vector<RankDiff> ranks;               // ascending rank
  std::vector<std::string> notes;
};

// ---- cross-rank, one run --------------------------------------------------

struct CollectiveMember {
  uint32_t rank = 0;
  std::string kind;
  std::string dtype;
  uint64_t count = 0;
  int32_t root = -1;
  uint64_t step = 0;
  uint32_t lane = 0;
  uint64_t op_index = 0;
  SiteInfo site;
  std::vector<Fp128> outputs;
};

// Members of one (communicator, seq) that disagree on what the collective is.
struct CollectiveDesync {
  uint64_t communicator = 0;
  std::string communicator_name;
  uint64_t seq = 0;
  std::vector<std::string> fields;  // "kind" | "dtype" | "count" | "root"
  std::vector<CollectiveMember> members;
};

// A collective whose outputs must agree across ranks but do not.
struct CollectiveMismatch {
  uint64_t communicator = 0;
  std::string communicator_name;
  uint64_t seq = 0;
  std::string kind;
  std::vector<std::vector<uint32_t>> groups;  // ranks with equal outputs, largest first
  std::vector<uint32_t> minority_ranks;       // ranks outside the largest group (if unique)
  std::vector<CollectiveMember> members;
};

struct RankProgress {
  uint32_t rank = 0;
  int64_t last_entered = -1;
  int64_t last_completed = -1;
  uint64_t last_step = 0;
  SiteInfo last_site;          // of its last entered collective
};

// Live view of one communicator ("who is everyone waiting for").
struct CommunicatorLive {
  uint64_t communicator = 0;
  std::string name;
  std::vector<RankProgress> ranks;
  // The first collective not completed by every member, if some member entered it.
  std::optional<uint64_t> pending_seq;
  std::string pending_kind;
  std::vector<uint32_t> waiting;     // entered pending_seq, not completed
  std::vector<uint32_t> not_joined;  // members that have not entered pending_seq
  uint64_t waiting_since_ns = 0;     // earliest Entered time among the waiters
  // The kind of every collective recorded on it, by sequence number, as runs
  // of equal kinds (a training step's all-reduces are one run). Where members
  // disagree (a desync, reported apart) the lowest rank's record names it.
  struct KindRun {
    uint64_t first_seq = 0;
    uint64_t last_seq = 0;
    std::string kind;
  };
  std::vector<KindRun> kinds;
};

struct CollectivesReport {
  DiffStatus status = DiffStatus::kIdentical;  // identical (consistent) | diverged | partial
  uint64_t collectives = 0;    // distinct (communicator, seq) seen
  std::vector<CollectiveDesync> desyncs;
  std::vector<CollectiveMismatch> mismatches;
  std::vector<CommunicatorLive> live;
  bool waiting = false;        // some communicator has members that have not joined
  std::vector<uint32_t> missing_ranks;
  std::vector<std::string> notes;
};

// Data-parallel replicas compared op by op against the lowest rank.
struct ReplicaReport {
  DiffStatus status = DiffStatus::kIdentical;
  std::vector<uint32_t> ranks;
  std::vector<RankDiff> pairs;       // rank r (as suspect) against ranks[0] (as reference)
  std::optional<FirstDivergence> first_divergence;  // earliest pivot over all pairs
  std::vector<uint32_t> odd_ranks;   // ranks outside the majority at that pivot
  // True: only ops marked replicated were compared (some trace carried such
  // marks); false: whole traces were.
  bool replicated_only = false;
  uint64_t compared_ops = 0;         // ops of ranks[0] that took part
  std::vector<std::string> notes;
};

}  // namespace opguard::aligner
