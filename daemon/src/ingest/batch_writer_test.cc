#include "ingest/batch_writer.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <cstdint>
#include <cstring>

#include "opguard/daemon/testing/batch_maker.h"
#include "query/trace_source.h"
#include "storage/keys.h"
#include "storage/temp_store.h"

namespace opguard::daemon {
namespace {

// A shim that reports 2^64-1 dropped records twice must not wrap the counts
// back to a small number: they saturate.
TEST(BatchWriter, GapCountsSaturateInsteadOfWrapping) {
  testing::TempDir dir;
  auto store = OpenTempStore(dir);
  ASSERT_NE(store, nullptr);
  testing::BatchOptions options;
  options.gaps = {{1, UINT64_MAX}, {1, UINT64_MAX}};  // records_dropped = 2^64-1 each
  const std::string bytes = testing::MakeBatch("r", 0, 1, 0, 0, 4, options);
  const auto* batch = wire::GetEnvelope(bytes.data())->message_as_Batch();
  ASSERT_NE(batch, nullptr);
  StoreBatch out(store.get());
  BatchWriter writer(ChunkCodecByName(Config().compression));
  RecordCounts n =
      writer.Write(*batch, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 1, 0, &out);
  EXPECT_EQ(n.gap_notices, 2u);
  EXPECT_EQ(n.op_gap_records, UINT64_MAX);
  n += n;
  EXPECT_EQ(n.op_gap_records, UINT64_MAX);
  EXPECT_EQ(n.gap_notices, 4u);
}

// Every (key, value) of `run` in column family `cf`.
std::vector<std::pair<std::string, std::string>> Values(const Store& store, Cf cf, uint64_t run) {
  const std::string upper = keys::RunBegin(run + 1);
  rocksdb::Slice upper_slice(upper);
  auto it = store.NewScan(cf, &upper_slice, /*fill_cache=*/false);
  std::vector<std::pair<std::string, std::string>> out;
  for (it->Seek(keys::RunBegin(run)); it->Valid(); it->Next()) {
    out.emplace_back(it->key().ToString(), it->value().ToString());
  }
  return out;
}

void ExpectSameEvents(const aligner::RankTrace& a, const aligner::RankTrace& b) {
  ASSERT_EQ(a.lanes.size(), b.lanes.size());
  for (size_t l = 0; l < a.lanes.size(); ++l) {
    ASSERT_EQ(a.lanes[l].ops.size(), b.lanes[l].ops.size());
    for (size_t i = 0; i < a.lanes[l].ops.size(); ++i) {
      const aligner::OpEvent &x = a.lanes[l].ops[i], &y = b.lanes[l].ops[i];
      ASSERT_EQ(x.op_index, y.op_index);
      EXPECT_EQ(x.step, y.step);
      EXPECT_EQ(x.name, y.name);
      EXPECT_EQ(x.site, y.site);
      EXPECT_EQ(x.key, y.key) << x.op_index;
      EXPECT_EQ(x.loose_key, y.loose_key);
      EXPECT_EQ(x.outputs, y.outputs);
      EXPECT_EQ(x.inputs, y.inputs);
      EXPECT_EQ(x.flags, y.flags);
    }
  }
  EXPECT_EQ(a.gaps.size(), b.gaps.size());
}

class StoredCores : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = OpenTempStore(dir_);
    ASSERT_NE(store_, nullptr);
    testing::BatchOptions options;
    options.definitions = true;
    options.steps_every = 50;
    options.sources = {{"/src/train.py", "import torch\nx = y + 1\n"}};
    for (uint64_t seq = 0; seq < 4; ++seq) {
      batches_.push_back(testing::MakeBatch("r", 0, 1, seq, seq * 400, 400, options));
    }
  }
  // Batches [from, to) of rank 0 into `run`, as ingest writes them.
  void Write(uint64_t run, ChunkCodec codec, bool cores, size_t from = 0, size_t to = 3) {
    BatchWriter writer(codec, cores);
    StoreBatch out(store_.get());
    for (size_t i = from; i < to; ++i) {
      const auto* batch = wire::GetEnvelope(batches_[i].data())->message_as_Batch();
      ASSERT_NE(batch, nullptr);
      writer.Write(*batch, reinterpret_cast<const uint8_t*>(batches_[i].data()), batches_[i].size(), run,
                   /*rank_ops=*/i * 400, &out);
    }
    ASSERT_TRUE(store_->Write(&out, true).ok());
  }
  void Put(uint64_t run, const std::string& key, const std::string& value) {
    StoreBatch out(store_.get());
    out.PutOpChunk(run, 0, keys::OpKeyLane(key), keys::OpKeyIndex(key), value);
    ASSERT_TRUE(store_->Write(&out, true).ok());
  }
  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  std::vector<std::string> batches_;
};

