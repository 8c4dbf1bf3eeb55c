// The RocksDB-backed aligner inputs (trace_source.h) and the wire form of
// aligner answers (report_wire.h), against a real store.
#include "query/trace_source.h"

#include <thread>

#include <gtest/gtest.h>

#include "opguard/aligner/diff.h"
#include "opguard/aligner/render.h"
#include "opguard/daemon/report_wire.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "storage/op_chunk.h"
#include "query/trace_cache.h"
#include "storage/record_copy.h"

namespace opguard::daemon {
namespace {

constexpr uint64_t kAdd = 0x1001, kMul = 0x1002, kFile = 0x2001, kFunc = 0x2002, kSite = 0x3001;
constexpr uint64_t kComm = 0xC0FFEE;

std::string Op(uint32_t lane, uint64_t index, uint64_t name, uint64_t fp,
               double scalar_bits_src = 0) {
  flatbuffers::FlatBufferBuilder b;
  wire::Fp128 f(fp, fp * 3);
  std::vector<int64_t> shape{4, 4};
  auto out = wire::CreateTensorSig(b, &f, wire::DType::Float32, b.CreateVector(shape),
                                   wire::CreateTensorStats(b, 0, 0, -1, 1, 0.5, 2));
  auto in_sig = wire::CreateTensorSig(b, &f, wire::DType::Float32, b.CreateVector(shape));
  std::vector<flatbuffers::Offset<wire::Value>> inputs{
      wire::CreateValue(b, wire::ValueKind::Tensor, in_sig),
      wire::CreateValue(b, wire::ValueKind::Scalar, 0, static_cast<uint64_t>(scalar_bits_src),
                        wire::DType::Float32)};
  b.Finish(wire::CreateOpRecord(
      b, lane, index, index / 10, name, kSite, -1, false, b.CreateVector(inputs),
      b.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{out})));
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

std::string Collective(uint64_t seq, wire::CollectivePhase phase, uint64_t op_index,
                       uint64_t count = 16) {
  flatbuffers::FlatBufferBuilder b;
  wire::Fp128 f(seq + 1, 7);
  auto out = wire::CreateTensorSig(b, &f, wire::DType::Float32);
  b.Finish(wire::CreateCollectiveRecord(
      b, kComm, seq, phase, wire::CollectiveKind::AllReduce, wire::DType::Float32, count, -1, 0, 0,
      phase == wire::CollectivePhase::Completed
          ? b.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{out})
          : 0,
      0, op_index, op_index / 10, kSite, 1000 + seq));
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

std::string Gap(uint32_t lane, uint64_t first, uint64_t last, uint64_t comm = 0) {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateGapNotice(b, lane, first, last, last - first + 1, b.CreateString("test"),
                                 comm, comm ? first : 0, comm ? last : 0));
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

class TraceSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Config config;
    config.data_dir = dir_.path() + "/data";
    auto store = Store::Open(config);
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = std::move(store).value();
  }

  // Strings, sites and the communicator of run `run`.
  void WriteDefs(StoreBatch& wb, uint64_t run) {
    wb.PutString(run, kAdd, "aten::add");
    wb.PutString(run, kMul, "aten::mul");
    wb.PutString(run, kFile, "train.py");
    wb.PutString(run, kFunc, "step");
    wb.PutSite(run, kSite, SiteDef{kFile, 214, kFunc});
    flatbuffers::FlatBufferBuilder cb;
    cb.Finish(wire::CreateCommunicatorDef(cb, kComm, cb.CreateString("world"), 2,
                                          cb.CreateVector(std::vector<uint32_t>{0, 1})));
    wb.PutCommunicator(run, kComm, std::string(reinterpret_cast<const char*>(cb.GetBufferPointer()), cb.GetSize()));
  }

