// A deterministic synthetic training trace for opguard-loadgen: a small
// transformer's forward, backward and optimizer ops repeated step after step,
// with all-reduces every K ops, and the suspect-run mutations (divergence,
// inserted ops, reordered independent ops, dropped ranges) that the daemon
// and aligner tests need. Everything is a pure function of the options and
// the rank, so every rank can compute every other rank's plan (which is how
// a divergence on one rank reaches the others through the next all-reduce).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace opguard::loadgen {

struct TraceOptions {
  uint32_t ranks = 1;
  uint64_t ops = 1000;             // base ops per rank (inserted ops come on top)
  uint64_t seed = 1;
  std::optional<uint32_t> diverge_rank;
  uint64_t diverge_op = 0;         // recorded op index on diverge_rank
  uint32_t inserts = 0;            // extra ops per rank
  uint32_t reorders = 0;           // adjacent independent swaps per rank
  uint32_t drop_batches = 0;       // ranges dropped across all ranks
  uint32_t drop_size = 64;         // ops per dropped range
  uint64_t collective_every = 0;   // 0: no collectives
};

// One template op of a training step.
struct OpTemplate {
  std::string name;
  std::string file;
  uint32_t line = 0;
  std::string function;
  int producer = -1;        // position in the step of the op whose output feeds this one
  bool backward = false;
  int forward_of = -1;      // backward: position of its forward op (seq_nr, site)
  bool replicated = false;  // output identical on every rank (optimizer after all-reduce)
  bool independent_with_next = false;  // may swap with the next op without changing anything
  std::vector<int64_t> shape;
};

// A recorded entry of one rank: a base op, or an inserted op.
struct PlanEntry {
  int64_t base = -1;      // base op index, or -1 for an inserted op
  uint32_t inserted = 0;  // running number of the inserted op
};

class SyntheticTrace {
 public:
  explicit SyntheticTrace(const TraceOptions& options);

  const std::vector<OpTemplate>& step_template() const { return template_; }
  // The recorded order of `rank`'s ops (inserts and swaps applied).
  const std::vector<PlanEntry>& plan(uint32_t rank) const { return plans_[rank]; }
  // Recorded positions on `rank` that were reordered / inserted / dropped.
  const std::vector<uint64_t>& swapped_at(uint32_t rank) const { return swaps_[rank]; }
  const std::vector<uint64_t>& inserted_at(uint32_t rank) const { return inserted_at_[rank]; }
  // Dropped ranges on `rank` as [first, first + drop_size) recorded positions.
  const std::vector<uint64_t>& dropped_at(uint32_t rank) const { return drops_[rank]; }

  uint64_t step_of(int64_t base) const { return static_cast<uint64_t>(base) / template_.size(); }
  const OpTemplate& op(int64_t base) const { return template_[static_cast<size_t>(base) % template_.size()]; }
  // A collective follows base op `base` when this is true; its number is then
  // (base + 1) / collective_every - 1.
  bool collective_after(int64_t base) const;

  // Output fingerprint of base op `base` as `rank` computes it (taint applied).
  uint64_t OutputFp(uint32_t rank, int64_t base) const;
  // Fingerprint of the tensor that feeds base op `base` on `rank` (0 if none).
  uint64_t InputFp(uint32_t rank, int64_t base) const;
  // Collective number m: input on `rank`, and the reduced output.
  uint64_t CollectiveInputFp(uint32_t rank, uint64_t m) const;
  uint64_t CollectiveOutputFp(uint64_t m) const;

  // Whether `rank`'s base op `base` is past the divergence (directly or
  // through an all-reduce).
  bool Tainted(uint32_t rank, int64_t base) const;
  // First base op on the diverging rank that is tainted; -1 without divergence.
  int64_t diverge_base() const { return diverge_base_; }

 private:
  void BuildTemplate();
  void BuildPlans();

  TraceOptions o_;
  std::vector<OpTemplate> template_;
  std::vector<std::vector<PlanEntry>> plans_;
  std::vector<std::vector<uint64_t>> swaps_, inserted_at_, drops_;
  int64_t diverge_base_ = -1;
  int64_t taint_all_from_ = -1;  // base index from which every rank is tainted
};

}  // namespace opguard::loadgen
