#include "ingest/batch_writer.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "opguard/daemon/testing/batch_maker.h"
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

}  // namespace
}  // namespace opguard::daemon
