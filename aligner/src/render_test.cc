#include "opguard/aligner/render.h"

#include <gtest/gtest.h>

#include "opguard/aligner/cross_rank.h"
#include "opguard/aligner/diff.h"
#include "test_util.h"

namespace opguard::aligner {
namespace {

using testing::Id;
using testing::Rank;

struct Fixture {
  StringTable strings;
  InMemoryDetails ref_details, sus_details;
  DiffContext ctx;

  Fixture() {
    strings.AddString(Id("op:C"), "aten::index_put_");
    strings.AddString(1, "train.py");
    strings.AddString(2, "scatter_router_mask");
    strings.AddSite(Id("site:C"), {1, 214, 2});
    OpDetail d;
    d.op_index = 35;  // suspect index after 33 insertions
    d.step = 12;
    d.name = Id("op:C");
    d.site = Id("site:C");
    InputValue s;
    s.kind = ValueKind::kScalar;
    s.scalar_bits = 1077945344;
    InputValue z;
    z.kind = ValueKind::kScalar;
    d.inputs = {z, s, z, z};
    d.outputs = {TensorInfo{Fp128{5, 6}, DType::kBFloat16, {2, 3}, TensorStats{1, 0, -2, 2, 0.5, 1}, 0}};
    sus_details.Add(3, d);
    d.op_index = 2;
    d.outputs[0].fingerprint = Fp128{7, 8};
    d.outputs[0].stats->nan_count = 0;
    ref_details.Add(3, d);
    ctx = DiffContext{&ref_details, &sus_details, &strings, &strings, {}};
  }
};

RankDiff Sample(const Fixture& f, const std::string& pivot = "C#bad") {
  std::string ins;
  for (int i = 0; i < 33; ++i) ins += "I" + std::to_string(i) + " ";
  RankTrace r = Rank(3, "A B C D E F G H I J K"), s = Rank(3, "A B " + ins + pivot + " D E F G H I J K");
  for (RankTrace* t : {&r, &s}) {
    for (OpEvent& e : t->lanes[0].ops) e.step = 12;
  }
  Result<RankDiff> d = DiffRank(r, s, f.ctx);
  EXPECT_TRUE(d.ok());
  return *d;
}

TEST(Render, DiffJsonHasTheDocumentedFields) {
  Fixture f;
  DiffReport rep = MergeRankDiffs({Sample(f)}, {3});
  nlohmann::json j = ToJson(rep);
  EXPECT_EQ(j["format"], 1);
  EXPECT_EQ(j["status"], "diverged");
  const auto& fd = j["first_divergence"];
  EXPECT_EQ(fd["rank"], 3);
  EXPECT_EQ(fd["step"], 12);
  EXPECT_EQ(fd["op"], "aten::index_put_");
  EXPECT_EQ(fd["op_index"]["reference"], 2);
  EXPECT_EQ(fd["op_index"]["suspect"], 35);
  EXPECT_EQ(fd["site"]["suspect"]["file"], "train.py");
  EXPECT_EQ(fd["site"]["suspect"]["line"], 214);
  EXPECT_EQ(fd["site"]["reference"]["function"], "scatter_router_mask");
  EXPECT_EQ(fd["inputs_equal"], true);
  EXPECT_TRUE(fd["forward_site"].is_null());  // a forward op: no backward context
  EXPECT_EQ(fd["suspect"]["input_signatures"], nlohmann::json::parse("[0, 1077945344, 0, 0]"));
  EXPECT_EQ(j["unaligned_before"]["reference"], 0);
  EXPECT_EQ(j["unaligned_before"]["suspect"], 33);
  EXPECT_EQ(j["aligned"], 2);
  EXPECT_EQ(j["diverging_ranks"], nlohmann::json::parse("[3]"));
  EXPECT_EQ(j["skipped_nondeterministic"], 0);
}

TEST(Render, DiffTextReadsLikeACompilerError) {
  Fixture f;
  std::string text = ToText(MergeRankDiffs({Sample(f)}, {3}));
  EXPECT_EQ(text.rfind("first divergence · rank 3 · step 12 · aten::index_put_  (train.py:214 in scatter_router_mask)\n", 0), 0u)
      << text;
  EXPECT_NE(text.find("aligned 2 ops · unaligned before boundary: reference 0, suspect 33\n"), std::string::npos) << text;
  EXPECT_NE(text.find("inputs identical (fingerprints equal), output differs → the op itself"), std::string::npos);
  EXPECT_NE(text.find("[0, 1077945344, 0, 0]"), std::string::npos) << text;
}

// A backward op run by Python code (a custom Function's backward) has its own
// site; the forward call that created its autograd node comes with it.
TEST(Render, BackwardPivotNamesItsForwardCallSite) {
  Fixture f;
  f.strings.AddString(3, "attention_apply");
  f.strings.AddSite(Id("site:F"), {1, 150, 3});
  for (InMemoryDetails* details : {&f.ref_details, &f.sus_details}) {
    OpDetail d = *details->Find(3, 0, details == &f.ref_details ? 2 : 35);
    d.backward = true;
    d.forward_site = Id("site:F");
    details->Add(3, d);
  }
  DiffReport rep = MergeRankDiffs({Sample(f)}, {3});
  const nlohmann::json fd = ToJson(rep)["first_divergence"];
  EXPECT_EQ(fd["forward_site"]["suspect"]["line"], 150);
  EXPECT_EQ(fd["forward_site"]["reference"]["function"], "attention_apply");
  EXPECT_EQ(fd["suspect"]["forward_site"]["line"], 150);
  EXPECT_EQ(fd["site"]["suspect"]["line"], 214);  // the op's own line stays the site
  std::string text = ToText(rep);
  EXPECT_NE(text.find("  in the backward of the forward at train.py:150 in attention_apply\n"),
            std::string::npos)
      << text;
}

// The pivot's input differs because the suspect ran an op the reference
// lacks (I32, unaligned, just before it): the evidence names that op.
TEST(Render, InputsDifferNameTheUnpairedProducer) {
  Fixture f;
  f.strings.AddString(Id("op:I32"), "aten::mul");
  f.strings.AddSite(Id("site:I32"), {1, 88, 2});
  for (InMemoryDetails* details : {&f.ref_details, &f.sus_details}) {
    const bool sus = details == &f.sus_details;
    OpDetail d = *details->Find(3, 0, sus ? 35 : 2);
    d.inputs[0].kind = ValueKind::kTensor;
    d.inputs[0].tensor.fingerprint = sus ? Fp128{3, 4} : Fp128{1, 2};
    details->Add(3, d);
  }
  OpDetail mul;
  mul.op_index = 34;
  mul.name = Id("op:I32");
  mul.site = Id("site:I32");
  mul.outputs = {TensorInfo{Fp128{3, 4}, DType::kBFloat16, {2, 3}, std::nullopt, 0}};
  f.sus_details.Add(3, mul);
  DiffReport rep = MergeRankDiffs({Sample(f, "~C#bad")}, {3});
  const nlohmann::json fd = ToJson(rep)["first_divergence"];
  EXPECT_EQ(fd["inputs_equal"], false);
  EXPECT_EQ(fd["producer"]["run"], "suspect");
  EXPECT_EQ(fd["producer"]["op"]["op_index"], 34);
  EXPECT_EQ(fd["producer"]["op"]["op"], "aten::mul");
  std::string text = ToText(rep);
  EXPECT_NE(text.find("inputs differ, output differs → an input comes from op #34 aten::mul (train.py:88 in "
                      "scatter_router_mask) of the suspect run, which has no partner in the reference\n"),
            std::string::npos)
      << text;
}

// Gives the pivot (reference op #2, suspect op #35) these kernels per run.
void SetPivotKernels(Fixture& f, const std::vector<std::string>& reference,
                     const std::vector<std::string>& suspect) {
  for (InMemoryDetails* details : {&f.ref_details, &f.sus_details}) {
    const bool is_ref = details == &f.ref_details;
    OpDetail d = *details->Find(3, 0, is_ref ? 2 : 35);
    d.kernels.clear();
    for (const std::string& name : is_ref ? reference : suspect) {
      f.strings.AddString(Id("kernel:" + name), name);
      d.kernels.push_back(Id("kernel:" + name));
    }
    details->Add(3, d);
  }
}

// Same inputs, another GEMM kernel chosen in the suspect run: the classic
// cause the report must name.
TEST(Render, PivotThatRanOtherKernelsSaysSo) {
  Fixture f;
  SetPivotKernels(f, {"ampere_sgemm_128x64_nn", "void at::native::reduce_kernel<512, 1>()"},
                  {"ampere_sgemm_64x32_sliced1x4_nn", "void at::native::reduce_kernel<512, 1>()"});
  DiffReport rep = MergeRankDiffs({Sample(f)}, {3});
  const nlohmann::json fd = ToJson(rep)["first_divergence"];
  EXPECT_EQ(fd["kernels_differ"], true);
  EXPECT_EQ(fd["reference"]["kernels"][0], "ampere_sgemm_128x64_nn");
  EXPECT_EQ(fd["suspect"]["kernels"][0], "ampere_sgemm_64x32_sliced1x4_nn");
  std::string text = ToText(rep);
  EXPECT_NE(text.find("output differs → the op itself, which ran other kernels (another algorithm"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  other kernels ran: kernel 1 of 2 (reference) and 2 (suspect) differs\n"
                      "    reference: ampere_sgemm_128x64_nn\n"
                      "    suspect:   ampere_sgemm_64x32_sliced1x4_nn\n"),
            std::string::npos)
      << text;
}

// Online SDC mode's replica state is a snapshot, not a computation: its pivot
// (no inputs, so "inputs equal") is not blamed on the op.
TEST(Render, ReplicaStatePivotIsNotBlamedOnTheOp) {
  Fixture f;
  f.strings.AddString(Id("op:C"), "opguard::replica_state[SGD:0.3]");
  DiffReport rep = MergeRankDiffs({Sample(f)}, {3});
  EXPECT_EQ(ToJson(rep)["first_divergence"]["op"], "opguard::replica_state[SGD:0.3]");
  const std::string text = ToText(rep);
  EXPECT_NE(text.find("replica state differs → this copy changed since the replicas last agreed: in "
                      "memory, in the update that wrote it, or in what that update read\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("the op itself"), std::string::npos) << text;
}

TEST(Render, PivotKernelsSameOrRecordedInOneRunOnly) {
  Fixture same;
  SetPivotKernels(same, {"k1", "k2"}, {"k1", "k2"});
  DiffReport rep = MergeRankDiffs({Sample(same)}, {3});
  EXPECT_EQ(ToJson(rep)["first_divergence"]["kernels_differ"], false);
  std::string text = ToText(rep);
  EXPECT_NE(text.find("  kernels: the same 2 in both runs\n"), std::string::npos) << text;
  EXPECT_NE(text.find("→ the op itself (kernel race, SDC, wrong code)"), std::string::npos) << text;

  // A run without kernel recording carries empty lists: nothing to compare.
  Fixture one;
  SetPivotKernels(one, {"k1"}, {});
  rep = MergeRankDiffs({Sample(one)}, {3});
  EXPECT_TRUE(ToJson(rep)["first_divergence"]["kernels_differ"].is_null());
  text = ToText(rep);
  EXPECT_NE(text.find("  kernels recorded in the reference run only (not compared)\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("other kernels ran"), std::string::npos) << text;

  // Neither run recorded kernels: not mentioned at all.
  Fixture none;
  rep = MergeRankDiffs({Sample(none)}, {3});
  EXPECT_TRUE(ToJson(rep)["first_divergence"]["kernels_differ"].is_null());
  EXPECT_EQ(ToText(rep).find("kernels"), std::string::npos);
}

// A suspect that launched one kernel more than the reference.
TEST(Render, PivotWithAnExtraKernelNamesIt) {
  Fixture f;
  SetPivotKernels(f, {"gemm"}, {"gemm", "splitk_reduce"});
  std::string text = ToText(MergeRankDiffs({Sample(f)}, {3}));
  EXPECT_NE(text.find("  other kernels ran: kernel 2 of 1 (reference) and 2 (suspect) differs\n"
                      "    reference: (none)\n    suspect:   splitk_reduce\n"),
            std::string::npos)
      << text;
}

TEST(Render, IncompleteAndPartialAreSaid) {
  RankTrace r = Rank(0, "A B C"), s = Rank(0, "A B C");
  s.gaps.push_back(Gap{0, 1, 1});
  Result<RankDiff> d = DiffRank(r, s, {});
  ASSERT_TRUE(d.ok());
  DiffReport rep = MergeRankDiffs({*d}, {0, 1});
  EXPECT_EQ(ToJson(rep)["status"], "partial");
  std::string text = ToText(rep);
  EXPECT_NE(text.find("partial · no answer from rank(s) 1"), std::string::npos) << text;
  EXPECT_NE(text.find("ops #1..#1 missing"), std::string::npos) << text;
}

TEST(Render, CollectivesText) {
  CollectiveEvent a;
  a.communicator = 1;
  a.seq = 4;
  a.kind = CollectiveKind::kAllReduce;
  a.count = 10;
  CollectiveEvent b = a;
  b.count = 20;
  CollectiveEvent e = a;
  e.seq = 5;
  e.phase = CollectivePhase::kEntered;
  CollectivesReport rep = CheckCollectives({{0, {a, e}}, {1, {b}}}, {{1, "tp", {0, 1}}}, nullptr);
  std::string text = ToText(rep);
  EXPECT_NE(text.find("desync · communicator tp seq 4 · count differ"), std::string::npos) << text;
  EXPECT_NE(text.find("waiting · communicator tp seq 5"), std::string::npos) << text;
  nlohmann::json j = ToJson(rep);
  EXPECT_EQ(j["desyncs"][0]["members"][1]["count"], 20);
  EXPECT_EQ(j["live"][0]["not_joined"], nlohmann::json::parse("[1]"));
}

}  // namespace
}  // namespace opguard::aligner