  // Run `run`: rank 0 with 100 ops on lane 0 and 5 on lane 1; from op
  // `diverge_at` on lane 0 the outputs differ; collectives after every 20 ops.
  void WriteRun(uint64_t run, uint64_t diverge_at, bool with_gap) {
    StoreBatch wb(store_.get());
    for (uint64_t i = 0; i < 100; ++i) {
      uint64_t fp = 100 + i + (i >= diverge_at ? 1000000 : 0);
      wb.PutOpChunk(run, 0, 0, i,
             Op(0, i, i % 2 ? kAdd : kMul, fp, 1077936128));
    }
    for (uint64_t i = 0; i < 5; ++i)
      wb.PutOpChunk(run, 0, 1, i, Op(1, i, kAdd, 9 + i));
    wb.PutOpChunk(run, 1, 0, 0,
           Op(0, 0, kAdd, 1));  // another rank: not read
    for (uint64_t s = 0; s < 5; ++s) {
      wb.PutCollective(run, 0, kComm, s, 1,
             Collective(s, wire::CollectivePhase::Entered, s * 20 + 19));
      wb.PutCollective(run, 0, kComm, s, 0,
             Collective(s, wire::CollectivePhase::Completed, s * 20 + 19));
    }
    wb.PutCollective(run, 1, kComm, 0, 1,
           Collective(0, wire::CollectivePhase::Entered, 19, 32));
    if (with_gap) {
      wb.PutOpGap(run, 0, 0, 40, Gap(0, 40, 44));
      wb.PutCollectiveGap(run, 0, kComm, 7, Gap(0, 7, 9, kComm));
    }
    WriteDefs(wb, run);
    ASSERT_TRUE(store_->Write(&wb, true).ok());
  }

  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(TraceSourceTest, LoadsLanesGapsAndCollectivesOfOneRank) {
  WriteRun(1, 1000, true);
  auto trace = LoadRankTrace(*store_, 1, 0, true);
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  ASSERT_EQ(trace->lanes.size(), 2u);
  EXPECT_EQ(trace->lanes[0].ops.size(), 100u);
  EXPECT_EQ(trace->lanes[1].ops.size(), 5u);
  EXPECT_EQ(trace->lanes[0].ops[42].op_index, 42u);
  EXPECT_EQ(trace->lanes[0].ops[42].step, 4u);
  // The event equals the one the aligner builds from the full record.
  auto detail = StoreDetails(store_.get(), 1).Find(0, 0, 42);
  ASSERT_TRUE(detail.has_value());
  auto event = aligner::MakeOpEvent(*detail, SiteBoundaries(store_.get(), 1).Of(detail->site));
  EXPECT_EQ(event.key, trace->lanes[0].ops[42].key);
  EXPECT_EQ(event.outputs, trace->lanes[0].ops[42].outputs);
  EXPECT_EQ(event.inputs, trace->lanes[0].ops[42].inputs);
  ASSERT_EQ(detail->inputs.size(), 2u);
  EXPECT_EQ(detail->inputs[1].scalar_bits, 1077936128u);
  ASSERT_EQ(trace->gaps.size(), 1u);  // the collective gap is not an op gap
  EXPECT_EQ(trace->gaps[0].first_op, 40u);
  EXPECT_EQ(trace->gaps[0].last_op, 44u);
  EXPECT_EQ(trace->collectives.size(), 10u);  // both phases
  EXPECT_FALSE(StoreDetails(store_.get(), 1).Find(0, 0, 100).has_value());

  auto gaps = LoadCollectiveGaps(*store_, 1, {0, 1});
  ASSERT_TRUE(gaps.ok());
  ASSERT_EQ(gaps->size(), 1u);
  EXPECT_EQ((*gaps)[0].first_seq, 7u);
  EXPECT_EQ((*gaps)[0].last_seq, 9u);
  auto comms = LoadCommunicators(*store_, 1);
  ASSERT_TRUE(comms.ok());
  ASSERT_EQ(comms->size(), 1u);
  EXPECT_EQ((*comms)[0].name, "world");
  auto all = LoadCollectives(*store_, 1);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->at(1).size(), 1u);

  StoreStrings strings(store_.get(), 1);
  EXPECT_EQ(strings.String(kAdd).value_or(""), "aten::add");
  EXPECT_FALSE(strings.String(0x9999).has_value());
  auto site = strings.SiteOf(kSite);
  ASSERT_TRUE(site.has_value());
  EXPECT_EQ(site->line, 214u);
  EXPECT_EQ(site->file, kFile);
}

