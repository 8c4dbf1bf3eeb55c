#include "storage/record_copy.h"

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

// More records than Accepts() lets in (a caller that only calls Add): the
// header no longer fits the room reserved for it and Finish copies instead.
// Both paths give the same value, and a writer is reusable after either.
TEST(OpChunk, OversizedHeaderAndReuse) {
  OpChunkWriter w;
  for (size_t round = 0; round < 2; ++round) {
    const size_t n = round == 0 ? kOpChunkMaxRecords + 5 : 3;
    std::vector<std::string> records;
    for (uint64_t i = 0; i < n; ++i) {
      records.push_back(std::string(1 + i % 13, static_cast<char>('a' + i % 26)));
      w.Add(i, reinterpret_cast<const uint8_t*>(records.back().data()), records.back().size());
    }
    for (ChunkCodec codec : {ChunkCodec::kNone, ChunkCodec::kLz4}) {
      const std::string value(w.Finish(codec));
      OpChunkView view;
      ASSERT_TRUE(view.Open(n - 1, value, /*copy=*/true));
      ASSERT_EQ(view.size(), n);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(view.record(i), records[i]);
    }
    w.Clear();
    EXPECT_TRUE(w.empty());
    EXPECT_EQ(w.record_bytes(), 0u);
  }
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

// ---- AddOpRecordBytes and compressed chunks ------------------------------------

// `bytes` at an 8-aligned address: the verified buffer AddOpRecordBytes is given.
std::vector<uint64_t> Aligned(const std::string& bytes) {
  std::vector<uint64_t> out((bytes.size() + 7) / 8);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Two optional vectors of scalars (shapes, kernel ids), element by element.
template <typename T>
void ExpectSameScalars(const flatbuffers::Vector<T>* a, const flatbuffers::Vector<T>* b) {
  ASSERT_EQ(a == nullptr, b == nullptr);
  if (a == nullptr) return;
  ASSERT_EQ(a->size(), b->size());
  for (uint32_t i = 0; i < a->size(); ++i) EXPECT_EQ(a->Get(i), b->Get(i));
}

void ExpectSameSig(const wire::TensorSig* a, const wire::TensorSig* b) {
  ASSERT_EQ(a == nullptr, b == nullptr);
  if (a == nullptr) return;
  ASSERT_EQ(a->fingerprint() == nullptr, b->fingerprint() == nullptr);
  if (a->fingerprint()) {
    EXPECT_EQ(a->fingerprint()->lo(), b->fingerprint()->lo());
    EXPECT_EQ(a->fingerprint()->hi(), b->fingerprint()->hi());
  }
  EXPECT_EQ(a->dtype(), b->dtype());
  EXPECT_EQ(a->device(), b->device());
  ExpectSameScalars(a->shape(), b->shape());
  ASSERT_EQ(a->stats() == nullptr, b->stats() == nullptr);
  if (a->stats()) {
    EXPECT_EQ(a->stats()->nan_count(), b->stats()->nan_count());
    EXPECT_EQ(a->stats()->inf_count(), b->stats()->inf_count());
    EXPECT_EQ(a->stats()->min(), b->stats()->min());
    EXPECT_EQ(a->stats()->max(), b->stats()->max());
    EXPECT_EQ(a->stats()->sum(), b->stats()->sum());
    EXPECT_EQ(a->stats()->l2(), b->stats()->l2());
  }
}

void ExpectSameSigs(const flatbuffers::Vector<flatbuffers::Offset<wire::TensorSig>>* a,
                    const flatbuffers::Vector<flatbuffers::Offset<wire::TensorSig>>* b) {
  ASSERT_EQ(a == nullptr, b == nullptr);
  if (a == nullptr) return;
  ASSERT_EQ(a->size(), b->size());
  for (uint32_t i = 0; i < a->size(); ++i) ExpectSameSig(a->Get(i), b->Get(i));
}

// Every field of OpRecord, deeply.
void ExpectSameOp(const wire::OpRecord* a, const wire::OpRecord* b) {
  EXPECT_EQ(a->lane(), b->lane());
  EXPECT_EQ(a->op_index(), b->op_index());
  EXPECT_EQ(a->step(), b->step());
  EXPECT_EQ(a->name(), b->name());
  EXPECT_EQ(a->site(), b->site());
  EXPECT_EQ(a->seq_nr(), b->seq_nr());
  EXPECT_EQ(a->backward(), b->backward());
  EXPECT_EQ(a->start_ns(), b->start_ns());
  EXPECT_EQ(a->duration_ns(), b->duration_ns());
  EXPECT_EQ(a->nondeterministic(), b->nondeterministic());
  EXPECT_EQ(a->replicated(), b->replicated());
  EXPECT_EQ(a->forward_site(), b->forward_site());
  EXPECT_EQ(a->trusted(), b->trusted());
  ExpectSameScalars(a->kernels(), b->kernels());
  ASSERT_EQ(a->inputs() == nullptr, b->inputs() == nullptr);
  if (a->inputs()) {
    ASSERT_EQ(a->inputs()->size(), b->inputs()->size());
    for (uint32_t i = 0; i < a->inputs()->size(); ++i) {
      const auto* x = a->inputs()->Get(i);
      const auto* y = b->inputs()->Get(i);
      EXPECT_EQ(x->kind(), y->kind());
      EXPECT_EQ(x->scalar_bits(), y->scalar_bits());
      EXPECT_EQ(x->scalar_dtype(), y->scalar_dtype());
      ExpectSameSig(x->tensor(), y->tensor());
      ExpectSameSigs(x->tensors(), y->tensors());
    }
  }
  ExpectSameSigs(a->outputs(), b->outputs());
}

// A batch of `n` ops built the way a FlatBufferBuilder builds any batch:
// vtables deduplicated across records (the shim's encoder does the same), so
// most records refer to vtables stored with an earlier record. Every field
// set, `replicated` and `forward_site` on every other op, `trusted` on every
// third.
std::string BatchWithEveryField(uint32_t n) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<wire::OpRecord>> ops;
  for (uint32_t i = 0; i < n; ++i) {
    int64_t shape[3] = {2, 3, 4 + i};
    wire::Fp128 fp(0x1122334455667788ull + i, 0x99aabbccddeeff00ull ^ i);
    auto stats = wire::CreateTensorStats(b, 1 + i, 2, -1.5, 2.5 + i, 3.5, 4.5);
    auto t =
        wire::CreateTensorSig(b, &fp, wire::DType::Float16, b.CreateVector(shape, 3), stats, 3);
    auto t2 = wire::CreateTensorSig(b, &fp, wire::DType::Int8, 0, 0, -1);
    auto list = b.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{t2, t2});
    std::vector<flatbuffers::Offset<wire::Value>> inputs = {
        wire::CreateValue(b, wire::ValueKind::Tensor, t),
        wire::CreateValue(b, wire::ValueKind::Scalar, 0, 1077936128 + i, wire::DType::Float32),
        wire::CreateValue(b, wire::ValueKind::TensorList, 0, 0, wire::DType::Unknown, list),
        wire::CreateValue(b, wire::ValueKind::None)};
    auto out = wire::CreateTensorSig(b, &fp, wire::DType::BFloat16, b.CreateVector(shape, 2));
    uint64_t kernels[2] = {5 + i, 6};
    ops.push_back(wire::CreateOpRecord(
        b, i % 3, 77 + i, 3, 11, 12, 99 + i, i % 2 == 0, b.CreateVector(inputs),
        b.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{out, out}),
        i % 4 == 3 ? 0 : b.CreateVector(kernels, 2), 1000 + i, 20, i % 5 == 0, i % 2 == 1,
        i % 2 == 1 ? 0x5151 + i : 0, i % 3 == 2));
  }
  auto run = b.CreateString("r");
  auto batch = wire::CreateBatch(b, run, 1, 2, 3, 0, 0, 0, 0, b.CreateVector(ops));
  wire::FinishEnvelope(b, batch);
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