// Ingest stores each chunk's event cores under the chunk's key in the cores
// column family; a trace read from them is the trace read by decoding every
// record, bit for bit, with every codec, and so is one read from the
// layout before (cores in front of each chunk's records, which stores still
// hold).
TEST_F(StoredCores, GiveTheTraceTheRecordsGiveInEveryLayout) {
  // Runs 1..3: as ingest writes them, LZ4, ZSTD, none. Run 4: LZ4 chunks
  // without cores (storage.op_cores = false).
  const ChunkCodec codecs[] = {ChunkCodec::kLz4, ChunkCodec::kZstd, ChunkCodec::kNone, ChunkCodec::kLz4};
  for (uint64_t run = 1; run <= 4; ++run) Write(run, codecs[run - 1], /*cores=*/run != 4);
  // Run 5: run 1 in the layout before the cores column family, each value
  // the cores followed by the chunk, and no marker.
  Write(5, ChunkCodec::kLz4, true);
  {
    StoreBatch out(store_.get());
    out.DeleteCoresComplete(5, 0);
    ASSERT_TRUE(store_->Write(&out, true).ok());
  }
  const auto chunks = Values(*store_, Cf::kOps, 1), cores = Values(*store_, Cf::kCores, 1);
  ASSERT_EQ(cores.size(), chunks.size() + 1);
  EXPECT_EQ(cores[0].first, keys::CoresCompleteKey(1, 0));  // the marker, in front
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSERT_EQ(cores[i + 1].first, chunks[i].first);
    Put(5, chunks[i].first, cores[i + 1].second + chunks[i].second);
  }
  EXPECT_GT(chunks.size(), 3u);  // several chunks per batch
  for (uint64_t run = 1; run <= 5; ++run) {
    for (const auto& [key, value] : Values(*store_, Cf::kOps, run)) {
      OpChunkView view;
      EXPECT_EQ(view.OpenCores(keys::OpKeyIndex(key), value),
                run == 5 ? OpChunkView::Cores::kRead : OpChunkView::Cores::kAbsent);
      EXPECT_TRUE(view.Open(keys::OpKeyIndex(key), value));
    }
  }
  EXPECT_TRUE(Values(*store_, Cf::kCores, 4).empty());

  auto records = LoadRankTrace(*store_, 4, 0, false);
  ASSERT_TRUE(records.ok()) << records.status().message();
  ASSERT_EQ(records->lanes.size(), 1u);
  ASSERT_EQ(records->lanes[0].ops.size(), 1200u);
  for (uint64_t run : {1, 2, 3, 5}) {
    auto from_cores = LoadRankTrace(*store_, run, 0, false);
    ASSERT_TRUE(from_cores.ok()) << from_cores.status().message();
    ExpectSameEvents(*from_cores, *records);
  }

  // Damaged cores in front of intact records (the layout before): the
  // records answer.
  {
    std::string value = Values(*store_, Cf::kOps, 5)[1].second;
    value[20] = static_cast<char>(value[20] + 1);  // the cores' count
    Put(5, chunks[1].first, value);
    OpChunkView view;
    EXPECT_EQ(view.OpenCores(keys::OpKeyIndex(chunks[1].first), value), OpChunkView::Cores::kDamaged);
  }
  auto mended = LoadRankTrace(*store_, 5, 0, false);
  ASSERT_TRUE(mended.ok()) << mended.status().message();
  ExpectSameEvents(*mended, *records);

  // A store from before the cores column family opens (which adds it) and
  // reads its chunks as before.
  store_.reset();
  {
    const std::string path = dir_.path() + "/data";
    std::vector<std::string> names;
    ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path, &names).ok());
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
    for (const auto& name : names) descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions());
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), path, descriptors, &handles, &raw).ok());
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == keys::kCores) {
        EXPECT_TRUE(raw->DropColumnFamily(handles[i]).ok());
      }
    }
    for (auto* h : handles) EXPECT_TRUE(raw->DestroyColumnFamilyHandle(h).ok());
    delete raw;
  }
  store_ = OpenTempStore(dir_);
  ASSERT_NE(store_, nullptr);
  EXPECT_TRUE(Values(*store_, Cf::kCores, 1).empty());
  for (uint64_t run : {1, 5}) {
    auto old = LoadRankTrace(*store_, run, 0, false);
    ASSERT_TRUE(old.ok()) << old.status().message();
    ExpectSameEvents(*old, *records);
  }
}