TEST_F(TraceSourceTest, DiffOverTheStoreFindsThePivotAndItsDetailAndRoundTripsTheWire) {
  WriteRun(1, 1000, false);
  WriteRun(2, 57, false);
  auto ref = LoadRankTrace(*store_, 1, 0, false);
  auto sus = LoadRankTrace(*store_, 2, 0, true);
  ASSERT_TRUE(ref.ok() && sus.ok());
  StoreDetails rd(store_.get(), 1), sd(store_.get(), 2);
  StoreStrings rs(store_.get(), 1), ss(store_.get(), 2);
  aligner::DiffContext ctx{&rd, &sd, &rs, &ss, {}};
  auto diff = aligner::DiffRank(*ref, *sus, ctx);
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  ASSERT_EQ(diff->status, aligner::DiffStatus::kDiverged);
  const auto& fd = *diff->first_divergence;
  EXPECT_EQ(fd.suspect.op_index, 57u);
  EXPECT_EQ(fd.op, "aten::add");
  EXPECT_EQ(fd.suspect.site.file, "train.py");
  EXPECT_EQ(fd.suspect.site.line, 214u);
  EXPECT_TRUE(fd.suspect.detail_available);
  EXPECT_FALSE(fd.inputs_equal);  // the input tensor is the output fingerprint here

  flatbuffers::FlatBufferBuilder b;
  b.Finish(RankDiffToWire(b, *diff));
  flatbuffers::Verifier v(b.GetBufferPointer(), b.GetSize());
  ASSERT_TRUE(v.VerifyBuffer<wire::RankDiff>(nullptr));
  auto back = RankDiffFromWire(*flatbuffers::GetRoot<wire::RankDiff>(b.GetBufferPointer()));
  EXPECT_EQ(aligner::ToJson(back).dump(), aligner::ToJson(*diff).dump());
}

TEST_F(TraceSourceTest, AGapBeforeThePivotMakesTheRankIncomplete) {
  WriteRun(1, 1000, false);
  WriteRun(2, 57, true);  // ops 40..44 of the suspect were dropped
  auto ref = LoadRankTrace(*store_, 1, 0, false);
  auto sus = LoadRankTrace(*store_, 2, 0, false);
  ASSERT_TRUE(ref.ok() && sus.ok());
  auto diff = aligner::DiffRank(*ref, *sus, {});
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(diff->status, aligner::DiffStatus::kIncomplete);
  ASSERT_EQ(diff->missing.size(), 1u);
  EXPECT_EQ(diff->missing[0].first_op, 40u);
}

// The chunked layout (record_copy.h): several records of one lane in one
// value keyed by the last op. Reads must not see a difference.
std::string Chunk(uint32_t lane, uint64_t first, uint64_t last, uint64_t diverge_at = 1000) {
  OpChunkWriter w;
  for (uint64_t i = first; i <= last; ++i) {
    const std::string r =
        Op(lane, i, i % 2 ? kAdd : kMul, 100 + i + (i >= diverge_at ? 1000000 : 0), 1077936128);
    w.Add(i, reinterpret_cast<const uint8_t*>(r.data()), r.size());
  }
  return std::string(w.Finish());
}