// Copies every op of `bytes` (an envelope) into chunks with AddOpRecordBytes,
// reads them back through OpChunkView and compares every field.
void RoundTripBytes(const std::string& bytes, ChunkCodec codec, size_t* copied) {
  const auto storage = Aligned(bytes);
  auto env = wire::OpenEnvelope(storage.data(), bytes.size());
  ASSERT_TRUE(env.ok()) << env.status().message();
  const auto* buffer = reinterpret_cast<const uint8_t*>(storage.data());
  const auto* ops = (*env)->message_as_Batch()->ops();
  OpChunkWriter w;
  for (const auto* op : *ops) {
    if (AddOpRecordBytes(&w, buffer, bytes.size(), op)) {
      ++*copied;
    } else {
      flatbuffers::FlatBufferBuilder fbb;
      fbb.Finish(CopyOpRecord(fbb, op));
      w.Add(op->op_index(), fbb.GetBufferPointer(), fbb.GetSize());
    }
  }
  const std::string value(w.Finish(codec));
  EXPECT_TRUE(IsOpChunk(value));
  OpChunkView view;
  ASSERT_TRUE(view.Open(ops->Get(ops->size() - 1)->op_index(), value));
  ASSERT_EQ(view.size(), ops->size());
  for (uint32_t i = 0; i < ops->size(); ++i) {
    auto stored = wire::OpenStored<wire::OpRecord>(view.record(i).data(), view.record(i).size());
    ASSERT_TRUE(stored.ok()) << "record " << i;
    EXPECT_EQ(view.op_index(i), ops->Get(i)->op_index());
    ExpectSameOp(ops->Get(i), *stored);
  }
}

