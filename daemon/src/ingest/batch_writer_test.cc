#include "ingest/batch_writer.h"

#include <gtest/gtest.h>

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
      writer.Write(*batch, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 1, &out);
  EXPECT_EQ(n.gap_notices, 2u);
  EXPECT_EQ(n.op_gap_records, UINT64_MAX);
  n += n;
  EXPECT_EQ(n.op_gap_records, UINT64_MAX);
  EXPECT_EQ(n.gap_notices, 4u);
}

// What a trace scan reads of every stored chunk of `run`: (key, value).
std::vector<std::pair<std::string, std::string>> OpValues(const Store& store, uint64_t run) {
  const std::string upper = keys::RunBegin(run + 1);
  rocksdb::Slice upper_slice(upper);
  auto it = store.NewScan(Cf::kOps, &upper_slice, /*fill_cache=*/false);
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

// Ingest stores each record's event core with its chunk; a trace read from
// the cores is the trace read by decoding every record (the layout before
// cores, which stores still hold), bit for bit, with every codec. A chunk
// whose cores are damaged is read from its records instead.
TEST(BatchWriter, StoredCoresGiveTheTraceTheRecordsGive) {
  testing::TempDir dir;
  auto store = OpenTempStore(dir);
  ASSERT_NE(store, nullptr);
  testing::BatchOptions options;
  options.definitions = true;
  options.steps_every = 50;
  options.sources = {{"/src/train.py", "import torch\nx = y + 1\n"}};
  std::vector<std::string> batches;
  for (uint64_t seq = 0; seq < 3; ++seq) {
    batches.push_back(testing::MakeBatch("r", 0, 1, seq, seq * 400, 400, options));
  }
  // Runs 1..3: as ingest writes them, LZ4, ZSTD, none. Run 4: LZ4 chunks
  // without cores (storage.op_cores = false, and the layout before cores).
  const ChunkCodec codecs[] = {ChunkCodec::kLz4, ChunkCodec::kZstd, ChunkCodec::kNone, ChunkCodec::kLz4};
  for (uint64_t run = 1; run <= 4; ++run) {
    BatchWriter writer(codecs[run - 1], /*cores=*/run != 4);
    StoreBatch out(store.get());
    for (const std::string& bytes : batches) {
      const auto* batch = wire::GetEnvelope(bytes.data())->message_as_Batch();
      ASSERT_NE(batch, nullptr);
      writer.Write(*batch, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), run, &out);
    }
    ASSERT_TRUE(store->Write(&out, true).ok());
  }
  size_t chunks = 0;
  for (uint64_t run = 1; run <= 4; ++run) {
    for (const auto& [key, value] : OpValues(*store, run)) {
      OpChunkView view;
      EXPECT_EQ(view.OpenCores(keys::OpKeyIndex(key), value),
                run == 4 ? OpChunkView::Cores::kAbsent : OpChunkView::Cores::kRead);
      if (run == 4) {
        EXPECT_EQ(value.substr(0, 4), "OGZ1");
      }
      chunks += run == 1;
    }
  }
  EXPECT_GT(chunks, 3u);  // several chunks per batch

  auto records = LoadRankTrace(*store, 4, 0, false);
  ASSERT_TRUE(records.ok()) << records.status().message();
  ASSERT_EQ(records->lanes.size(), 1u);
  ASSERT_EQ(records->lanes[0].ops.size(), 1200u);
  for (uint64_t run = 1; run <= 3; ++run) {
    auto cores = LoadRankTrace(*store, run, 0, false);
    ASSERT_TRUE(cores.ok()) << cores.status().message();
    ExpectSameEvents(*cores, *records);
  }

  // Damaged cores in front of intact records: the records answer.
  {
    auto values = OpValues(*store, 1);
    std::string& value = values[1].second;
    value[20] = static_cast<char>(value[20] + 1);  // the cores' count
    StoreBatch out(store.get());
    out.PutOpChunk(1, 0, keys::OpKeyLane(values[1].first), keys::OpKeyIndex(values[1].first), value);
    ASSERT_TRUE(store->Write(&out, true).ok());
    OpChunkView view;
    EXPECT_EQ(view.OpenCores(keys::OpKeyIndex(values[1].first), value), OpChunkView::Cores::kDamaged);
  }
  auto mended = LoadRankTrace(*store, 1, 0, false);
  ASSERT_TRUE(mended.ok()) << mended.status().message();
  ExpectSameEvents(*mended, *records);
}

}  // namespace
}  // namespace opguard::daemon
