#include "query/plans.h"

#include <gtest/gtest.h>

#include "opguard/daemon/testing/batch_maker.h"

namespace opguard::daemon {
namespace {

RunState MakeRun(const std::string& name, uint32_t world, const std::string& torch,
                 std::vector<std::pair<std::string, std::string>> determinism) {
  RunState r;
  r.name = name;
  r.world_size = world;
  r.versions = {{"python", "3.11"}, {"torch", torch}};
  r.determinism = std::move(determinism);
  return r;
}

const std::vector<std::pair<std::string, std::string>> kOn = {{"mode", "on"},
                                                              {"allow_tf32", "False"}};

aligner::PreflightReport OneBoundary(uint64_t key) {
  aligner::PreflightReport report;
  report.stable = 10;
  report.nondeterministic = 1;
  aligner::NondeterministicBoundary b;
  b.key = key;
  b.op = "planted::shuffled_sum";
  b.site.file = "train.py";
  b.site.line = 57;
  b.pairs = 1;
  report.boundaries.push_back(b);
  return report;
}

TEST(PlanConfig, SameSettingsInAnyOrderMatch) {
  RunState a = MakeRun("a", 2, "2.11.0", kOn);
  RunState b = MakeRun("b", 2, "2.11.0", {kOn[1], kOn[0]});
  EXPECT_FALSE(ConfigMismatch("p", PlanConfig::Of(a), "b", PlanConfig::Of(b)));
}

TEST(PlanConfig, EachKindOfDifferenceIsRefusedInOneLine) {
  const PlanConfig plan = PlanConfig::Of(MakeRun("a", 2, "2.11.0", kOn));
  auto world = ConfigMismatch("p", plan, "r", PlanConfig::Of(MakeRun("r", 4, "2.11.0", kOn)));
  ASSERT_TRUE(world);
  EXPECT_EQ(*world, "plan 'p' was made for world size 2, run 'r' has 4");
  auto torch = ConfigMismatch("p", plan, "r", PlanConfig::Of(MakeRun("r", 2, "2.15.0", kOn)));
  ASSERT_TRUE(torch);
  EXPECT_EQ(*torch, "plan 'p' was made for torch 2.11.0, run 'r' ran 2.15.0");
  auto off =
      ConfigMismatch("p", plan, "r", PlanConfig::Of(MakeRun("r", 2, "2.11.0", {{"mode", "off"}})));
  ASSERT_TRUE(off);
  // The first setting by name that differs: allow_tf32 (unset in the run).
  EXPECT_EQ(
      *off,
      "plan 'p' was made for determinism allow_tf32=False, run 'r' applied allow_tf32=(unset)");
  for (const auto* why : {&world, &torch, &off}) EXPECT_EQ((*why)->find('\n'), std::string::npos);
}

TEST(PlanConfig, RoundTripsThroughJson) {
  const PlanConfig c = PlanConfig::Of(MakeRun("a", 3, "2.11.0", kOn));
  EXPECT_EQ(PlanConfig::FromJson(c.ToJson()), c);
}

TEST(Plan, DocumentCarriesKeysAndConfigForADiff) {
  RunState a = MakeRun("a", 2, "2.11.0", kOn), b = MakeRun("b", 2, "2.11.0", kOn);
  PlanInputs in{"p", &a, &b, 5, 1000, 42};
  auto plan = MakePlan(in, OneBoundary(0x8000000000000001ull));
  EXPECT_EQ(plan["kind"], "plan");
  EXPECT_EQ(plan["boundaries"][0]["key"], "8000000000000001");
  EXPECT_EQ(plan["boundaries"][0]["site"]["line"], 57);
  EXPECT_TRUE(plan["first_nondeterministic"].is_null());
  auto use = ReadPlanUse("p", plan);
  ASSERT_TRUE(use.ok()) << use.status().message();
  EXPECT_EQ(use->keys, std::vector<uint64_t>{0x8000000000000001ull});
  EXPECT_EQ(use->config, PlanConfig::Of(a));
  plan["boundaries"][0]["key"] = "xyz";
  EXPECT_FALSE(ReadPlanUse("p", plan).ok());
}

TEST(PlanStore, PlansSurviveReopeningAndAreListedAndDeleted) {
  testing::TempDir dir;
  Config config;
  config.data_dir = dir.path() + "/data";
  RunState a = MakeRun("a", 2, "2.11.0", kOn), b = MakeRun("b", 2, "2.11.0", kOn);
  {
    auto store = Store::Open(config);
    ASSERT_TRUE(store.ok()) << store.status().message();
    PlanStore plans(store->get());
    PlanInputs in{"p1", &a, &b, 5, 1000, 1};
    ASSERT_TRUE(plans.Put(MakePlan(in, OneBoundary(7)), false).ok());
    in.name = "p2";
    ASSERT_TRUE(plans.Put(MakePlan(in, OneBoundary(8)), false).ok());
    // A second plan of a name is refused unless replaced.
    Status again = plans.Put(MakePlan(in, OneBoundary(9)), false);
    EXPECT_FALSE(again.ok());
    EXPECT_NE(again.message().find("a plan named 'p2' exists"), std::string::npos);
    ASSERT_TRUE(plans.Put(MakePlan(in, OneBoundary(9)), true).ok());
    ASSERT_TRUE((*store)->Close().ok());
  }
  auto store = Store::Open(config);
  ASSERT_TRUE(store.ok());
  // The run registry's scan of the meta column family passes plans over.
  std::map<std::string, RunState> runs;
  uint64_t next = 0;
  ASSERT_TRUE((*store)->LoadRegistry(&runs, &next).ok());
  EXPECT_TRUE(runs.empty());
  PlanStore plans(store->get());
  auto listed = plans.List();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0]["name"], "p1");
  EXPECT_EQ(listed[1]["boundaries"][0]["key"], "0000000000000009");
  ASSERT_TRUE(plans.Delete("p1").ok());
  EXPECT_FALSE(plans.Get("p1").ok());
  EXPECT_EQ(plans.Get("p1").status().message(), "no plan named 'p1' (see `opguard plans`)");
  EXPECT_TRUE(plans.Get("p2").ok());
  EXPECT_FALSE(plans.Delete("p1").ok());
  EXPECT_FALSE(CheckPlanName("a b").ok());
  EXPECT_FALSE(CheckPlanName("").ok());
}

}  // namespace
}  // namespace opguard::daemon
