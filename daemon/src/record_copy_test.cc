#include "record_copy.h"

#include <gtest/gtest.h>

#include <cstring>

#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

// A copy must be byte-for-byte what a builder writing the same fields in the
// same way would produce; here: copying a copy is a fixed point, and every
// field read back equals the original.
TEST(RecordCopy, OpRecordKeepsEveryField) {
  flatbuffers::FlatBufferBuilder src;
  int64_t shape[3] = {2, 3, 4};
  wire::Fp128 fp(0x1122334455667788ull, 0x99aabbccddeeff00ull);
  auto stats = wire::CreateTensorStats(src, 1, 2, -1.5, 2.5, 3.5, 4.5);
  auto t = wire::CreateTensorSig(src, &fp, wire::DType::Float16, src.CreateVector(shape, 3), stats, 3);
  auto t2 = wire::CreateTensorSig(src, &fp, wire::DType::Int8, 0, 0, -1);
  auto list = src.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{t2});
  std::vector<flatbuffers::Offset<wire::Value>> inputs = {
      wire::CreateValue(src, wire::ValueKind::Tensor, t),
      wire::CreateValue(src, wire::ValueKind::Scalar, 0, 1077936128, wire::DType::Float32),
      wire::CreateValue(src, wire::ValueKind::TensorList, 0, 0, wire::DType::Unknown, list),
      wire::CreateValue(src, wire::ValueKind::None)};
  auto out = wire::CreateTensorSig(src, &fp, wire::DType::BFloat16);
  uint64_t kernels[2] = {5, 6};
  auto op = wire::CreateOpRecord(src, 2, 77, 3, 11, 12, 99, true, src.CreateVector(inputs),
                                 src.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{out}),
                                 src.CreateVector(kernels, 2), 1000, 20, true);
  src.Finish(op);
  const auto* a = flatbuffers::GetRoot<wire::OpRecord>(src.GetBufferPointer());

  flatbuffers::FlatBufferBuilder dst;
  dst.Finish(CopyOpRecord(dst, a));
  auto stored = wire::OpenStored<wire::OpRecord>(dst.GetBufferPointer(), dst.GetSize());
  ASSERT_TRUE(stored.ok());
  const auto* b = *stored;
  EXPECT_EQ(b->lane(), 2u);
  EXPECT_EQ(b->op_index(), 77u);
  EXPECT_EQ(b->step(), 3u);
  EXPECT_EQ(b->name(), 11u);
  EXPECT_EQ(b->site(), 12u);
  EXPECT_EQ(b->seq_nr(), 99);
  EXPECT_TRUE(b->backward());
  EXPECT_TRUE(b->nondeterministic());
  EXPECT_EQ(b->start_ns(), 1000u);
  EXPECT_EQ(b->duration_ns(), 20u);
  ASSERT_EQ(b->kernels()->size(), 2u);
  EXPECT_EQ(b->kernels()->Get(1), 6u);
  ASSERT_EQ(b->inputs()->size(), 4u);
  const auto* in0 = b->inputs()->Get(0)->tensor();
  EXPECT_EQ(in0->fingerprint()->lo(), fp.lo());
  EXPECT_EQ(in0->fingerprint()->hi(), fp.hi());
  EXPECT_EQ(in0->dtype(), wire::DType::Float16);
  EXPECT_EQ(in0->shape()->Get(2), 4);
  EXPECT_EQ(in0->device(), 3);
  EXPECT_EQ(in0->stats()->nan_count(), 1u);
  EXPECT_EQ(in0->stats()->l2(), 4.5);
  EXPECT_EQ(b->inputs()->Get(1)->scalar_bits(), 1077936128u);
  EXPECT_EQ(b->inputs()->Get(1)->scalar_dtype(), wire::DType::Float32);
  EXPECT_EQ(b->inputs()->Get(2)->tensors()->Get(0)->dtype(), wire::DType::Int8);
  EXPECT_EQ(b->inputs()->Get(3)->kind(), wire::ValueKind::None);
  EXPECT_EQ(b->outputs()->Get(0)->dtype(), wire::DType::BFloat16);
  EXPECT_EQ(b->outputs()->Get(0)->device(), -1);

  flatbuffers::FlatBufferBuilder again;
  again.Finish(CopyOpRecord(again, b));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(again.GetBufferPointer()), again.GetSize()),
            std::string(reinterpret_cast<const char*>(dst.GetBufferPointer()), dst.GetSize()));
}

