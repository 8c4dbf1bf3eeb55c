#include "opguard/idl/envelope.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace opguard::wire {
namespace {

std::vector<uint8_t> MakeBatch(uint16_t major = kSchemaMajor) {
  flatbuffers::FlatBufferBuilder b;
  auto run = b.CreateString("run-a");
  std::vector<flatbuffers::Offset<OpRecord>> ops;
  for (uint64_t i = 0; i < 3; ++i) {
    OpRecordBuilder op(b);
    op.add_op_index(i);
    op.add_name(42);
    ops.push_back(op.Finish());
  }
  auto batch = CreateBatch(b, run, /*rank=*/3, /*session=*/7, /*seq=*/0, 0, 0, 0, 0,
                           b.CreateVector(ops));
  Version version(major, 0);
  b.Finish(CreateEnvelope(b, &version, Message::Batch, batch.Union()), EnvelopeIdentifier());
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

TEST(Envelope, RoundTripsABatch) {
  auto bytes = MakeBatch();
  auto envelope = OpenEnvelope(bytes.data(), bytes.size());
  ASSERT_TRUE(envelope.ok()) << envelope.status().ToString();
  const Batch* batch = (*envelope)->message_as_Batch();
  ASSERT_NE(batch, nullptr);
  EXPECT_EQ(batch->run()->str(), "run-a");
  EXPECT_EQ(batch->rank(), 3u);
  ASSERT_EQ(batch->ops()->size(), 3u);
  EXPECT_EQ(batch->ops()->Get(2)->op_index(), 2u);
}

TEST(Envelope, FinishEnvelopeStampsVersion) {
  flatbuffers::FlatBufferBuilder b;
  FinishEnvelope(b, CreateStatusRequest(b));
  auto envelope = OpenEnvelope(b.GetBufferPointer(), b.GetSize());
  ASSERT_TRUE(envelope.ok());
  EXPECT_EQ((*envelope)->version()->major(), kSchemaMajor);
  EXPECT_EQ((*envelope)->message_type(), Message::StatusRequest);
}

TEST(Envelope, RefusesOtherMajorWithClearMessage) {
  auto bytes = MakeBatch(kSchemaMajor + 1);
  auto envelope = OpenEnvelope(bytes.data(), bytes.size());
  ASSERT_FALSE(envelope.ok());
  EXPECT_NE(envelope.status().message().find("schema major 2 not supported"), std::string::npos)
      << envelope.status().message();
}

TEST(Envelope, RefusesATypeWithoutItsMessage) {
  // The Verifier accepts a union type whose table is absent; readers would
  // dereference message_as_<type>().
  flatbuffers::FlatBufferBuilder b;
  Version version(kSchemaMajor, kSchemaMinor);
  b.Finish(CreateEnvelope(b, &version, Message::Ack, 0), EnvelopeIdentifier());
  auto envelope = OpenEnvelope(b.GetBufferPointer(), b.GetSize());
  ASSERT_FALSE(envelope.ok());
  EXPECT_NE(envelope.status().message().find("body missing"), std::string::npos)
      << envelope.status().message();
}

TEST(Envelope, OpensBytesAtAnyAddress) {
  auto bytes = MakeBatch();
  // A received frame may start at any offset of the receiver's buffer.
  for (size_t offset = 0; offset < kBufferAlignment; ++offset) {
    std::vector<uint64_t> backing(bytes.size() / 8 + 2);
    auto* at = reinterpret_cast<uint8_t*>(backing.data()) + offset;
    std::memcpy(at, bytes.data(), bytes.size());
    AlignedStorage storage;
    auto envelope = OpenEnvelope(at, bytes.size(), storage);
    ASSERT_TRUE(envelope.ok()) << "offset " << offset << ": " << envelope.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*envelope) % alignof(uint32_t), 0u);
    const Batch* batch = (*envelope)->message_as_Batch();
    ASSERT_NE(batch, nullptr);
    EXPECT_EQ(batch->run()->str(), "run-a");
    EXPECT_EQ(batch->session(), 7u);
    ASSERT_EQ(batch->ops()->size(), 3u);
    EXPECT_EQ(batch->ops()->Get(2)->op_index(), 2u);
    EXPECT_FALSE(OpenEnvelope(at, bytes.size(), storage, bytes.size() - 1).ok());
  }
}

TEST(Envelope, RejectsOversizedGarbageAndTruncated) {
  auto bytes = MakeBatch();
  EXPECT_FALSE(OpenEnvelope(bytes.data(), bytes.size(), bytes.size() - 1).ok());
  std::vector<uint8_t> garbage(bytes.size());
  std::mt19937 rng(1);
  for (auto& byte : garbage) byte = static_cast<uint8_t>(rng());
  EXPECT_FALSE(OpenEnvelope(garbage.data(), garbage.size()).ok());
  // A truncation is rejected unless it only cut trailing alignment padding,
  // in which case the content must read back unchanged.
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    auto envelope = OpenEnvelope(cut.data(), cut.size());
    if (!envelope.ok()) continue;
    EXPECT_GE(n, bytes.size() - 7) << "truncated to " << n;
    const Batch* batch = (*envelope)->message_as_Batch();
    ASSERT_NE(batch, nullptr);
    EXPECT_EQ(batch->run()->str(), "run-a");
    EXPECT_EQ(batch->ops()->size(), 3u);
  }
  // Random corruption of a valid message: either rejected or still safe to read.
  for (int trial = 0; trial < 2000; ++trial) {
    auto copy = bytes;
    copy[rng() % copy.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    auto envelope = OpenEnvelope(copy.data(), copy.size());
    if (envelope.ok() && (*envelope)->message_type() == Message::Batch) {
      const Batch* batch = (*envelope)->message_as_Batch();
      if (batch->ops()) {
        for (const auto* op : *batch->ops()) (void)op->op_index();
      }
    }
  }
}

}  // namespace
}  // namespace opguard::wire
