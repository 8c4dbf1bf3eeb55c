// Collective summaries travel grouped (one CollectiveGroup per distinct record
// with the ranks that recorded it): the grouped answer must read back to
// exactly the per-rank records, and give the same verdict.
#include <gtest/gtest.h>

#include <map>

#include "opguard/daemon/report_wire.h"

namespace opguard::daemon {
namespace {

aligner::CollectiveEvent AllReduce(uint64_t seq, uint64_t out, uint64_t time_ns) {
  aligner::CollectiveEvent e;
  e.communicator = 11;
  e.seq = seq;
  e.kind = aligner::CollectiveKind::kAllReduce;
  e.dtype = aligner::DType::kFloat32;
  e.count = 1024;
  e.reduce_op = 0;
  e.outputs = {{out, 7}};
  e.op_index = 40 + seq;
  e.step = seq / 4;
  e.site = 99;
  e.time_ns = time_ns;
  return e;
}

using RankOffsets = std::vector<flatbuffers::Offset<wire::RankCollectives>>;

// An answer listing `ranks` (built in `b`) with `by_rank`'s records grouped.
const wire::CollectivesAnswer* Finish(
    flatbuffers::FlatBufferBuilder& b, const RankOffsets& ranks,
    const std::map<uint32_t, std::vector<aligner::CollectiveEvent>>& by_rank) {
  auto ranks_vec = b.CreateVector(ranks);
  auto groups = CollectiveGroupsToWire(b, by_rank);
  wire::CollectivesAnswerBuilder ab(b);
  ab.add_ranks(ranks_vec);
  ab.add_groups(groups);
  b.Finish(ab.Finish());
  return flatbuffers::GetRoot<wire::CollectivesAnswer>(b.GetBufferPointer());
}

struct Answer {
  flatbuffers::FlatBufferBuilder b;
  const wire::CollectivesAnswer* root = nullptr;
};

// Every rank of `by_rank` listed, its records grouped.
void Build(const std::map<uint32_t, std::vector<aligner::CollectiveEvent>>& by_rank, Answer* a) {
  RankOffsets ranks;
  for (const auto& [rank, events] : by_rank) ranks.push_back(wire::CreateRankCollectives(a->b, rank));
  a->root = Finish(a->b, ranks, by_rank);
}

TEST(CollectiveGroups, IdenticalRecordsOfManyRanksTravelOnce) {
  std::map<uint32_t, std::vector<aligner::CollectiveEvent>> by_rank;
  for (uint32_t rank = 0; rank < 8; ++rank) {
    for (uint64_t seq = 0; seq < 100; ++seq) by_rank[rank].push_back(AllReduce(seq, seq, 1000 + rank));
  }
  // Rank 5's output differs at seq 42: its record is a group of its own.
  by_rank[5][42].outputs[0].lo = 123456;
  Answer a;
  Build(by_rank, &a);
  ASSERT_NE(a.root->groups(), nullptr);
  EXPECT_EQ(a.root->groups()->size(), 101u);

  auto back = CollectivesFromWire(*a.root);
  ASSERT_EQ(back.size(), 8u);
  for (const auto& rc : back) {
    ASSERT_EQ(rc.events.size(), 100u) << rc.rank;
    for (size_t k = 0; k < rc.events.size(); ++k) {
      const auto& got = rc.events[k];
      const auto& want = by_rank[rc.rank][k];
      EXPECT_EQ(got.seq, want.seq);
      EXPECT_EQ(got.outputs, want.outputs);
      EXPECT_EQ(got.op_index, want.op_index);
      EXPECT_EQ(got.site, want.site);
      // time_ns: the earliest of the group (what "waiting since" needs).
      EXPECT_EQ(got.time_ns, rc.rank == 5 && k == 42 ? 1005u : 1000u);
    }
  }
  // The same answer with one record per rank and collective (the form the
  // groups replace) is over five times larger (8 ranks).
  flatbuffers::FlatBufferBuilder per_rank;
  std::vector<flatbuffers::Offset<wire::RankCollectives>> ranks;
  for (const auto& [rank, events] : by_rank) {
    std::vector<flatbuffers::Offset<wire::CollectiveRecord>> records;
    for (const auto& e : events) records.push_back(CollectiveToWire(per_rank, e));
    ranks.push_back(wire::CreateRankCollectives(per_rank, rank, per_rank.CreateVector(records)));
  }
  auto ranks_vec = per_rank.CreateVector(ranks);
  wire::CollectivesAnswerBuilder pb(per_rank);
  pb.add_ranks(ranks_vec);
  per_rank.Finish(pb.Finish());
  EXPECT_LT(a.b.GetSize() * 5, per_rank.GetSize()) << a.b.GetSize() << " vs " << per_rank.GetSize();

  auto report = CheckCollectivesAnswer(*a.root);
  EXPECT_EQ(report.status, aligner::DiffStatus::kDiverged);
  ASSERT_EQ(report.mismatches.size(), 1u);
  EXPECT_EQ(report.mismatches[0].seq, 42u);
}

TEST(CollectiveGroups, PerRankEventsAndGroupsBothRead) {
  // An answer may carry records in ranks[].events (older senders) and in groups.
  flatbuffers::FlatBufferBuilder b;
  std::map<uint32_t, std::vector<aligner::CollectiveEvent>> grouped{{1, {AllReduce(0, 5, 1)}}};
  auto e0 = CollectiveToWire(b, AllReduce(0, 5, 1));
  RankOffsets ranks{wire::CreateRankCollectives(b, 0, b.CreateVector(std::vector{e0})),
                    wire::CreateRankCollectives(b, 1),
                    wire::CreateRankCollectives(b, 1)};  // listed twice: the first listing wins
  auto back = CollectivesFromWire(*Finish(b, ranks, grouped));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].rank, 0u);
  EXPECT_EQ(back[1].rank, 1u);
  EXPECT_EQ(back[0].events.size(), 1u);
  EXPECT_EQ(back[1].events.size(), 1u);
}