TEST(RecordBytes, EveryFieldSurvivesWithSharedVtables) {
  size_t copied = 0;
  RoundTripBytes(BatchWithEveryField(12), ChunkCodec::kNone, &copied);
  EXPECT_EQ(copied, 12u);  // all took the byte-copy path
}

TEST(RecordBytes, SyntheticBatchesAndEveryCodec) {
  testing::BatchOptions options;
  options.inputs = 3;
  for (ChunkCodec codec : {ChunkCodec::kNone, ChunkCodec::kLz4, ChunkCodec::kZstd}) {
    size_t copied = 0;
    RoundTripBytes(testing::MakeBatch("r", 1, 2, 3, 100, 50, options), codec, &copied);
    EXPECT_EQ(copied, 50u);
  }
}

TEST(RecordBytes, InterleavedRecordsAreRebuilt) {
  // Three records whose parts a builder interleaved: each one's span would
  // hold the others' bytes, so all are refused (and rebuilt by ingest).
  flatbuffers::FlatBufferBuilder b;
  std::vector<flatbuffers::Offset<wire::TensorSig>> sigs[3];
  for (int k = 0; k < 8; ++k) {
    for (int r = 0; r < 3; ++r) {
      int64_t shape[4] = {1, 2, 3, 4};
      wire::Fp128 fp(k, r);
      sigs[r].push_back(wire::CreateTensorSig(b, &fp, wire::DType::Float32,
                                              b.CreateVector(shape, 4),
                                              wire::CreateTensorStats(b, 1, 2, 3, 4, 5, 6)));
    }
  }
  auto o0 = b.CreateVector(sigs[0]);
  auto o1 = b.CreateVector(sigs[1]);
  auto o2 = b.CreateVector(sigs[2]);
  std::vector<flatbuffers::Offset<wire::OpRecord>> ops = {
      wire::CreateOpRecord(b, 0, 1, 0, 0, 0, -1, false, 0, o0),
      wire::CreateOpRecord(b, 0, 2, 0, 0, 0, -1, false, 0, o1),
      wire::CreateOpRecord(b, 0, 3, 0, 0, 0, -1, false, 0, o2)};
  wire::FinishEnvelope(
      b, wire::CreateBatch(b, b.CreateString("r"), 0, 0, 0, 0, 0, 0, 0, b.CreateVector(ops)));
  const std::string bytes(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
  const auto storage = Aligned(bytes);
  auto env = wire::OpenEnvelope(storage.data(), bytes.size());
  ASSERT_TRUE(env.ok());
  OpChunkWriter w;
  for (const auto* op : *(*env)->message_as_Batch()->ops()) {
    EXPECT_FALSE(
        AddOpRecordBytes(&w, reinterpret_cast<const uint8_t*>(storage.data()), bytes.size(), op));
  }
  EXPECT_TRUE(w.empty());
  size_t copied = 0;
  RoundTripBytes(bytes, ChunkCodec::kLz4, &copied);  // rebuilt, and still every field
  EXPECT_EQ(copied, 0u);
}

TEST(RecordBytes, UnknownFieldsAreRebuilt) {
  // An OpRecord with a field appended after `trusted` (a newer shim): its
  // value could be an offset the walk does not know, so it is refused.
  flatbuffers::FlatBufferBuilder b;
  auto start = b.StartTable();
  b.AddElement<uint64_t>(wire::OpRecord::VT_OP_INDEX, 5, 0);
  b.AddElement<uint32_t>(static_cast<flatbuffers::voffset_t>(wire::OpRecord::VT_TRUSTED + 2), 7, 0);
  flatbuffers::Offset<wire::OpRecord> op(b.EndTable(start));
  wire::FinishEnvelope(
      b, wire::CreateBatch(b, b.CreateString("r"), 0, 0, 0, 0, 0, 0, 0,
                           b.CreateVector(std::vector<flatbuffers::Offset<wire::OpRecord>>{op})));
  const std::string bytes(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
  const auto storage = Aligned(bytes);
  auto env = wire::OpenEnvelope(storage.data(), bytes.size());
  ASSERT_TRUE(env.ok());
  OpChunkWriter w;
  EXPECT_FALSE(AddOpRecordBytes(&w, reinterpret_cast<const uint8_t*>(storage.data()), bytes.size(),
                                (*env)->message_as_Batch()->ops()->Get(0)));
}

TEST(OpChunk, CompressedChunksRoundTripAndDamageIsRefused) {
  for (ChunkCodec codec : {ChunkCodec::kLz4, ChunkCodec::kZstd}) {
    OpChunkWriter w;
    std::vector<std::string> records;
    for (uint64_t i = 0; i < 40; ++i) {
      records.push_back(std::string(24 + i % 7, static_cast<char>('a' + i % 3)));
      w.Add(100 + i, reinterpret_cast<const uint8_t*>(records.back().data()),
            records.back().size());
    }
    const std::string plain(w.Finish());
    const std::string packed(w.Finish(codec));
    EXPECT_LT(packed.size(), plain.size());
    EXPECT_EQ(packed.substr(0, 4), "OGZ1");
    OpChunkView view;
    ASSERT_TRUE(view.Open(139, packed));
    ASSERT_EQ(view.size(), 40u);
    for (size_t i = 0; i < 40; ++i) {
      EXPECT_EQ(view.op_index(i), 100 + i);
      EXPECT_EQ(view.record(i), records[i]);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(view.record(i).data()) % 8, 0u);
    }
    EXPECT_FALSE(view.Open(138, packed));                               // wrong key
    EXPECT_FALSE(view.Open(139, packed.substr(0, packed.size() - 3)));  // truncated
    std::string bad_size = packed;
    bad_size[8] = static_cast<char>(bad_size[8] + 1);  // raw size off by one
    EXPECT_FALSE(view.Open(139, bad_size));
    std::string bad_codec = packed;
    bad_codec[4] = 9;
    EXPECT_FALSE(view.Open(139, bad_codec));
    std::string huge = packed;
    huge[11] = 0x7f;  // raw size ~2 GiB
    EXPECT_FALSE(view.Open(139, huge));
  }
  EXPECT_EQ(ChunkCodecByName("lz4"), ChunkCodec::kLz4);
  EXPECT_EQ(ChunkCodecByName("zstd"), ChunkCodec::kZstd);
  EXPECT_EQ(ChunkCodecByName("none"), ChunkCodec::kNone);
}

// The event cores stored in front of a chunk come back as written, with
// every codec and at any address; the records behind them still read; a
// chunk without cores says so, and damaged framing is refused.
TEST(OpChunk, CoresRoundTripInFrontOfTheRecords) {
  for (ChunkCodec codec : {ChunkCodec::kNone, ChunkCodec::kLz4, ChunkCodec::kZstd}) {
    OpChunkWriter w;
    std::vector<std::string> records;
    std::vector<aligner::OpEventCore> cores;
    for (uint64_t i = 0; i < 50; ++i) {
      records.push_back(std::string(17 + i % 5, static_cast<char>('a' + i % 4)));
      w.Add(200 + i * 3, reinterpret_cast<const uint8_t*>(records.back().data()), records.back().size());
      aligner::OpEventCore c;
      c.op_index = 200 + i * 3;
      c.step = i / 10;
      c.name = 0x1000 + i % 3;
      c.site = 0x2000 + i % 2;
      c.siteless_key = 0x9e3779b97f4a7c15ULL * (i % 3 + 1);
      c.outputs = {i * 0x0123456789abcdefULL, ~i};
      c.inputs = {i << 40, i * 7};
      c.flags = static_cast<uint32_t>(i % 4);
      cores.push_back(c);
      w.AddCore(c);
    }
    const uint64_t last = 200 + 49 * 3;
    const std::string value(w.Finish(codec));
    EXPECT_EQ(value.substr(0, 4), "OGE1");
    EXPECT_TRUE(IsOpChunk(value));
    std::vector<uint64_t> aligned((value.size() + 7) / 8 + 1);
    for (size_t shift : {size_t{0}, size_t{5}}) {
      char* p = reinterpret_cast<char*>(aligned.data()) + shift;
      std::memcpy(p, value.data(), value.size());
      const std::string_view at(p, value.size());
      OpChunkView view;
      ASSERT_EQ(view.OpenCores(last, at), OpChunkView::Cores::kRead) << static_cast<int>(codec);
      EXPECT_EQ(view.cores(), cores);
      ASSERT_TRUE(view.Open(last, at));
      ASSERT_EQ(view.size(), records.size());
      for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ(view.record(i), records[i]);
    }
    OpChunkView view;
    EXPECT_EQ(view.OpenCores(last - 1, value), OpChunkView::Cores::kDamaged);  // wrong key
    std::string bad_block = value;
    bad_block[8] = static_cast<char>(bad_block[8] + 8);  // block size past the cores
    EXPECT_EQ(view.OpenCores(last, bad_block), OpChunkView::Cores::kDamaged);
    std::string bad_count = value;
    bad_count[20] = static_cast<char>(bad_count[20] + 1);  // count no longer the raw size's
    EXPECT_EQ(view.OpenCores(last, bad_count), OpChunkView::Cores::kDamaged);
    EXPECT_EQ(view.OpenCores(last, value.substr(0, 40)), OpChunkView::Cores::kDamaged);
    std::string other_version = value;
    other_version[4] = static_cast<char>(aligner::kOpEventCoreVersion + 1);
    EXPECT_EQ(view.OpenCores(last, other_version), OpChunkView::Cores::kAbsent);
    EXPECT_TRUE(view.Open(last, other_version));  // the records still read

    // A chunk some of whose records have no core is stored without cores.
    w.Clear();
    w.Add(1, reinterpret_cast<const uint8_t*>(records[0].data()), records[0].size());
    w.AddCore(cores[0]);
    w.Add(2, reinterpret_cast<const uint8_t*>(records[1].data()), records[1].size());
    const std::string partial(w.Finish(codec));
    EXPECT_NE(partial.substr(0, 4), "OGE1");
    EXPECT_EQ(view.OpenCores(2, partial), OpChunkView::Cores::kAbsent);
    EXPECT_TRUE(view.Open(2, partial));
  }
}

}  // namespace
}  // namespace opguard::daemon
