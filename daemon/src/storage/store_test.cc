#include "storage/store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "opguard/daemon/testing/batch_maker.h"
#include "storage/meta_values.h"
#include "storage/temp_store.h"

namespace opguard::daemon {
namespace {

TEST(Store, RegistryRoundTripsAndDeleteRemovesEverything) {
  testing::TempDir dir;
  Config config;
  config.data_dir = dir.path() + "/data";
  RunState run;
  run.id = 3;
  run.name = "r1";
  run.determinism = {{"tf32", "off"}};
  run.ranks[0].ops = 10;
  run.ranks[0].sessions[7].Mark(0);
  run.ranks[0].sessions[7].Mark(2);
  {
    auto store = Store::Open(config);
    ASSERT_TRUE(store.ok()) << store.status().message();
    StoreBatch wb(store->get());
    wb.PutRunMeta(run);
    wb.PutRank(3, 0, run.ranks[0]);
    for (uint64_t i = 0; i < 5; ++i) wb.PutOpChunk(3, 0, 0, i, "v");
    wb.PutOpChunk(4, 0, 0, 0, "other run");
    ASSERT_TRUE((*store)->Write(&wb, true).ok());
    ASSERT_TRUE((*store)->Close().ok());
  }
  auto store = Store::Open(config);
  ASSERT_TRUE(store.ok());
  std::map<std::string, RunState> runs;
  uint64_t next = 0;
  ASSERT_TRUE((*store)->LoadRegistry(&runs, &next).ok());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(next, 4u);
  const RunState& loaded = runs.at("r1");
  EXPECT_EQ(loaded.determinism.at(0).second, "off");
  EXPECT_EQ(loaded.ranks.at(0).ops, 10u);
  EXPECT_TRUE(loaded.ranks.at(0).sessions.at(7).Applied(2));
  EXPECT_FALSE(loaded.ranks.at(0).sessions.at(7).Applied(1));

  bool more = false;
  int n = 0;
  ASSERT_TRUE((*store)->ScanOps(3, 0, 0, 1, 3, [&](uint64_t, const rocksdb::Slice&) { ++n; }, &more).ok());
  EXPECT_EQ(n, 3);
  EXPECT_TRUE(more);

  StoreBatch wb(store->get());
  wb.DeleteRun(loaded);
  ASSERT_TRUE((*store)->Write(&wb, true).ok());
  (*store)->CompactRun(3);
  n = 0;
  ASSERT_TRUE((*store)->ScanOps(3, 0, 0, 0, 100, [&](uint64_t, const rocksdb::Slice&) { ++n; }, &more).ok());
  EXPECT_EQ(n, 0);
  ASSERT_TRUE((*store)->ScanOps(4, 0, 0, 0, 100, [&](uint64_t, const rocksdb::Slice&) { ++n; }, &more).ok());
  EXPECT_EQ(n, 1);
  ASSERT_TRUE((*store)->LoadRegistry(&runs, &next).ok());
  EXPECT_TRUE(runs.empty());
}

TEST(Store, NextLaneSkipsEmptyLanesAndStopsAtTheRank) {
  testing::TempDir dir;
  Config config;
  config.data_dir = dir.path() + "/data";
  auto store = Store::Open(config);
  ASSERT_TRUE(store.ok()) << store.status().message();
  StoreBatch wb(store->get());
  // Run 3: rank 0 has lanes 0, 2 and 3072; rank 1 lane 5; run 4 rank 0 lane 9.
  for (uint32_t lane : {0u, 2u, 3072u}) wb.PutOpChunk(3, 0, lane, 0, "v");
  wb.PutOpChunk(3, 1, 5, 0, "v");
  wb.PutOpChunk(4, 0, 9, 0, "v");
  wb.PutOpChunk(3, UINT32_MAX, 1, 0, "v");
  ASSERT_TRUE((*store)->Write(&wb, true).ok());
  EXPECT_EQ((*store)->NextLane(3, 0, 0), 2u);
  EXPECT_EQ((*store)->NextLane(3, 0, 1), 2u);
  EXPECT_EQ((*store)->NextLane(3, 0, 2), 3072u);
  EXPECT_EQ((*store)->NextLane(3, 0, 3072), std::nullopt);  // not rank 1's lane 5
  EXPECT_EQ((*store)->NextLane(3, 1, 0), 5u);
  EXPECT_EQ((*store)->NextLane(3, 1, 5), std::nullopt);  // not run 4's lane 9
  EXPECT_EQ((*store)->NextLane(3, 2, 0), std::nullopt);
  EXPECT_EQ((*store)->NextLane(3, UINT32_MAX, 0), 1u);
  EXPECT_EQ((*store)->NextLane(3, UINT32_MAX, 1), std::nullopt);
  EXPECT_EQ((*store)->NextLane(3, 0, UINT32_MAX), std::nullopt);
}

TEST(SessionState, ContiguousPrefixAndOutOfOrder) {
  SessionState s;
  s.Mark(1);
  EXPECT_FALSE(s.Applied(0));
  EXPECT_TRUE(s.Applied(1));
  s.Mark(0);
  EXPECT_EQ(s.contiguous, 2u);
  EXPECT_TRUE(s.above.empty());
  s.Mark(0);
  EXPECT_EQ(s.contiguous, 2u);
}

TEST(SessionState, OneMissingSeqLeavesOneRangeThatGrows) {
  SessionState s;
  for (uint64_t seq = 1; seq <= 10000; ++seq) s.Mark(seq);
  EXPECT_EQ(s.contiguous, 0u);
  ASSERT_EQ(s.above.size(), 1u);
  EXPECT_EQ(s.above.begin()->first, 1u);
  EXPECT_EQ(s.above.begin()->second, 10001u);
  EXPECT_TRUE(s.Applied(5000));
  EXPECT_FALSE(s.Applied(0));
  EXPECT_FALSE(s.Applied(10001));
  s.Mark(0);  // the late batch closes the gap
  EXPECT_EQ(s.contiguous, 10001u);
  EXPECT_TRUE(s.above.empty());
}

// Nothing is given up: at kMaxRanges ranges a seq that needs one more is
// not marked (its batch is answered "retry later"); seqs next to a range
// still are, so the lowest missing seq always goes in.
TEST(SessionState, AtMostKMaxRangesAndNothingGivenUp) {
  SessionState s;
  for (uint64_t i = 0; i < SessionState::kMaxRanges; ++i) {
    ASSERT_TRUE(s.CanMark(4 * i + 2));
    s.Mark(4 * i + 2);
  }
  EXPECT_EQ(s.above.size(), SessionState::kMaxRanges);
  const uint64_t far = 4 * SessionState::kMaxRanges + 10;
  EXPECT_FALSE(s.CanMark(far));        // would be one range too many
  EXPECT_FALSE(s.CanMark(4));          // between two ranges, next to none
  EXPECT_FALSE(s.Applied(0));          // never taken for applied
  EXPECT_TRUE(s.CanMark(0));           // extends the prefix
  EXPECT_TRUE(s.CanMark(3));           // just after a range
  EXPECT_TRUE(s.CanMark(5));           // just before one
  EXPECT_TRUE(s.CanMark(2));           // already applied
  s.Mark(3);
  s.Mark(5);
  EXPECT_EQ(s.above.size(), SessionState::kMaxRanges);
  EXPECT_TRUE(s.CanMark(4));
  s.Mark(4);                           // joins [2,4) and [5,7)
  EXPECT_EQ(s.above.size(), SessionState::kMaxRanges - 1);
  EXPECT_TRUE(s.CanMark(far));
  s.Mark(0);
  s.Mark(1);                           // the prefix reaches the first range
  EXPECT_EQ(s.contiguous, 7u);
  EXPECT_FALSE(s.Applied(8));
}

// A forgotten session is remembered by id; a batch of it comes back as a
// revived session, whose unmarked seqs are checked against the store.
TEST(SessionState, ForgottenSessionsAreRetiredAndRevived) {
  RankState rank;
  for (uint64_t id = 1; id <= RankState::kMaxSessions + 2; ++id) {
    SessionState& s = rank.Session(id);
    EXPECT_FALSE(s.revived);
    s.Mark(0);
    s.last_ns = id;
    s.group = id;
    rank.TrimSessions(/*durable_group=*/0);
  }
  EXPECT_EQ(rank.sessions.size(), RankState::kMaxSessions + 2) << "marks not yet durable are kept";
  rank.TrimSessions(/*durable_group=*/1);
  EXPECT_EQ(rank.retired, std::vector<uint64_t>{1});
  rank.TrimSessions(/*durable_group=*/100);
  EXPECT_EQ(rank.retired, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(rank.MaybeSeen(1));
  EXPECT_FALSE(rank.MaybeSeen(99));
  EXPECT_TRUE(rank.Session(1).revived);
  EXPECT_FALSE(rank.Session(1).Applied(0));
  EXPECT_EQ(rank.retired, std::vector<uint64_t>{2});
  RankState back = RankFromJson(RankToJson(rank));
  EXPECT_EQ(back.retired, std::vector<uint64_t>{2});
  EXPECT_TRUE(back.sessions.at(1).revived);
  EXPECT_FALSE(back.forgot_retired);
  for (uint64_t id = 1000; id < 1000 + RankState::kMaxRetired + RankState::kMaxSessions + 1; ++id) {
    rank.Session(id).last_ns = id;
    rank.TrimSessions(/*durable_group=*/100);
  }
  EXPECT_EQ(rank.retired.size(), RankState::kMaxRetired);
  EXPECT_TRUE(rank.forgot_retired);
  EXPECT_TRUE(rank.MaybeSeen(123456789));
}

TEST(SessionState, RangesAndTheOlderSeqListRoundTrip) {
  RankState rank;
  rank.world_size = 16;
  rank.sessions[3].Mark(0);
  rank.sessions[3].Mark(5);
  rank.sessions[3].Mark(6);
  RankState back = RankFromJson(RankToJson(rank));
  EXPECT_EQ(back.world_size, 16u);
  EXPECT_EQ(back.sessions[3].contiguous, 1u);
  EXPECT_EQ(back.sessions[3].above, (std::map<uint64_t, uint64_t>{{5, 7}}));
  // Stores written before ranges kept every applied seq above the prefix.
  auto old =
      nlohmann::json::parse(R"({"sessions": [{"id": 3, "contiguous": 1, "above": [5, 6, 9]}]})");
  RankState loaded = RankFromJson(old);
  EXPECT_EQ(loaded.sessions[3].above, (std::map<uint64_t, uint64_t>{{5, 7}, {9, 10}}));
}

TEST(Store, DeletingARunGivesItsBlobFilesBack) {
  testing::TempDir dir;
  Config config;
  config.data_dir = dir.path() + "/data";
  auto store = Store::Open(config);
  ASSERT_TRUE(store.ok());
  // Above min_blob_size and incompressible: stored in a blob file.
  std::string chunk(8192, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : chunk) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  StoreBatch wb(store->get());
  for (uint64_t run : {5, 6}) {
    for (uint64_t i = 0; i < 64; ++i) {
      chunk[i] = static_cast<char>(run);
      wb.PutOpChunk(run, 0, 0, i, chunk + std::to_string(run));
    }
  }
  ASSERT_TRUE((*store)->Write(&wb, true).ok());
  ASSERT_TRUE((*store)->Flush().ok());
  // Only the ops column family stores blobs.
  const uint64_t before = (*store)->IntProperty("rocksdb.live-blob-file-size");
  EXPECT_GT(before, 64u * 8192);
  RunState run;
  run.id = 5;
  run.name = "five";
  StoreBatch del(store->get());
  del.DeleteRun(run);
  ASSERT_TRUE((*store)->Write(&del, true).ok());
  (*store)->CompactRun(5);
  const uint64_t after = (*store)->IntProperty("rocksdb.live-blob-file-size");
  // Run 6 shared the blob file; its blobs were relocated, run 5's are gone.
  EXPECT_LT(after, before * 3 / 4);
  int n = 0;
  bool more = false;
  std::string value;
  ASSERT_TRUE((*store)->ScanOps(6, 0, 0, 0, 1000, [&](uint64_t, const rocksdb::Slice& v) {
    ++n;
    value = v.ToString();
  }, &more).ok());
  EXPECT_EQ(n, 64);
  EXPECT_EQ(value, chunk + "6");  // the last one written
  ASSERT_TRUE((*store)->ScanOps(5, 0, 0, 0, 1000, [&](uint64_t, const rocksdb::Slice&) { ++n; }, &more).ok());
  EXPECT_EQ(n, 64);
}

// Bytes that are not UTF-8 (from an older store, or a path that skipped
// validation) are rendered replaced, never thrown on: a throw here would be
// on the ingest thread.
TEST(Store, RunMetaWithInvalidUtf8IsWrittenNotThrown) {
  testing::TempDir dir;
  auto store = OpenTempStore(dir);
  ASSERT_NE(store, nullptr);
  RunState run;
  run.id = 1;
  run.name = "r\xff";
  run.determinism = {{"k\xfe", "caf\xe9"}};
  run.ranks[0].node = "node\xff";
  StoreBatch wb(store.get());
  EXPECT_NO_THROW(wb.PutRunMeta(run));
  EXPECT_NO_THROW(wb.PutRank(1, 0, run.ranks[0]));
  EXPECT_TRUE(store->Write(&wb, true).ok());
}

// A value whose blob no longer matches its checksum is skipped (the scan
// goes on after it and counts it), wherever it is in the lane.
TEST(Store, AnUnreadableValueIsSkippedNotAFailedScan) {
  // Where the flipped byte lands among the 9 records of the blob file: a
  // middle value of lane 0, its last value, lane 1's only value.
  struct Case {
    double where;
    size_t lane0, lane1;
  };
  for (const Case c : {Case{0.5, 7, 1}, Case{0.83, 7, 1}, Case{0.97, 8, 0}}) {
    const double where = c.where;
    testing::TempDir dir;
    Config config;
    config.data_dir = dir.path() + "/data";
    {
      auto store = Store::Open(config);
      ASSERT_TRUE(store.ok()) << store.status().message();
      StoreBatch wb(store->get());
      // Values of 2 KiB go to a blob file (min_blob_size 1 KiB).
      for (uint64_t op = 0; op < 8; ++op) wb.PutOpChunk(3, 0, 0, op, std::string(2048, static_cast<char>('a' + op)));
      wb.PutOpChunk(3, 0, 1, 0, std::string(2048, 'z'));  // the next lane
      ASSERT_TRUE((*store)->Write(&wb, true).ok());
      ASSERT_TRUE((*store)->Close().ok());
    }
    std::filesystem::path blob;
    for (const auto& e : std::filesystem::directory_iterator(config.data_dir)) {
      if (e.path().extension() == ".blob") blob = e.path();
    }
    ASSERT_FALSE(blob.empty());
    {
      std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
      const auto at = static_cast<std::streamoff>(static_cast<double>(std::filesystem::file_size(blob)) * where);
      f.seekp(at);
      f.put('#');
      ASSERT_TRUE(f.good());
    }
    auto store = Store::Open(config);
    ASSERT_TRUE(store.ok()) << store.status().message();
    std::vector<uint64_t> ops;
    bool more = false;
    Status st = (*store)->ScanOps(3, 0, 0, 0, 100, [&](uint64_t op, const rocksdb::Slice&) { ops.push_back(op); },
                                  &more);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(ops.size(), c.lane0) << "damage at " << where;
    if (c.where == 0.83) {
      EXPECT_EQ(ops.back(), 6u);
    }
    ops.clear();
    ASSERT_TRUE((*store)->ScanOps(3, 0, 1, 0, 100, [&](uint64_t op, const rocksdb::Slice&) { ops.push_back(op); },
                                  &more).ok());
    EXPECT_EQ(ops.size(), c.lane1) << "damage at " << where;
    EXPECT_EQ((*store)->read_errors(), 1u);
  }
}

}  // namespace
}  // namespace opguard::daemon