TEST(RecordCopy, CollectiveKeepsEveryField) {
  flatbuffers::FlatBufferBuilder src;
  wire::Fp128 fp(1, 2);
  auto out = src.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{
      wire::CreateTensorSig(src, &fp, wire::DType::Float32)});
  src.Finish(wire::CreateCollectiveRecord(src, 0xC0, 5, wire::CollectivePhase::Entered,
                                          wire::CollectiveKind::Broadcast, wire::DType::Float32, 1024, 3, 255,
                                          out, out, 1, 88, 4, 0x51, 123));
  const auto* a = flatbuffers::GetRoot<wire::CollectiveRecord>(src.GetBufferPointer());
  flatbuffers::FlatBufferBuilder dst;
  dst.Finish(CopyCollectiveRecord(dst, a));
  auto b = wire::OpenStored<wire::CollectiveRecord>(dst.GetBufferPointer(), dst.GetSize());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->communicator(), 0xC0u);
  EXPECT_EQ((*b)->seq(), 5u);
  EXPECT_EQ((*b)->phase(), wire::CollectivePhase::Entered);
  EXPECT_EQ((*b)->kind(), wire::CollectiveKind::Broadcast);
  EXPECT_EQ((*b)->count(), 1024u);
  EXPECT_EQ((*b)->root(), 3);
  EXPECT_EQ((*b)->reduce_op(), 255);
  EXPECT_EQ((*b)->inputs()->size(), 1u);
  EXPECT_EQ((*b)->outputs()->Get(0)->fingerprint()->hi(), 2u);
  EXPECT_EQ((*b)->lane(), 1u);
  EXPECT_EQ((*b)->op_index(), 88u);
  EXPECT_EQ((*b)->step(), 4u);
  EXPECT_EQ((*b)->site(), 0x51u);
  EXPECT_EQ((*b)->time_ns(), 123u);
}

TEST(RecordCopy, SyntheticBatchOpsSurviveTheCopy) {
  testing::BatchOptions options;
  auto bytes = testing::MakeBatch("r", 1, 2, 3, 100, 10, options);
  auto env = wire::OpenEnvelope(bytes.data(), bytes.size());
  ASSERT_TRUE(env.ok());
  for (const auto* op : *(*env)->message_as_Batch()->ops()) {
    flatbuffers::FlatBufferBuilder dst;
    dst.Finish(CopyOpRecord(dst, op));
    auto b = wire::OpenStored<wire::OpRecord>(dst.GetBufferPointer(), dst.GetSize());
    ASSERT_TRUE(b.ok());
    EXPECT_EQ((*b)->op_index(), op->op_index());
    EXPECT_EQ((*b)->inputs()->size(), op->inputs()->size());
  }
}

TEST(OpChunk, RecordsRoundTripAlignedAndInOrder) {
  OpChunkWriter w;
  std::vector<std::string> records;
  for (uint64_t i = 0; i < 5; ++i) {
    records.push_back(std::string(3 + i * 5, static_cast<char>('a' + i)));  // odd sizes
    ASSERT_TRUE(w.Accepts(10 + i * 2));
    w.Add(10 + i * 2, reinterpret_cast<const uint8_t*>(records.back().data()), records.back().size());
  }
  EXPECT_FALSE(w.Accepts(18));  // not ascending
  EXPECT_EQ(w.last_op(), 18u);
  const std::string value(w.Finish());
  EXPECT_TRUE(IsOpChunk(value));
  // At an aligned and at a misaligned address.
  std::vector<uint64_t> aligned((value.size() + 7) / 8 + 1);
  for (size_t shift : {size_t{0}, size_t{3}}) {
    char* p = reinterpret_cast<char*>(aligned.data()) + shift;
    std::memcpy(p, value.data(), value.size());
    OpChunkView view;
    ASSERT_TRUE(view.Open(18, std::string_view(p, value.size())));
    ASSERT_EQ(view.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(view.op_index(i), 10 + i * 2);
      EXPECT_EQ(view.record(i), records[i]);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(view.record(i).data()) % 8, 0u);
    }
    EXPECT_EQ(view.LowerBound(13), 2u);
    EXPECT_EQ(view.LowerBound(14), 2u);
    EXPECT_EQ(view.LowerBound(19), 5u);
  }
  // The key must be the chunk's last op; truncated or bent framing is refused.
  OpChunkView view;
  EXPECT_FALSE(view.Open(17, value));
  EXPECT_FALSE(view.Open(18, std::string_view(value.data(), value.size() - 8)));
  std::string bent = value;
  bent[8 + 16 + 8] = 1;  // second entry's offset no longer 8-aligned
  EXPECT_FALSE(view.Open(18, bent));
  // A value without the magic is one record (the layout before chunks).
  ASSERT_TRUE(view.Open(7, "single"));
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(view.op_index(0), 7u);
  EXPECT_EQ(view.record(0), "single");
}

TEST(OpChunk, WriterLimitsChunkSize) {
  OpChunkWriter w;
  const std::string record(100, 'x');
  uint64_t op = 0;
  while (w.Accepts(op)) w.Add(op++, reinterpret_cast<const uint8_t*>(record.data()), record.size());
  EXPECT_EQ(w.count(), kOpChunkMaxRecords);
  w.Clear();
  EXPECT_TRUE(w.empty());
  const std::string big(40000, 'y');
  op = 0;
  while (w.Accepts(op)) w.Add(op++, reinterpret_cast<const uint8_t*>(big.data()), big.size());
  EXPECT_EQ(w.count(), 2u);  // stops once kOpChunkMaxBytes is reached
}

}  // namespace
}  // namespace opguard::daemon