TEST_F(TraceSourceTest, ChunkedOpsReadLikeSingleRecords) {
  WriteRun(1, 1000, false);  // one record per key
  {
    // Run 2: the same lane-0 ops in chunks of 32 (the last one short).
    StoreBatch wb(store_.get());
    for (uint64_t first = 0; first < 100; first += 32) {
      const uint64_t last = std::min<uint64_t>(first + 31, 99);
      wb.PutOpChunk(2, 0, 0, last, Chunk(0, first, last));
    }
    wb.PutOpChunk(2, 1, 0, 9, Chunk(0, 0, 9));  // another rank
    WriteDefs(wb, 2);  // the same sites: structural keys then match run 1's
    ASSERT_TRUE(store_->Write(&wb, true).ok());
  }
  auto single = LoadRankTrace(*store_, 1, 0, false);
  auto chunked = LoadRankTrace(*store_, 2, 0, false);
  ASSERT_TRUE(single.ok() && chunked.ok());
  ASSERT_EQ(chunked->lanes.size(), 1u);
  ASSERT_EQ(chunked->lanes[0].ops.size(), 100u);
  EXPECT_TRUE(chunked->gaps.empty());
  StoreDetails one(store_.get(), 1), many(store_.get(), 2);
  for (uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(chunked->lanes[0].ops[i].op_index, i);
    EXPECT_EQ(chunked->lanes[0].ops[i].key, single->lanes[0].ops[i].key);
    EXPECT_EQ(chunked->lanes[0].ops[i].outputs, single->lanes[0].ops[i].outputs);
  }
  // Point lookups: first, middle and last op of a chunk, in any order.
  for (uint64_t i : {40u, 0u, 31u, 32u, 63u, 50u, 99u, 96u, 5u}) {
    auto a = one.Find(0, 0, i), b = many.Find(0, 0, i);
    ASSERT_TRUE(a.has_value() && b.has_value()) << i;
    EXPECT_EQ(aligner::MakeOpEvent(*a).key, aligner::MakeOpEvent(*b).key) << i;
    EXPECT_EQ(b->op_index, i);
    EXPECT_EQ(b->outputs[0].fingerprint, a->outputs[0].fingerprint) << i;
  }
  EXPECT_FALSE(many.Find(0, 0, 100).has_value());
  EXPECT_FALSE(many.Find(0, 1, 3).has_value());
  EXPECT_TRUE(many.Find(1, 0, 9).has_value());
  EXPECT_FALSE(many.Find(1, 0, 10).has_value());

  // ReadTrace's path: a page from the middle of a chunk, across chunks.
  std::vector<uint64_t> seen;
  bool more = false;
  ASSERT_TRUE(store_
                  ->ScanOps(
                      2, 0, 0, 45, 30,
                      [&](uint64_t op, const rocksdb::Slice& v) {
                        auto rec = wire::OpenStored<wire::OpRecord>(v.data(), v.size());
                        ASSERT_TRUE(rec.ok());
                        EXPECT_EQ((*rec)->op_index(), op);
                        seen.push_back(op);
                      },
                      &more)
                  .ok());
  ASSERT_EQ(seen.size(), 30u);
  EXPECT_EQ(seen.front(), 45u);
  EXPECT_EQ(seen.back(), 74u);
  EXPECT_TRUE(more);
  seen.clear();
  ASSERT_TRUE(store_
                  ->ScanOps(
                      2, 0, 0, 75, 100,
                      [&](uint64_t op, const rocksdb::Slice&) { seen.push_back(op); }, &more)
                  .ok());
  ASSERT_EQ(seen.size(), 25u);
  EXPECT_EQ(seen.back(), 99u);
  EXPECT_FALSE(more);
  // Exactly at the end of a page that ends at a chunk's end.
  seen.clear();
  ASSERT_TRUE(store_
                  ->ScanOps(
                      2, 0, 0, 96, 4,
                      [&](uint64_t op, const rocksdb::Slice&) { seen.push_back(op); }, &more)
                  .ok());
  EXPECT_EQ(seen.size(), 4u);
  EXPECT_FALSE(more);
}

TEST_F(TraceSourceTest, AResentChunkOverwritesAndADeletedRunIsGone) {
  auto write = [&](uint64_t diverge_at) {
    StoreBatch wb(store_.get());
    wb.PutOpChunk(3, 0, 0, 63, Chunk(0, 0, 63, diverge_at));
    wb.PutOpChunk(3, 0, 0, 127, Chunk(0, 64, 127, diverge_at));
    ASSERT_TRUE(store_->Write(&wb, true).ok());
  };
  write(1000);
  write(1000);  // a resent batch: the same keys, nothing doubles
  ASSERT_TRUE(store_->Flush().ok());
  write(70);  // and a rewrite replaces the whole chunk
  auto trace = LoadRankTrace(*store_, 3, 0, false);
  ASSERT_TRUE(trace.ok());
  ASSERT_EQ(trace->lanes.size(), 1u);
  ASSERT_EQ(trace->lanes[0].ops.size(), 128u);
  auto d = StoreDetails(store_.get(), 3).Find(0, 0, 80);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->outputs[0].fingerprint.lo, 100u + 80u + 1000000u);

  RunState run;
  run.id = 3;
  run.name = "three";
  StoreBatch wb(store_.get());
  wb.DeleteRun(run);
  ASSERT_TRUE(store_->Write(&wb, true).ok());
  store_->CompactRun(3);
  trace = LoadRankTrace(*store_, 3, 0, false);
  ASSERT_TRUE(trace.ok());
  EXPECT_TRUE(trace->lanes.empty());
  EXPECT_FALSE(StoreDetails(store_.get(), 3).Find(0, 0, 80).has_value());
  bool more = true;
  int n = 0;
  ASSERT_TRUE(store_
                  ->ScanOps(
                      3, 0, 0, 0, 1000, [&](uint64_t, const rocksdb::Slice&) { ++n; }, &more)
                  .ok());
  EXPECT_EQ(n, 0);
  EXPECT_FALSE(more);
}