// A rank's cores answer alone while its marker says they are complete: a
// damaged chunk does not touch the trace. A damaged cores value, and any
// batch stored without cores (storage.op_cores turned off, which removes the
// marker), send the scan back to the chunks.
TEST_F(StoredCores, AnswerWhileCompleteAndTheChunksAnswerOtherwise) {
  Write(1, ChunkCodec::kLz4, true);
  Write(2, ChunkCodec::kLz4, true);
  Write(3, ChunkCodec::kLz4, false, 0, 4);  // the whole trace, from records
  auto records = LoadRankTrace(*store_, 3, 0, false);
  ASSERT_TRUE(records.ok()) << records.status().message();
  ASSERT_EQ(records->lanes[0].ops.size(), 1600u);

  const auto chunks = Values(*store_, Cf::kOps, 1);
  Put(1, chunks[2].first, "damaged");  // neither a chunk nor a record
  auto trace = LoadRankTrace(*store_, 1, 0, false);
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  EXPECT_TRUE(trace->gaps.empty());
  EXPECT_EQ(trace->lanes[0].ops.size(), 1200u);

  Write(1, ChunkCodec::kLz4, false, 3, 4);  // the fourth batch without cores
  EXPECT_NE(Values(*store_, Cf::kCores, 1)[0].first, keys::CoresCompleteKey(1, 0));
  trace = LoadRankTrace(*store_, 1, 0, false);
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  ASSERT_EQ(trace->gaps.size(), 1u);  // the chunks answer, with the damaged one's hole
  EXPECT_EQ(trace->gaps[0].last_op, keys::OpKeyIndex(chunks[2].first));
  EXPECT_EQ(trace->lanes[0].ops.size() + keys::OpKeyIndex(chunks[2].first) -
                keys::OpKeyIndex(chunks[1].first),
            1600u);

  // Run 2's cores, one damaged: the (intact) chunks give the whole trace.
  auto cores = Values(*store_, Cf::kCores, 2);
  {
    StoreBatch out(store_.get());
    std::string value = cores[2].second;
    value[20] = static_cast<char>(value[20] + 1);  // the cores' count
    out.PutOpCores(2, 0, keys::OpKeyLane(cores[2].first), keys::OpKeyIndex(cores[2].first), value);
    ASSERT_TRUE(store_->Write(&out, true).ok());
  }
  Write(2, ChunkCodec::kLz4, true, 3, 4);  // later batches with cores keep it marked
  EXPECT_EQ(Values(*store_, Cf::kCores, 2)[0].first, keys::CoresCompleteKey(2, 0));
  trace = LoadRankTrace(*store_, 2, 0, false);
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  ExpectSameEvents(*trace, *records);
}

}  // namespace
}  // namespace opguard::daemon