TEST(CollectiveGroups, GroupNamingAnUnlistedRankIsIgnored) {
  std::map<uint32_t, std::vector<aligner::CollectiveEvent>> by_rank{{0, {AllReduce(0, 1, 1)}},
                                                                      {3, {AllReduce(0, 1, 1)}}};
  flatbuffers::FlatBufferBuilder b;
  auto back = CollectivesFromWire(*Finish(b, {wire::CreateRankCollectives(b, 0)}, by_rank));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].rank, 0u);
  EXPECT_EQ(back[0].events.size(), 1u);
}

// A peer's pivot crosses the wire with its sites: the op's own and, for a
// backward op with a site of its own, the forward call's.
TEST(RankDiffWire, PivotSitesTravel) {
  aligner::RankDiff d;
  d.rank = 2;
  d.status = aligner::DiffStatus::kDiverged;
  aligner::FirstDivergence f;
  f.rank = 2;
  f.op = "aten::matmul [AttentionBackward]";
  f.suspect.backward = true;
  f.suspect.site = {7, "train.py", 88, "backward"};
  f.suspect.forward_site = {9, "train.py", 150, "forward"};
  f.reference = f.suspect;
  f.reference.forward_site = {};
  d.first_divergence = f;
  flatbuffers::FlatBufferBuilder b;
  b.Finish(RankDiffToWire(b, d));
  aligner::RankDiff back = RankDiffFromWire(*flatbuffers::GetRoot<wire::RankDiff>(b.GetBufferPointer()));
  ASSERT_TRUE(back.first_divergence.has_value());
  const aligner::OpView& s = back.first_divergence->suspect;
  EXPECT_EQ(s.site.line, 88u);
  EXPECT_EQ(s.forward_site.id, 9u);
  EXPECT_EQ(s.forward_site.file, "train.py");
  EXPECT_EQ(s.forward_site.line, 150u);
  EXPECT_EQ(s.forward_site.function, "forward");
  EXPECT_EQ(back.first_divergence->reference.forward_site.id, 0u);
  EXPECT_FALSE(back.first_divergence->producer);
  EXPECT_EQ(back.first_divergence->producer_run, "");

  // An unpaired producer of a differing input travels with the pivot.
  aligner::OpView mul;
  mul.op_index = 41;
  mul.op = "aten::mul";
  mul.site = {11, "train.py", 80, "forward"};
  d.first_divergence->producer = mul;
  d.first_divergence->producer_run = "reference";
  b.Clear();
  b.Finish(RankDiffToWire(b, d));
  back = RankDiffFromWire(*flatbuffers::GetRoot<wire::RankDiff>(b.GetBufferPointer()));
  ASSERT_TRUE(back.first_divergence && back.first_divergence->producer);
  EXPECT_EQ(back.first_divergence->producer_run, "reference");
  EXPECT_EQ(back.first_divergence->producer->op_index, 41u);
  EXPECT_EQ(back.first_divergence->producer->op, "aten::mul");
  EXPECT_EQ(back.first_divergence->producer->site.line, 80u);
  EXPECT_FALSE(back.first_divergence->trusted_candidate);
  EXPECT_EQ(back.skipped_trusted, 0u);

  // Trusted mode: the candidate trusted op and the counts travel too.
  aligner::OpView mm;
  mm.op_index = 39;
  mm.op = "aten::mm";
  mm.trusted = true;
  d.first_divergence->trusted_candidate = mm;
  d.first_divergence->trusted_before = 17;
  d.skipped_trusted = 23;
  b.Clear();
  b.Finish(RankDiffToWire(b, d));
  back = RankDiffFromWire(*flatbuffers::GetRoot<wire::RankDiff>(b.GetBufferPointer()));
  ASSERT_TRUE(back.first_divergence && back.first_divergence->trusted_candidate);
  EXPECT_EQ(back.first_divergence->trusted_candidate->op_index, 39u);
  EXPECT_EQ(back.first_divergence->trusted_candidate->op, "aten::mm");
  EXPECT_TRUE(back.first_divergence->trusted_candidate->trusted);
  EXPECT_FALSE(back.first_divergence->suspect.trusted);
  EXPECT_EQ(back.first_divergence->trusted_before, 17u);
  EXPECT_EQ(back.skipped_trusted, 23u);
  EXPECT_FALSE(back.first_divergence->code_changed);

  // A pivot paired across an edited line says so.
  d.first_divergence->code_changed = true;
  b.Clear();
  b.Finish(RankDiffToWire(b, d));
  back = RankDiffFromWire(*flatbuffers::GetRoot<wire::RankDiff>(b.GetBufferPointer()));
  ASSERT_TRUE(back.first_divergence);
  EXPECT_TRUE(back.first_divergence->code_changed);
}

}  // namespace
}  // namespace opguard::daemon