// Boundary ids come from the line's text: a line that moved (code inserted
// above it) in a file run from another directory keeps its id; a changed line
// does not; without the source file the line number stands in.
TEST_F(TraceSourceTest, SiteBoundariesFollowTheSourceLineNotItsNumber) {
  struct SiteSpec {
    uint64_t run, site, file;
    std::string path;
    uint32_t line;
    std::string source;  // empty: not sent
  };
  const uint64_t kFn = 0x77;
  auto define = [&](const SiteSpec& s) {
    StoreBatch wb(store_.get());
    wb.PutString(s.run, s.file, s.path);
    wb.PutString(s.run, kFn, "forward");
    wb.PutSite(s.run, s.site, SiteDef{s.file, s.line, kFn});
    if (!s.source.empty()) wb.PutSource(s.run, s.file, s.source);
    ASSERT_TRUE(store_->Write(&wb, true).ok());
  };
  const std::string v1 = "import torch\n\ndef forward(x):\n    y = torch.relu(x)\n    return y\n";
  const std::string v2 = "import torch\nimport logging\n\n\ndef forward(x):\n    y = torch.relu(x)\n    return y\n";
  const std::string v3 = "import torch\n\ndef forward(x):\n    y = torch.sigmoid(x)\n    return y\n";
  define({10, 1, 0xA1, "/home/a/repo/model.py", 4, v1});
  define({11, 2, 0xB1, "/home/b/repo/model.py", 6, v2});
  define({12, 3, 0xC1, "/home/a/repo/model.py", 4, v3});
  define({13, 4, 0xD1, "/home/a/repo/model.py", 4, ""});
  define({14, 5, 0xE1, "/home/b/model.py", 4, ""});
  define({15, 6, 0xF1, "/home/b/model.py", 5, ""});
  auto of = [&](uint64_t run, uint64_t site) { return SiteBoundaries(store_.get(), run).Of(site); };
  EXPECT_NE(of(10, 1), 0u);
  EXPECT_EQ(of(10, 1), of(11, 2));  // moved by two lines, other checkout
  EXPECT_NE(of(10, 1), of(12, 3));  // changed line
  EXPECT_EQ(of(13, 4), of(14, 5));  // no source: base name, function, line number
  EXPECT_NE(of(13, 4), of(15, 6));
  EXPECT_EQ(of(10, 99), 0u);        // undefined site: the key keeps the site id
}

TEST(ReportWire, CollectiveSummaryRoundTrips) {
  aligner::CollectiveEvent e;
  e.communicator = 5;
  e.seq = 9;
  e.phase = aligner::CollectivePhase::kEntered;
  e.kind = aligner::CollectiveKind::kBroadcast;
  e.dtype = aligner::DType::kBFloat16;
  e.count = 77;
  e.root = 3;
  e.outputs = {{1, 2}, {3, 4}};
  e.lane = 1;
  e.op_index = 123;
  e.step = 4;
  e.site = 99;
  e.time_ns = 555;
  flatbuffers::FlatBufferBuilder b;
  b.Finish(CollectiveToWire(b, e));
  auto back =
      CollectiveFromWire(*flatbuffers::GetRoot<wire::CollectiveRecord>(b.GetBufferPointer()));
  EXPECT_EQ(back.communicator, 5u);
  EXPECT_EQ(back.seq, 9u);
  EXPECT_EQ(back.phase, aligner::CollectivePhase::kEntered);
  EXPECT_EQ(back.kind, aligner::CollectiveKind::kBroadcast);
  EXPECT_EQ(back.dtype, aligner::DType::kBFloat16);
  EXPECT_EQ(back.count, 77u);
  EXPECT_EQ(back.root, 3);
  ASSERT_EQ(back.outputs.size(), 2u);
  EXPECT_EQ(back.outputs[1], (aligner::Fp128{3, 4}));
  EXPECT_EQ(back.op_index, 123u);
  EXPECT_EQ(back.time_ns, 555u);
}

