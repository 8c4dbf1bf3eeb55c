#include "opguard/aligner/diff.h"

#include <gtest/gtest.h>

#include "opguard/aligner/render.h"
#include "test_util.h"

namespace opguard::aligner {
namespace {

using testing::Ev;
using testing::Id;
using testing::Lane;
using testing::Rank;

RankDiff Diff(const RankTrace& r, const RankTrace& s, DiffContext ctx = {}) {
  Result<RankDiff> d = DiffRank(r, s, ctx);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : RankDiff{};
}

TEST(DiffRank, IdenticalRuns) {
  auto r = Rank(0, "A B C D E F");
  RankDiff d = Diff(r, r);
  EXPECT_EQ(d.status, DiffStatus::kIdentical);
  EXPECT_FALSE(d.first_divergence);
  EXPECT_EQ(d.aligned, 6u);
}

TEST(DiffRank, ACancelledDiffStopsWithTheTokensError) {
  auto r = Rank(0, "A B C D E F");
  CancelToken gone;
  gone.Cancel(CancelToken::Reason::kClientGone);
  DiffContext ctx;
  ctx.cancel = &gone;
  Result<RankDiff> d = DiffRank(r, r, ctx);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "query cancelled: its client went away");
  CancelToken open;
  ctx.cancel = &open;
  EXPECT_TRUE(DiffRank(r, r, ctx).ok());
}

TEST(DiffRank, DivergenceInFirstOp) {
  RankDiff d = Diff(Rank(0, "A B C D"), Rank(0, "A#bad B C D"));
  ASSERT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_EQ(d.first_divergence->reference.op_index, 0u);
  EXPECT_EQ(d.first_divergence->suspect.op_index, 0u);
  EXPECT_EQ(d.aligned, 0u);
  EXPECT_TRUE(d.first_divergence->inputs_equal);
}

TEST(DiffRank, DivergenceInLastOpAfterInsertions) {
  RankDiff d = Diff(Rank(0, "A B C D E F G H I J K L"), Rank(0, "X Y A B C D E F G H I J K L#bad"));
  ASSERT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_EQ(d.first_divergence->reference.op_index, 11u);
  EXPECT_EQ(d.first_divergence->suspect.op_index, 13u);
  EXPECT_EQ(d.aligned, 11u);
  EXPECT_EQ(d.unaligned_before_ref, 0u);
  EXPECT_EQ(d.unaligned_before_sus, 2u);
}

TEST(DiffRank, InsertedOpsAreUnalignedNeverDivergent) {
  RankDiff d = Diff(Rank(0, "A B C D E F G H I J"), Rank(0, "A B NEW1 C D E NEW2 F G H I J NEW3"));
  EXPECT_EQ(d.status, DiffStatus::kIdentical);
  EXPECT_EQ(d.unaligned_total_sus, 3u);
}

TEST(DiffRank, InputsDifferPointsUpstream) {
  RankDiff d = Diff(Rank(0, "A B C D"), Rank(0, "A B ~C#bad D"));
  ASSERT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_FALSE(d.first_divergence->inputs_equal);
}

TEST(DiffRank, NondeterministicOpsAreSkippedAndCounted) {
  // B and D are preflight-nondeterministic: their differing outputs are not
  // evidence; E is the pivot.
  RankDiff d = Diff(Rank(0, "A B! C D! E F"), Rank(0, "A B#x! C D#y! E#bad F"));
  ASSERT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_EQ(d.first_divergence->reference.op_index, 4u);
  EXPECT_EQ(d.skipped_nondeterministic, 2u);
}

TEST(DiffRank, NondeterministicOnlyDifferencesAreIdentical) {
  RankDiff d = Diff(Rank(0, "A B! C"), Rank(0, "A B#x! C"));
  EXPECT_EQ(d.status, DiffStatus::kIdentical);
  EXPECT_EQ(d.skipped_nondeterministic, 1u);
}

TEST(DiffRank, GapBeforePivotIsIncompleteNotAPivot) {
  RankTrace r = Rank(0, "A B C D E F G H");
  RankTrace s = Rank(0, "A B E F G#bad H");
  // Suspect lost ops 2..3 (they would have been C, D); re-number to show it.
  s.lanes[0] = Lane("A B", 0, 0);
  for (auto t : {"E", "F", "G#bad", "H"}) s.lanes[0].ops.push_back(Ev(t, s.lanes[0].ops.size() + 2));
  s.gaps.push_back(Gap{0, 2, 3});
  RankDiff d = Diff(r, s);
  EXPECT_EQ(d.status, DiffStatus::kIncomplete);
  EXPECT_FALSE(d.first_divergence);
  ASSERT_TRUE(d.first_observed);
  EXPECT_EQ(d.first_observed->suspect.op_index, 6u);
  ASSERT_EQ(d.missing.size(), 1u);
  EXPECT_EQ(d.missing[0].run, "suspect");
  EXPECT_EQ(d.missing[0].first_op, 2u);
  EXPECT_EQ(d.missing[0].last_op, 3u);
}

TEST(DiffRank, GapAfterPivotDoesNotMatter) {
  RankTrace r = Rank(0, "A B C#bad D E F");
  RankTrace s = Rank(0, "A B C D");
  r.gaps.push_back(Gap{0, 6, 9});
  s.gaps.push_back(Gap{0, 4, 5});
  RankDiff d = Diff(s, r);
  EXPECT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_EQ(d.first_divergence->suspect.op_index, 2u);
}

TEST(DiffRank, IdenticalWithGapIsIncomplete) {
  RankTrace r = Rank(0, "A B C D");
  RankTrace s = r;
  s.gaps.push_back(Gap{0, 10, 12});
  RankDiff d = Diff(r, s);
  EXPECT_EQ(d.status, DiffStatus::kIncomplete);
  EXPECT_EQ(d.missing.size(), 1u);
}

TEST(DiffRank, OldGapsCanBeTolerated) {
  RankTrace r = Rank(0, "A B C D E F G H I J K#bad");
  RankTrace s = Rank(0, "A B C D E F G H I J K");
  r.gaps.push_back(Gap{0, 1000, 1001});  // lane-relative: before nothing
  s.gaps.push_back(Gap{0, 0, 0});        // "op 0 missing" although recorded: just a range
  DiffContext ctx;
  ctx.options.tolerate_gaps_older_than = 5;
  RankDiff d = Diff(s, r, ctx);
  EXPECT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_FALSE(d.notes.empty());
}

TEST(DiffRank, PivotAcrossLanesIsTheEarliestStep) {
  RankTrace r, s;
  r.lanes.push_back(Lane("A B C D", 0));
  r.lanes.push_back(Lane("P Q R S", 1));
  s = r;
  for (auto& e : r.lanes[0].ops) e.step = e.op_index;        // lane 0 steps 0..3
  for (auto& e : r.lanes[1].ops) e.step = e.op_index / 2;    // lane 1 steps 0,0,1,1
  s = r;
  s.lanes[0].ops[2].outputs.lo ^= 1;  // lane 0 step 2
  s.lanes[1].ops[2].outputs.lo ^= 1;  // lane 1 step 1
  RankDiff d = Diff(r, s);
  ASSERT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_EQ(d.first_divergence->lane, 1u);
  EXPECT_EQ(d.lanes.size(), 2u);
  EXPECT_EQ(d.lanes[0].status, DiffStatus::kDiverged);
}

TEST(DiffRank, GapOnAnotherLaneBeforeThePivotStepIsIncomplete) {
  RankTrace r, s;
  r.lanes.push_back(Lane("A B C D", 0));
  r.lanes.push_back(Lane("P Q R S", 1));
  for (auto& l : r.lanes) {
    for (auto& e : l.ops) e.step = e.op_index;
  }
  s = r;
  s.lanes[0].ops[3].outputs.lo ^= 1;      // pivot at step 3 on lane 0
  s.gaps.push_back(Gap{1, 10, 11});       // lane 1 after its op 3 (step 3): same step
  EXPECT_EQ(Diff(r, s).status, DiffStatus::kIncomplete);
  s.gaps.clear();
  s.lanes[1].ops.resize(4);
  EXPECT_EQ(Diff(r, s).status, DiffStatus::kDiverged);
}

TEST(DiffRank, DetailsAndSitesAreResolvedForThePivotOnly) {
  RankTrace r = Rank(2, "A B C D"), s = Rank(2, "A B C#bad D");
  StringTable strings;
  uint64_t file = 11, fn = 12, kern = 13;
  strings.AddString(Id("op:C"), "aten::index_put_");
  strings.AddString(file, "train.py");
  strings.AddString(fn, "scatter_router_mask");
  strings.AddString(kern, "index_put_kernel");
  strings.AddSite(Id("site:C"), {file, 214, fn});
  InMemoryDetails rd, sd;
  OpDetail det;
  det.op_index = 2;
  det.step = 12;
  det.name = Id("op:C");
  det.site = Id("site:C");
  det.kernels = {kern};
  InputValue scalar;
  scalar.kind = ValueKind::kScalar;
  scalar.scalar_bits = 1077945344;
  scalar.scalar_dtype = DType::kFloat32;
  det.inputs = {InputValue{}, scalar};
  det.outputs = {TensorInfo{Fp128{1, 2}, DType::kFloat32, {4, 8}, TensorStats{0, 0, -1, 1, 0.5, 2}, 0}};
  rd.Add(2, det);
  det.outputs[0].fingerprint = Fp128{3, 4};
  sd.Add(2, det);
  DiffContext ctx{&rd, &sd, &strings, &strings, {}};
  RankDiff d = Diff(r, s, ctx);
  ASSERT_EQ(d.status, DiffStatus::kDiverged);
  const FirstDivergence& f = *d.first_divergence;
  EXPECT_EQ(f.rank, 2u);
  EXPECT_EQ(f.op, "aten::index_put_");
  EXPECT_EQ(f.suspect.site.file, "train.py");
  EXPECT_EQ(f.suspect.site.line, 214u);
  EXPECT_EQ(f.suspect.site.function, "scatter_router_mask");
  EXPECT_TRUE(f.suspect.detail_available);
  EXPECT_EQ(f.suspect.inputs[1].scalar_bits, 1077945344u);
  EXPECT_EQ(f.suspect.kernels, std::vector<std::string>{"index_put_kernel"});
  EXPECT_EQ(f.differing_outputs, std::vector<uint32_t>{0});
}

// Details for one op: one tensor input and one tensor output, by fingerprint
// (float32, shape {4}).
OpDetail Io(uint64_t op_index, Fp128 in, Fp128 out) {
  OpDetail d;
  d.op_index = op_index;
  InputValue v;
  v.kind = ValueKind::kTensor;
  v.tensor.fingerprint = in;
  v.tensor.dtype = DType::kFloat32;
  v.tensor.shape = {4};
  d.inputs = {v};
  d.outputs = {TensorInfo{out, DType::kFloat32, {4}, std::nullopt, -1}};
  return d;
}

TEST(DiffRank, InputsDifferNameTheUnpairedOpThatProducedThem) {
  // The suspect runs two ops the reference lacks (Y, X); X's output is the
  // pivot C's input. Y is nearer the start, and its output is no input of C.
  {
    InMemoryDetails rd, sd;
    rd.Add(0, Io(2, Fp128{5, 5}, Fp128{1, 1}));
    sd.Add(0, Io(1, Fp128{0, 0}, Fp128{9, 9}));  // Y
    sd.Add(0, Io(3, Fp128{0, 0}, Fp128{7, 7}));  // X
    sd.Add(0, Io(4, Fp128{7, 7}, Fp128{2, 2}));  // C
    DiffContext ctx{&rd, &sd, nullptr, nullptr, {}};
    RankDiff d = Diff(Rank(0, "A B C D"), Rank(0, "A Y B X ~C#bad D"), ctx);
    ASSERT_EQ(d.status, DiffStatus::kDiverged);
    const FirstDivergence& f = *d.first_divergence;
    EXPECT_EQ(f.suspect.op_index, 4u);
    ASSERT_TRUE(f.producer);
    EXPECT_EQ(f.producer_run, "suspect");
    EXPECT_EQ(f.producer->op_index, 3u);
  }
  {
    // The reference runs X, which the suspect lacks.
    InMemoryDetails rd, sd;
    rd.Add(0, Io(2, Fp128{0, 0}, Fp128{7, 7}));  // X
    rd.Add(0, Io(3, Fp128{7, 7}, Fp128{1, 1}));  // C
    sd.Add(0, Io(2, Fp128{5, 5}, Fp128{2, 2}));
    DiffContext ctx{&rd, &sd, nullptr, nullptr, {}};
    RankDiff d = Diff(Rank(0, "A B X C D"), Rank(0, "A B ~C#bad D"), ctx);
    ASSERT_EQ(d.status, DiffStatus::kDiverged);
    ASSERT_TRUE(d.first_divergence->producer);
    EXPECT_EQ(d.first_divergence->producer_run, "reference");
    EXPECT_EQ(d.first_divergence->producer->op_index, 2u);
  }
  {
    // No unpaired op produced the input: none is named.
    InMemoryDetails rd, sd;
    rd.Add(0, Io(2, Fp128{5, 5}, Fp128{1, 1}));
    sd.Add(0, Io(1, Fp128{0, 0}, Fp128{9, 9}));
    sd.Add(0, Io(3, Fp128{6, 6}, Fp128{2, 2}));
    DiffContext ctx{&rd, &sd, nullptr, nullptr, {}};
    RankDiff d = Diff(Rank(0, "A B C D"), Rank(0, "A Y B ~C#bad D"), ctx);
    ASSERT_EQ(d.status, DiffStatus::kDiverged);
    EXPECT_FALSE(d.first_divergence->producer);
    EXPECT_EQ(d.first_divergence->producer_run, "");
  }
}

TEST(DiffRank, TrustedOpsAreNeverComparedAndCounted) {
  // B's outputs differ but it is trusted in both runs; C is trusted in the
  // reference only (recorded in full mode in the suspect): neither is
  // compared.
  RankDiff d = Diff(Rank(0, "A B^ C^ D"), Rank(0, "A B#x^ C#y D"));
  EXPECT_EQ(d.status, DiffStatus::kIdentical);
  EXPECT_EQ(d.skipped_trusted, 2u);
  d = Diff(Rank(0, "A B^ C D"), Rank(0, "A B^ C#bad D"));
  ASSERT_EQ(d.status, DiffStatus::kDiverged);
  EXPECT_EQ(d.first_divergence->suspect.op_index, 2u);
  EXPECT_EQ(d.first_divergence->trusted_before, 1u);
}

TEST(DiffRank, InputsDifferAfterTrustedOpsNameTheLatestTrustedOpOfTheirLayout) {
  // M and N are trusted (no fingerprints); C's input differs. N is nearer C,
  // but only M made a tensor of the input's dtype and shape.
  auto trusted = [](uint64_t op_index, std::vector<int64_t> out_shape) {
    OpDetail d = Io(op_index, Fp128{}, Fp128{});
    d.outputs[0].shape = std::move(out_shape);
    d.trusted = true;
    return d;
  };
  for (const bool layout_matches : {true, false}) {
    SCOPED_TRACE(layout_matches ? "M's output has the input's layout" : "no trusted output has it");
    InMemoryDetails rd, sd;
    rd.Add(0, Io(3, Fp128{5, 5}, Fp128{1, 1}));
    sd.Add(0, trusted(1, layout_matches ? std::vector<int64_t>{4} : std::vector<int64_t>{2, 2}));
    sd.Add(0, trusted(2, {8}));
    sd.Add(0, Io(3, Fp128{7, 7}, Fp128{2, 2}));
    DiffContext ctx{&rd, &sd, nullptr, nullptr, {}};
    RankDiff d = Diff(Rank(0, "A M^ N^ C D"), Rank(0, "A M^ N^ ~C#bad D"), ctx);
    ASSERT_EQ(d.status, DiffStatus::kDiverged);
    const FirstDivergence& f = *d.first_divergence;
    EXPECT_EQ(f.suspect.op_index, 3u);
    EXPECT_FALSE(f.inputs_equal);
    EXPECT_FALSE(f.producer);
    EXPECT_EQ(f.trusted_before, 2u);
    ASSERT_EQ(f.trusted_candidate.has_value(), layout_matches);
    if (layout_matches) {
      EXPECT_EQ(f.trusted_candidate->op_index, 1u);
      EXPECT_TRUE(f.trusted_candidate->trusted);
    }
    DiffReport report;
    report.status = DiffStatus::kDiverged;
    report.first_divergence = f;
    report.skipped_trusted = d.skipped_trusted;
    const std::string text = ToText(report);
    EXPECT_NE(text.find(layout_matches ? "probably by trusted op #1" : "or one of 2 trusted op(s) before it"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("skipped 2 trusted op(s)"), std::string::npos) << text;
  }
}

TEST(DiffRank, RejectsMalformedTraces) {
  RankTrace r = Rank(0, "A B C");
  r.lanes[0].ops[2].op_index = 1;
  EXPECT_FALSE(DiffRank(r, Rank(0, "A B C"), {}).ok());
  RankTrace dup = Rank(0, "A");
  dup.lanes.push_back(dup.lanes[0]);
  EXPECT_FALSE(DiffRank(dup, Rank(0, "A"), {}).ok());
}

// Traces long enough that their order is checked next to the alignment
// (diff.cc): the same answers as the short ones.
TEST(DiffRank, LongTracesAreCheckedLikeShortOnes) {
  RankTrace ref;
  ref.lanes.push_back({});
  for (uint64_t i = 0; i < 40000; ++i) ref.lanes[0].ops.push_back(Ev(i % 2 ? "A" : "B", i));
  RankTrace sus = ref;
  sus.lanes[0].ops[30000].outputs.hi ^= 1;
  auto fine = DiffRank(ref, sus, {});
  ASSERT_TRUE(fine.ok()) << fine.status().message();
  EXPECT_EQ(fine->status, DiffStatus::kDiverged);
  ASSERT_TRUE(fine->first_divergence.has_value());
  EXPECT_EQ(fine->first_divergence->suspect.op_index, 30000u);

  sus.lanes[0].ops[39990].op_index = 5;
  auto bad_sus = DiffRank(ref, sus, {});
  ASSERT_FALSE(bad_sus.ok());
  EXPECT_EQ(bad_sus.status().message(), "suspect rank 0 lane 0: op indices not ascending at op #5");
  ref.lanes[0].ops[20000].op_index = 3;
  auto bad_both = DiffRank(ref, sus, {});
  ASSERT_FALSE(bad_both.ok());
  EXPECT_EQ(bad_both.status().message(), "reference rank 0 lane 0: op indices not ascending at op #3");
}

// ---- causality ---------------------------------------------------------------

CollectiveEvent Coll(uint64_t comm, uint64_t seq, uint64_t op_index) {
  CollectiveEvent c;
  c.communicator = comm;
  c.seq = seq;
  c.kind = CollectiveKind::kAllReduce;
  c.op_index = op_index;
  return c;
}

// 20-op trace per rank; `bad` = first op whose output differs (-1: none).
RankTrace Trace(uint32_t rank, int bad) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "op" + std::to_string(i) + (bad >= 0 && i >= bad ? "#bad " : " ");
  RankTrace t = Rank(rank, text);
  for (OpEvent& e : t.lanes[0].ops) e.step = e.op_index;  // one op per step: steps order ranks
  return t;
}

TEST(Causality, ChainThroughSeveralCommunicators) {
  // Rank 1 diverges at op 3. Comm A = {0,1} at op 5 carries it to rank 0
  // (diverges at op 7). Comm B = {0,2} at op 9 carries it on to rank 2 (op 12).
  // Rank 3 diverges at op 2 on its own: no collective reaches it first.
  const uint64_t A = 0xa, B = 0xb, C = 0xc;
  std::vector<RankDiff> answers;
  int bad[] = {7, 3, 12, 2};
  for (uint32_t r = 0; r < 4; ++r) {
    RankTrace ref = Trace(r, -1), sus = Trace(r, bad[r]);
    if (r == 0 || r == 1) sus.collectives.push_back(Coll(A, 0, 5));
    if (r == 0 || r == 2) sus.collectives.push_back(Coll(B, 0, 9));
    if (r == 2 || r == 3) sus.collectives.push_back(Coll(C, 0, 15));  // after both pivots
    answers.push_back(Diff(ref, sus));
  }
  DiffReport rep = MergeRankDiffs(answers, {0, 1, 2, 3});
  EXPECT_EQ(rep.status, DiffStatus::kDiverged);
  EXPECT_EQ(rep.diverging_ranks, (std::vector<uint32_t>{1, 3}));
  ASSERT_EQ(rep.explained.size(), 2u);
  EXPECT_EQ(rep.explained[0].rank, 0u);
  EXPECT_EQ(rep.explained[0].from_rank, 1u);
  EXPECT_EQ(rep.explained[0].communicator, A);
  EXPECT_EQ(rep.explained[1].rank, 2u);
  EXPECT_EQ(rep.explained[1].from_rank, 0u);
  EXPECT_EQ(rep.explained[1].communicator, B);
  // The reported first divergence is the earliest unexplained one (rank 3, op 2).
  ASSERT_TRUE(rep.first_divergence);
  EXPECT_EQ(rep.first_divergence->rank, 3u);
}

TEST(Causality, CollectiveBeforeTheSourceDivergedCarriesNothing) {
  std::vector<RankDiff> answers;
  RankTrace s0 = Trace(0, 8), s1 = Trace(1, 10);
  s0.collectives.push_back(Coll(1, 0, 4));  // both ranks at seq 0 before rank 0 diverged
  s1.collectives.push_back(Coll(1, 0, 4));
  answers.push_back(Diff(Trace(0, -1), s0));
  answers.push_back(Diff(Trace(1, -1), s1));
  DiffReport rep = MergeRankDiffs(answers, {});
  EXPECT_EQ(rep.diverging_ranks, (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(rep.explained.empty());
}

TEST(Causality, MergeWithMissingNodeIsPartial) {
  std::vector<RankDiff> answers;
  for (uint32_t r : {0u, 1u, 4u, 5u}) answers.push_back(Diff(Trace(r, -1), Trace(r, r == 4 ? 6 : -1)));
  DiffReport rep = MergeRankDiffs(answers, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(rep.status, DiffStatus::kPartial);
  EXPECT_EQ(rep.missing_ranks, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(rep.diverging_ranks, (std::vector<uint32_t>{4}));
  ASSERT_TRUE(rep.first_divergence);
  EXPECT_EQ(rep.first_divergence->rank, 4u);
}

TEST(Causality, IncompleteRankMakesTheAnswerIncomplete) {
  RankTrace s1 = Trace(1, -1);
  s1.gaps.push_back(Gap{0, 30, 31});
  std::vector<RankDiff> answers{Diff(Trace(0, -1), Trace(0, 5)), Diff(Trace(1, -1), s1)};
  DiffReport rep = MergeRankDiffs(answers, {0, 1});
  EXPECT_EQ(rep.status, DiffStatus::kIncomplete);
  EXPECT_EQ(rep.incomplete_ranks, (std::vector<uint32_t>{1}));
  EXPECT_TRUE(rep.first_divergence);
}

TEST(Causality, SummariesAloneAreEnough) {
  // The coordinator needs only the summaries (what peers ship).
  RankSummary a{0, DiffStatus::kDiverged, 0, 3, 30, {{7, -1, 4}}};
  RankSummary b{1, DiffStatus::kDiverged, 0, 5, 50, {{7, 4, -1}}};
  RankSummary c{2, DiffStatus::kIdentical, 0, 0, 0, {}};
  Causality k = ExplainDivergences({a, b, c});
  EXPECT_EQ(k.diverging, std::vector<uint32_t>{0});
  ASSERT_EQ(k.explained.size(), 1u);
  EXPECT_EQ(k.explained[0].rank, 1u);
  EXPECT_EQ(k.explained[0].seq, 4u);
}

TEST(Causality, CyclicFallsBackToEarliestStep) {
  RankSummary a{0, DiffStatus::kDiverged, 0, 3, 30, {{7, 2, -1}, {8, -1, 1}}};
  RankSummary b{1, DiffStatus::kDiverged, 0, 5, 50, {{7, -1, 1}, {8, 2, -1}}};
  Causality k = ExplainDivergences({a, b});
  EXPECT_TRUE(k.cyclic);
  EXPECT_EQ(k.diverging, std::vector<uint32_t>{0});
}

TEST(BoundaryId, KeysOnBaseNameFunctionAndLineText) {
  const uint64_t a = BoundaryId("/x/model.py", "forward", 10, "    y = f(x)  ");
  EXPECT_EQ(a, BoundaryId("/y/z/model.py", "forward", 31, "y = f(x)"));
  EXPECT_NE(a, BoundaryId("/x/model.py", "backward", 10, "y = f(x)"));
  EXPECT_NE(a, BoundaryId("/x/other.py", "forward", 10, "y = f(x)"));
  EXPECT_NE(a, BoundaryId("/x/model.py", "forward", 10, "y = g(x)"));
  // Identical lines of one function share the id: order and inputs tell them apart.
  EXPECT_EQ(a, BoundaryId("/x/model.py", "forward", 12, "y = f(x)"));
  // Text unknown: the line number decides.
  EXPECT_EQ(BoundaryId("/x/model.py", "f", 7, ""), BoundaryId("model.py", "f", 7, "  "));
  EXPECT_NE(BoundaryId("/x/model.py", "f", 7, ""), BoundaryId("/x/model.py", "f", 8, ""));
  // A boundary replaces the site in the structural key.
  OpDetail d;
  d.name = 5;
  d.site = 6;
  OpDetail moved = d;
  moved.site = 7;
  EXPECT_NE(StructuralKey(d), StructuralKey(moved));
  EXPECT_EQ(StructuralKey(d, a), StructuralKey(moved, a));
}

TEST(DiffRank, EditedLineIsThePivotWhenItsValuesDiffer) {
  // The suspect's C moved to an edited line and computes something else.
  RankTrace ref = Rank(0, "A B C D E F G H I J K L");
  RankTrace sus = Rank(0, "A B C@9#other D#x E#x F#x G#x H#x I#x J#x K#x L#x");
  Result<RankDiff> d = DiffRank(ref, sus, {});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->status, DiffStatus::kDiverged);
  EXPECT_EQ(d->first_divergence->reference.op_index, 2u);
  EXPECT_EQ(d->first_divergence->suspect.op_index, 2u);
  EXPECT_EQ(d->unaligned_before_ref, 0u);
}

}  // namespace
}  // namespace opguard::aligner
