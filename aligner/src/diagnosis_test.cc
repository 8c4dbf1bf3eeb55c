#include "opguard/aligner/diagnosis.h"

#include <gtest/gtest.h>

#include "opguard/aligner/render.h"

namespace opguard::aligner {
namespace {

// A diverged report around one pivot, shaped by each test.
DiffReport Diverged() {
  DiffReport r;
  r.status = DiffStatus::kDiverged;
  FirstDivergence f;
  f.rank = 1;
  f.step = 4;
  f.op = "aten::addmm";
  f.reference.op = f.suspect.op = "aten::addmm";
  f.reference.site = {7, "model.py", 88, "forward"};
  f.suspect.site = {7, "model.py", 88, "forward"};
  r.first_divergence = f;
  r.diverging_ranks = {1};
  return r;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Diagnose, IdenticalRunsNeedNone) { EXPECT_FALSE(Diagnose(DiffReport{})); }

TEST(Diagnose, MissingRecordsNameNoCause) {
  DiffReport r;
  r.status = DiffStatus::kIncomplete;
  r.incomplete_ranks = {0, 3};
  auto d = Diagnose(r);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->cause, "missing_records");
  EXPECT_TRUE(Has(d->text, "rank(s) 0, 3")) << d->text;
}

TEST(Diagnose, ReplicaStateBlamesTheRanksMemoryOrUpdate) {
  DiffReport r = Diverged();
  r.first_divergence->op = "opguard::replica_state[blocks.0.weight]";
  EXPECT_EQ(Diagnose(r)->cause, "replica_state");
}

TEST(Diagnose, AnEditedLineBlamesTheEditWithBothLines) {
  DiffReport r = Diverged();
  r.first_divergence->code_changed = true;
  r.first_divergence->suspect.site.line = 91;
  r.first_divergence->inputs_equal = false;
  auto d = Diagnose(r);
  EXPECT_EQ(d->cause, "code_edit");
  EXPECT_TRUE(Has(d->text, "model.py:88")) << d->text;
  EXPECT_TRUE(Has(d->text, "model.py:91")) << d->text;
}

TEST(Diagnose, EqualInputsAndOtherKernelsIsAlgorithmSelection) {
  DiffReport r = Diverged();
  r.first_divergence->inputs_equal = true;
  r.first_divergence->reference.kernels = {"gemm_128x64"};
  r.first_divergence->suspect.kernels = {"gemm_64x64_splitk"};
  EXPECT_EQ(Diagnose(r)->cause, "algorithm_selection");
}

TEST(Diagnose, EqualInputsAndSameKernelsIsTheOpItself) {
  DiffReport r = Diverged();
  r.first_divergence->inputs_equal = true;
  r.first_divergence->reference.kernels = r.first_divergence->suspect.kernels = {"gemm_128x64"};
  auto d = Diagnose(r);
  EXPECT_EQ(d->cause, "op_itself");
  EXPECT_TRUE(Has(d->text, "rank 1, step 4")) << d->text;
}

TEST(Diagnose, ADataMovementOpWithEqualInputsMakesTheRecordingSuspect) {
  DiffReport r = Diverged();
  r.first_divergence->inputs_equal = true;
  r.first_divergence->op = "aten::t [MmBackward0]";
  auto d = Diagnose(r);
  EXPECT_EQ(d->cause, "suspect_recording");
  EXPECT_TRUE(Has(ToText(r), "only moves data → the recording is suspect")) << ToText(r);
  EXPECT_TRUE(MovesDataOnly("aten::view"));
  EXPECT_TRUE(MovesDataOnly("aten::split_with_sizes"));
  EXPECT_FALSE(MovesDataOnly("aten::tanh"));
  EXPECT_FALSE(MovesDataOnly("aten::t_copy_x"));
}

TEST(Diagnose, DifferingInputsWithAnUnpairedProducerNameIt) {
  DiffReport r = Diverged();
  OpView p;
  p.op = "aten::mul_";
  p.op_index = 412;
  p.site = {9, "train.py", 140, "step"};
  r.first_divergence->producer = p;
  r.first_divergence->producer_run = "suspect";
  auto d = Diagnose(r);
  EXPECT_EQ(d->cause, "unpaired_producer");
  EXPECT_TRUE(Has(d->text, "aten::mul_ at train.py:140")) << d->text;
  EXPECT_TRUE(Has(d->text, "only the suspect run")) << d->text;
}

TEST(Diagnose, DifferingInputsWithATrustedCandidateAskForAFullRecording) {
  DiffReport r = Diverged();
  OpView c;
  c.op = "aten::mm";
  c.site = {9, "train.py", 70, "forward"};
  r.first_divergence->trusted_candidate = c;
  EXPECT_EQ(Diagnose(r)->cause, "trusted_producer");
}

TEST(Diagnose, DifferingInputsWithNoProducerBlameWhatWasNotRecorded) {
  EXPECT_EQ(Diagnose(Diverged())->cause, "unrecorded_producer");
}

TEST(Diagnose, ASpreadThroughCollectivesNamesTheRanksItReached) {
  DiffReport r = Diverged();
  r.first_divergence->inputs_equal = true;
  r.explained = {Explanation{0, 1, 0xabc, 7, "world"}, Explanation{2, 1, 0xabc, 7, "world"}};
  auto d = Diagnose(r);
  EXPECT_EQ(d->cause, "op_itself");
  EXPECT_TRUE(Has(d->spread, "rank(s) 0 (via world seq 7), 2 (via world seq 7)")) << d->spread;
  // Both faces carry it.
  EXPECT_EQ(ToJson(r)["diagnosis"]["cause"], "op_itself");
  EXPECT_TRUE(Has(ToText(r), "diagnosis (op_itself): ")) << ToText(r);
}

}  // namespace
}  // namespace opguard::aligner