TEST_F(TraceSourceTest, ACancelledScanStopsWithTheTokensReason) {
  WriteRun(1, 1000, false);
  CancelToken gone;
  gone.Cancel(CancelToken::Reason::kClientGone);
  auto trace = StoreDetails(store_.get(), 1).LoadRank(0, &gone);
  ASSERT_FALSE(trace.ok());
  EXPECT_EQ(trace.status().message(), "query cancelled: its client went away");
  CancelToken budget(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(StoreDetails(store_.get(), 1).LoadRank(0, &budget).status().message(),
            "query exceeded its time budget of 1 ms");
  CancelToken open(std::chrono::hours(1));
  EXPECT_TRUE(StoreDetails(store_.get(), 1).LoadRank(0, &open).ok());
}

RunState RankState0(uint64_t id, uint64_t batches) {
  RunState run;
  run.id = id;
  run.ranks[0].batches = batches;
  run.ranks[0].ops = 5000;  // more than stored: lanes are sized for it, then trimmed
  return run;
}

// The reader serves a rank from the cache while its batch count stays, and
// reads it again (new records included) once the rank received a batch.
TEST_F(TraceSourceTest, RunReaderServesCachedTracesUntilTheRankChanges) {
  WriteRun(1, 1000, true);
  TraceCache cache(64 << 20);
  auto first = RunReader(store_.get(), RankState0(1, 3), &cache).Rank(0, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ((*first)->lanes[0].ops.size(), 100u);
  EXPECT_EQ((*first)->collectives.size(), 10u);  // attached for every run
  EXPECT_EQ((*first)->gaps.size(), 1u);
  EXPECT_EQ(cache.bytes(), TraceCache::BytesOf(**first));
  // The lanes sized for 5000 ops were trimmed to the 105 read.
  EXPECT_LE(cache.bytes(), 105 * sizeof(aligner::OpEvent) + 4096);

  StoreBatch more(store_.get());
  more.PutOpChunk(1, 0, 0, 100, Op(0, 100, kAdd, 7));
  ASSERT_TRUE(store_->Write(&more, true).ok());
  auto again = RunReader(store_.get(), RankState0(1, 3), &cache).Rank(0, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), first->get()) << "same batch count: the cached trace";
  auto changed = RunReader(store_.get(), RankState0(1, 4), &cache).Rank(0, nullptr);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ((*changed)->lanes[0].ops.size(), 101u) << "a new batch: read again";

  cache.Forget(1);
  EXPECT_EQ(cache.bytes(), 0u);
  auto uncached = RunReader(store_.get(), RankState0(1, 4), nullptr).Rank(0, nullptr);
  ASSERT_TRUE(uncached.ok());
  EXPECT_EQ((*uncached)->lanes[0].ops.size(), 101u);
}

TEST(TraceCache, KeepsTheMostRecentlyUsedWithinItsBudget) {
  auto trace = [](size_t ops) {
    aligner::RankTrace t;
    t.lanes.push_back({0, std::vector<aligner::OpEvent>(ops)});
    return std::make_shared<const aligner::RankTrace>(std::move(t));
  };
  const uint64_t one = TraceCache::BytesOf(*trace(1000));
  TraceCache cache(2 * one + one / 2);  // room for two
  cache.Put(1, 0, 1, trace(1000));
  cache.Put(1, 1, 1, trace(1000));
  EXPECT_NE(cache.Find(1, 0, 1), nullptr);  // rank 0 is now the most recent
  cache.Put(2, 0, 1, trace(1000));          // evicts rank 1
  EXPECT_EQ(cache.Find(1, 1, 1), nullptr);
  EXPECT_NE(cache.Find(1, 0, 1), nullptr);
  EXPECT_NE(cache.Find(2, 0, 1), nullptr);
  EXPECT_EQ(cache.bytes(), 2 * one);
  EXPECT_EQ(cache.Find(2, 0, 2), nullptr);  // another stamp: stale, dropped
  EXPECT_EQ(cache.bytes(), one);
  cache.Put(3, 0, 1, trace(10000));  // larger than the whole budget: not kept
  EXPECT_EQ(cache.Find(3, 0, 1), nullptr);
  EXPECT_EQ(cache.bytes(), one);
  TraceCache off(0);
  off.Put(1, 0, 1, trace(1));
  EXPECT_EQ(off.Find(1, 0, 1), nullptr);
}

}  // namespace
}  // namespace opguard::daemon
