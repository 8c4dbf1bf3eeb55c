#include "opguard/aligner/cross_rank.h"

#include <gtest/gtest.h>

#include <tuple>

#include "test_util.h"

namespace opguard::aligner {
namespace {

using testing::Rank;

CollectiveEvent C(uint64_t comm, uint64_t seq, CollectiveKind kind, uint64_t count,
                  CollectivePhase phase = CollectivePhase::kCompleted, Fp128 out = {1, 1}) {
  CollectiveEvent c;
  c.communicator = comm;
  c.seq = seq;
  c.kind = kind;
  c.dtype = DType::kFloat32;
  c.count = count;
  c.phase = phase;
  if (phase == CollectivePhase::kCompleted) c.outputs = {out};
  c.site = 77;
  return c;
}

TEST(CheckCollectives, ConsistentRun) {
  std::vector<RankCollectives> rs;
  for (uint32_t r = 0; r < 4; ++r) {
    RankCollectives rc{r, {}};
    for (uint64_t s = 0; s < 5; ++s) rc.events.push_back(C(1, s, CollectiveKind::kAllReduce, 1024));
    rs.push_back(rc);
  }
  CollectivesReport rep = CheckCollectives(rs, {}, nullptr, {0, 1, 2, 3});
  EXPECT_EQ(rep.status, DiffStatus::kIdentical);
  EXPECT_EQ(rep.collectives, 5u);
  EXPECT_FALSE(rep.waiting);
}

TEST(CommunicatorLabel, NamesGroupsByTheirMembers) {
  EXPECT_EQ(CommunicatorLabel({1, "world", {0, 1, 2, 3}}), "world");
  EXPECT_EQ(CommunicatorLabel({2, "pg0,1", {0, 1}}), "pg[0,1]");
  EXPECT_EQ(CommunicatorLabel({3, "pg12", {12}}), "pg[12]");
  EXPECT_EQ(CommunicatorLabel({4, "", {2, 3}}), "pg[2,3]");
  EXPECT_EQ(CommunicatorLabel({5, "dp", {0, 1, 2}}), "dp");
  EXPECT_EQ(CommunicatorLabel({6, "pgx", {0}}), "pgx");
  EXPECT_EQ(CommunicatorLabel({7, "", {}}), "");
}

TEST(CheckCollectives, DesyncReportsEachRanksSite) {
  StringTable strings;
  strings.AddString(1, "train.py");
  strings.AddString(2, "reduce_grads");
  strings.AddSite(77, {1, 88, 2});
  std::vector<RankCollectives> rs{{0, {C(5, 3, CollectiveKind::kAllReduce, 1024)}},
                                  {1, {C(5, 3, CollectiveKind::kAllReduce, 2048)}},
                                  {2, {C(5, 3, CollectiveKind::kAllGather, 1024)}}};
  CollectivesReport rep = CheckCollectives(rs, {{5, "dp", {0, 1, 2}}}, &strings);
  EXPECT_EQ(rep.status, DiffStatus::kDiverged);
  ASSERT_EQ(rep.desyncs.size(), 1u);
  EXPECT_EQ(rep.desyncs[0].seq, 3u);
  EXPECT_EQ(rep.desyncs[0].fields, (std::vector<std::string>{"count", "kind"}));
  EXPECT_EQ(rep.desyncs[0].communicator, 5u);
  EXPECT_EQ(rep.desyncs[0].communicator_name, "dp");
  // Every member, with what it called and where.
  const std::vector<std::tuple<uint32_t, std::string, uint64_t>> expected{
      {0, "all_reduce", 1024}, {1, "all_reduce", 2048}, {2, "all_gather", 1024}};
  ASSERT_EQ(rep.desyncs[0].members.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const CollectiveMember& m = rep.desyncs[0].members[i];
    EXPECT_EQ(std::tie(m.rank, m.kind, m.count), expected[i]) << i;
    EXPECT_EQ(m.dtype, "float32") << i;
    EXPECT_EQ(m.site.file, "train.py") << i;
    EXPECT_EQ(m.site.function, "reduce_grads") << i;
    EXPECT_EQ(m.site.line, 88u) << i;
  }
  EXPECT_TRUE(rep.mismatches.empty());
}

TEST(CheckCollectives, PointToPointIsNotADesync) {
  auto send = C(9, 0, CollectiveKind::kSend, 64);
  send.root = 1;
  auto recv = C(9, 0, CollectiveKind::kRecv, 64);
  recv.root = 0;
  CollectivesReport rep = CheckCollectives({{0, {send}}, {1, {recv}}}, {}, nullptr);
  EXPECT_TRUE(rep.desyncs.empty());
}

TEST(CheckCollectives, OutputMismatchNamesTheMinority) {
  std::vector<RankCollectives> rs;
  for (uint32_t r = 0; r < 4; ++r) {
    Fp128 out = r == 2 ? Fp128{9, 9} : Fp128{1, 1};
    rs.push_back({r, {C(1, 0, CollectiveKind::kAllReduce, 8, CollectivePhase::kCompleted, out)}});
  }
  CollectivesReport rep = CheckCollectives(rs, {}, nullptr);
  EXPECT_EQ(rep.status, DiffStatus::kDiverged);
  ASSERT_EQ(rep.mismatches.size(), 1u);
  EXPECT_EQ(rep.mismatches[0].minority_ranks, std::vector<uint32_t>{2});
  EXPECT_EQ(rep.mismatches[0].groups[0], (std::vector<uint32_t>{0, 1, 3}));
}

TEST(CheckCollectives, ReduceScatterOutputsMayDiffer) {
  std::vector<RankCollectives> rs;
  for (uint32_t r = 0; r < 2; ++r) {
    rs.push_back({r, {C(1, 0, CollectiveKind::kReduceScatter, 8, CollectivePhase::kCompleted, Fp128{r, 0})}});
  }
  EXPECT_TRUE(CheckCollectives(rs, {}, nullptr).mismatches.empty());
}

TEST(CheckCollectives, LiveViewListsEveryCollectivesKindAsRuns) {
  // Seqs 0-2 all-gather, 3-4 reduce-scatter, 5 all-reduce, 7 all-gather (no
  // record of 6 anywhere); rank 1 records a broadcast at seq 5 (a desync:
  // the lowest rank's record names the kind).
  std::vector<RankCollectives> rs;
  for (uint32_t r = 0; r < 2; ++r) {
    RankCollectives rc{r, {}};
    for (uint64_t s : {0, 1, 2}) rc.events.push_back(C(1, s, CollectiveKind::kAllGather, 8));
    for (uint64_t s : {3, 4}) rc.events.push_back(C(1, s, CollectiveKind::kReduceScatter, 8));
    rc.events.push_back(C(1, 5, r == 0 ? CollectiveKind::kAllReduce : CollectiveKind::kBroadcast, 8));
    rc.events.push_back(C(1, 7, CollectiveKind::kAllGather, 8));
    rs.push_back(rc);
  }
  CollectivesReport rep = CheckCollectives(rs, {}, nullptr);
  ASSERT_EQ(rep.live.size(), 1u);
  const auto& k = rep.live[0].kinds;
  ASSERT_EQ(k.size(), 4u);
  EXPECT_EQ(std::tie(k[0].first_seq, k[0].last_seq, k[0].kind), std::make_tuple(0u, 2u, std::string("all_gather")));
  EXPECT_EQ(std::tie(k[1].first_seq, k[1].last_seq, k[1].kind), std::make_tuple(3u, 4u, std::string("reduce_scatter")));
  EXPECT_EQ(std::tie(k[2].first_seq, k[2].last_seq, k[2].kind), std::make_tuple(5u, 5u, std::string("all_reduce")));
  EXPECT_EQ(std::tie(k[3].first_seq, k[3].last_seq, k[3].kind), std::make_tuple(7u, 7u, std::string("all_gather")));
  ASSERT_EQ(rep.desyncs.size(), 1u);
  EXPECT_EQ(rep.desyncs[0].seq, 5u);
}

TEST(CheckCollectives, HungCollectiveNamesWhoHasNotJoined) {
  // Ranks 0, 1, 2 completed seq 0..6 and entered seq 7; rank 3 completed up to 6
  // only. A rank with no record at all of the communicator (rank 4) is a member
  // that never joined anything.
  std::vector<RankCollectives> rs;
  for (uint32_t r = 0; r < 4; ++r) {
    RankCollectives rc{r, {}};
    for (uint64_t s = 0; s < 7; ++s) rc.events.push_back(C(1, s, CollectiveKind::kAllReduce, 8));
    if (r != 3) {
      auto e = C(1, 7, CollectiveKind::kAllReduce, 8, CollectivePhase::kEntered);
      e.time_ns = 1000 + r;
      rc.events.push_back(e);
    }
    rs.push_back(rc);
  }
  CollectivesReport rep = CheckCollectives(rs, {{1, "world", {0, 1, 2, 3}}}, nullptr);
  ASSERT_EQ(rep.live.size(), 1u);
  const CommunicatorLive& l = rep.live[0];
  ASSERT_TRUE(l.pending_seq);
  EXPECT_EQ(*l.pending_seq, 7u);
  EXPECT_EQ(l.waiting, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(l.not_joined, std::vector<uint32_t>{3});
  EXPECT_EQ(l.pending_kind, "all_reduce");
  EXPECT_EQ(l.waiting_since_ns, 1000u);
  EXPECT_EQ(l.ranks[3].last_entered, 6);
  EXPECT_EQ(l.ranks[3].last_completed, 6);
  EXPECT_TRUE(rep.waiting);

  CollectivesReport rep2 = CheckCollectives(rs, {{1, "world", {0, 1, 2, 3, 4}}}, nullptr);
  // pending is the first seq not completed by every member: rank 4 has none.
  EXPECT_EQ(*rep2.live[0].pending_seq, 0u);
  EXPECT_EQ(rep2.live[0].not_joined, std::vector<uint32_t>{4});
}

TEST(CheckCollectives, IdleCommunicatorIsNotWaiting) {
  std::vector<RankCollectives> rs{{0, {C(1, 0, CollectiveKind::kBarrier, 0)}},
                                  {1, {C(1, 0, CollectiveKind::kBarrier, 0)}}};
  CollectivesReport rep = CheckCollectives(rs, {}, nullptr, {0, 1, 2});
  EXPECT_FALSE(rep.live[0].pending_seq);
  EXPECT_EQ(rep.status, DiffStatus::kPartial);
  EXPECT_EQ(rep.missing_ranks, std::vector<uint32_t>{2});
}

TEST(CompareReplicas, OddRankIsTheOneOutsideTheMajority) {
  std::vector<RankTrace> ts{Rank(0, "A B C D E"), Rank(1, "A B C D E"), Rank(2, "A B C#flip D#x E#x"),
                            Rank(3, "A B C D E")};
  std::vector<const RankTrace*> ptrs;
  for (auto& t : ts) ptrs.push_back(&t);
  Result<ReplicaReport> rep = CompareReplicas(ptrs, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->status, DiffStatus::kDiverged);
  EXPECT_EQ(rep->odd_ranks, std::vector<uint32_t>{2});
  // Rank 2's C, against the base rank's C: same inputs, another output.
  ASSERT_TRUE(rep->first_divergence);
  const FirstDivergence& fd = *rep->first_divergence;
  EXPECT_EQ(fd.rank, 2u);
  EXPECT_EQ(fd.reference.rank, 0u);
  EXPECT_EQ(fd.suspect.rank, 2u);
  EXPECT_EQ(fd.reference.op_index, 2u);
  EXPECT_EQ(fd.suspect.op_index, 2u);
  EXPECT_EQ(fd.reference.output_digest, testing::Ev("C", 2).outputs);
  EXPECT_EQ(fd.suspect.output_digest, testing::Ev("C#flip", 2).outputs);
  EXPECT_TRUE(fd.inputs_equal);
}

TEST(CompareReplicas, BaseRankCanBeTheOddOne) {
  std::vector<RankTrace> ts{Rank(0, "A B#flip C"), Rank(1, "A B C"), Rank(2, "A B C")};
  std::vector<const RankTrace*> ptrs{&ts[0], &ts[1], &ts[2]};
  Result<ReplicaReport> rep = CompareReplicas(ptrs, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->odd_ranks, std::vector<uint32_t>{0});
}

TEST(CompareReplicas, OnlyReplicatedOpsAreComparedWhenMarked) {
  // Each replica's forward ops (F, G) see its own data; the optimizer's ops
  // (U, V, marked '+') must agree. Rank 2's second update differs.
  std::vector<RankTrace> ts{Rank(0, "F#a G#a U+ V+ F#d G#d U+ V+"),
                            Rank(1, "F#b G#b U+ V+ F#e G#e U+ V+"),
                            Rank(2, "F#c G#c U+ V+ F#f G#f U+ V#flip+")};
  std::vector<const RankTrace*> ptrs{&ts[0], &ts[1], &ts[2]};
  Result<ReplicaReport> rep = CompareReplicas(ptrs, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->replicated_only);
  EXPECT_EQ(rep->compared_ops, 4u);
  EXPECT_EQ(rep->status, DiffStatus::kDiverged);
  EXPECT_EQ(rep->odd_ranks, std::vector<uint32_t>{2});
  // The report points at the op's index in the full trace.
  EXPECT_EQ(rep->first_divergence->reference.op_index, 7u);
  EXPECT_EQ(rep->first_divergence->suspect.op_index, 7u);
  EXPECT_TRUE(rep->notes.empty());

  // Without rank 2, the replicas agree although every forward op differs.
  Result<ReplicaReport> clean = CompareReplicas({&ts[0], &ts[1]}, {});
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ(clean->status, DiffStatus::kIdentical);
}

TEST(CompareReplicas, UnmarkedTracesAreComparedWholeWithANote) {
  std::vector<RankTrace> ts{Rank(0, "F#a U"), Rank(1, "F#b U")};
  Result<ReplicaReport> rep = CompareReplicas({&ts[0], &ts[1]}, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_FALSE(rep->replicated_only);
  EXPECT_EQ(rep->compared_ops, 2u);
  EXPECT_EQ(rep->status, DiffStatus::kDiverged);
  EXPECT_EQ(rep->first_divergence->reference.op_index, 0u);
  ASSERT_FALSE(rep->notes.empty());  // and: no majority of two
  EXPECT_NE(rep->notes[0].find("no op is marked replicated"), std::string::npos);
}

TEST(CompareReplicas, RankWithoutMarkedOpsIsNamed) {
  std::vector<RankTrace> ts{Rank(0, "F#a U+"), Rank(1, "F#b U")};
  Result<ReplicaReport> rep = CompareReplicas({&ts[0], &ts[1]}, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->replicated_only);
  ASSERT_EQ(rep->notes.size(), 1u);
  EXPECT_NE(rep->notes[0].find("rank 1 recorded no op marked replicated"), std::string::npos);
}

TEST(CompareReplicas, NeedsTwoRanks) {
  RankTrace t = Rank(0, "A");
  EXPECT_FALSE(CompareReplicas({&t}, {}).ok());
}

}  // namespace
}  // namespace opguard::aligner
