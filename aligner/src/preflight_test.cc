#include "opguard/aligner/preflight.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace opguard::aligner {
namespace {

using testing::Ev;
using testing::Id;
using testing::Lane;
using testing::Rank;

RankPreflight Preflight(const RankTrace& a, const RankTrace& b, uint64_t max_steps = 0) {
  auto r = PreflightRank(a, b, DiffContext{}, max_steps);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : RankPreflight{};
}

// Steps: op k of `text` belongs to step k / per_step.
RankTrace Stepped(uint32_t rank, const std::string& text, uint64_t per_step) {
  RankTrace t;
  t.rank = rank;
  LaneTrace l;
  uint64_t k = 0;
  for (const std::string& token : testing::Tokens(text)) {
    l.ops.push_back(Ev(token, k, k / per_step));
    ++k;
  }
  t.lanes.push_back(std::move(l));
  return t;
}

TEST(Preflight, EqualInputsDifferentOutputsIsNondeterministic) {
  // C reads the same bytes in both runs and writes other bytes: C is the
  // nondeterministic op. D is equal again (C's result did not reach it).
  RankPreflight p = Preflight(Rank(0, "A B C#x D"), Rank(0, "A B C#y D"));
  EXPECT_EQ(p.stable, 4u);
  EXPECT_EQ(p.equal, 3u);
  EXPECT_EQ(p.nondeterministic, 1u);
  EXPECT_EQ(p.downstream, 0u);
  ASSERT_EQ(p.boundaries.size(), 1u);
  EXPECT_EQ(p.boundaries[0].key, Id("key:C"));
  EXPECT_EQ(p.boundaries[0].op_index_a, 2u);
  ASSERT_TRUE(p.first.has_value());
  EXPECT_TRUE(p.first->inputs_equal);
  EXPECT_EQ(p.first->reference.op_index, 2u);
  EXPECT_EQ(p.first->suspect.op_index, 2u);
}

TEST(Preflight, DifferingInputsAreDownstreamNotMarked) {
  // D's inputs already differ: a consequence, counted but not in the plan.
  RankPreflight p = Preflight(Rank(0, "A C#x ~D#p E"), Rank(0, "A C#y D#q E"));
  EXPECT_EQ(p.nondeterministic, 1u);
  EXPECT_EQ(p.downstream, 1u);
  ASSERT_EQ(p.boundaries.size(), 1u);
  EXPECT_EQ(p.boundaries[0].key, Id("key:C"));
}

TEST(Preflight, IdenticalRunsHaveNoBoundaries) {
  RankPreflight p = Preflight(Rank(0, "A B C D"), Rank(0, "A B C D"));
  EXPECT_EQ(p.stable, 4u);
  EXPECT_EQ(p.equal, 4u);
  EXPECT_TRUE(p.boundaries.empty());
  EXPECT_FALSE(p.first.has_value());
}

TEST(Preflight, OpsFlaggedByTheShimAreSkipped) {
  // Uninitialised memory (flagged at record time) is never a plan entry.
  RankPreflight p = Preflight(Rank(0, "A E#x! C"), Rank(0, "A E#y! C"));
  EXPECT_EQ(p.skipped, 1u);
  EXPECT_TRUE(p.boundaries.empty());
}

TEST(Preflight, StepsFromMaxStepsOnAreNotCompared) {
  // Two ops a step; the stopped job's step 2 differs, but only steps 0-1 count.
  RankTrace a = Stepped(0, "A B A B A#x", 2), b = Stepped(0, "A B A B A#y", 2);
  EXPECT_EQ(Preflight(a, b, 2).nondeterministic, 0u);
  EXPECT_EQ(Preflight(a, b, 2).stable, 4u);
  EXPECT_EQ(Preflight(a, b, 0).nondeterministic, 1u);
}

TEST(Preflight, MergeKeepsOneEntryPerKeyAndTheEarliestFirst) {
  RankTrace a0 = Stepped(0, "A B C#x D", 2), b0 = Stepped(0, "A B C#y D", 2);      // C at step 1
  RankTrace a1 = Stepped(1, "A B#x C#x D", 2), b1 = Stepped(1, "A B#y C#y D", 2);  // B at step 0
  PreflightReport r = MergePreflight({Preflight(a0, b0), Preflight(a1, b1)});
  EXPECT_EQ(r.nondeterministic, 3u);
  ASSERT_EQ(r.boundaries.size(), 2u);
  EXPECT_EQ(r.boundaries[0].key, Id("key:B"));
  EXPECT_EQ(r.boundaries[1].key, Id("key:C"));
  EXPECT_EQ(r.boundaries[1].pairs, 2u);  // on both ranks
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->rank, 1u);
  EXPECT_EQ(r.first->step, 0u);
}

TEST(Preflight, APlanMakesDiffWalkPastItsOpsToTheRealPivot) {
  // Reference and a suspect with a bug at F: without the plan C (its
  // nondeterminism) is the pivot; with the preflight's keys marked, F is.
  RankPreflight p = Preflight(Rank(0, "A C#x E F G"), Rank(0, "A C#y E F G"));
  std::vector<uint64_t> keys;
  for (const auto& nb : p.boundaries) keys.push_back(nb.key);
  RankTrace ref = Rank(0, "A C#p E F G"), sus = Rank(0, "A C#q E F#bug G");
  auto plain = DiffRank(ref, sus, DiffContext{});
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->status, DiffStatus::kDiverged);
  EXPECT_EQ(plain->first_divergence->reference.op_index, 1u);
  EXPECT_EQ(MarkNondeterministic(ref, keys), 1u);
  EXPECT_EQ(MarkNondeterministic(sus, keys), 1u);
  auto planned = DiffRank(ref, sus, DiffContext{});
  ASSERT_TRUE(planned.ok());
  ASSERT_EQ(planned->status, DiffStatus::kDiverged);
  EXPECT_EQ(planned->first_divergence->reference.op_index, 3u);
  EXPECT_EQ(planned->skipped_nondeterministic, 1u);
}

TEST(Preflight, MalformedTracesAreRefused) {
  RankTrace a = Rank(0, "A B");
  a.lanes[0].ops[1].op_index = 0;
  EXPECT_FALSE(PreflightRank(a, Rank(0, "A B"), DiffContext{}).ok());
}

}  // namespace
}  // namespace opguard::aligner
