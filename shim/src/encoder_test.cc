#include "encoder.h"

#include <gtest/gtest.h>

#include <cstring>

#include "opguard/idl/envelope.h"
#include "staging.h"

namespace opguard::shim {
namespace {

namespace w = opguard::wire;

const w::Batch* Open(const EncodedBatch& b) {
  auto env = w::OpenEnvelope(b.buffer.data(), b.buffer.size());
  EXPECT_TRUE(env.ok()) << env.status().message();
  if (!env.ok()) return nullptr;
  EXPECT_EQ((*env)->message_type(), w::Message::Batch);
  return (*env)->message_as_Batch();
}

template <typename T>
void Stage(StagingBuffer& buf, EntryKind kind, const T& fixed, std::string_view tail = {}) {
  size_t bytes = sizeof(EntryHeader) + sizeof(T) + Pad8(tail.size());
  EntryWriter wr(buf.Append(bytes));
  wr.Put(EntryHeader{static_cast<uint32_t>(bytes), kind, {}});
  wr.Put(fixed);
  wr.PutBytes(tail.data(), tail.size());
}

TEST(ShimEncoder, AnnounceOnlyBatchAndEndOfRun) {
  BatchEncoder enc({"run-a", 3, 42}, 10, 1024);
  AnnounceInfo a;
  a.framework = "pytorch";
  a.world_size = 8;
  a.determinism = {{"tf32", "off"}, {"cudnn.deterministic", "true"}};
  uint64_t seq = 0;
  auto batches = enc.Encode(nullptr, 0, &a, false, &seq, nullptr);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(seq, 1u);
  const w::Batch* b = Open(batches[0]);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->run()->str(), "run-a");
  EXPECT_EQ(b->rank(), 3u);
  EXPECT_EQ(b->session(), 42u);
  EXPECT_EQ(b->seq(), 0u);
  ASSERT_NE(b->announce(), nullptr);
  EXPECT_EQ(b->announce()->framework()->str(), "pytorch");
  EXPECT_EQ(b->announce()->world_size(), 8u);
  // Key-sorted so readers may look keys up.
  EXPECT_EQ(b->announce()->determinism()->LookupByKey("tf32")->value()->str(), "off");
  EXPECT_FALSE(b->end_of_run());

  auto last = enc.Encode(nullptr, 0, nullptr, true, &seq, nullptr);
  ASSERT_EQ(last.size(), 1u);
  b = Open(last[0]);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->seq(), 1u);
  EXPECT_TRUE(b->end_of_run());
  EXPECT_EQ(b->announce(), nullptr);
  // Nothing staged, no announce, not the end: no batch at all.
  EXPECT_TRUE(enc.Encode(nullptr, 0, nullptr, false, &seq, nullptr).empty());
}

TEST(ShimEncoder, GapsStringsAndSplitting) {
  BatchEncoder enc({"run-b", 0, 1}, 2, 1024);
  StagingBuffer buf;
  Stage(buf, EntryKind::kString, StringFixed{7, 3}, "abc");
  Stage(buf, EntryKind::kGap, GapFixed{10, 19, 10, 2, 4}, "full");
  Stage(buf, EntryKind::kCollectiveGap, CollectiveGapFixed{99, 3, 5, 4});
  for (uint64_t i = 0; i < 5; ++i) {
    OpFixed op{};
    op.op_index = i;
    op.flags = OPGUARD_OP_BACKWARD | OPGUARD_OP_HAS_SEQ_NR |
               (i == 1 ? uint32_t{OPGUARD_OP_REPLICATED} : uint32_t{OPGUARD_OP_TRUSTED});
    op.seq_nr = 100 + static_cast<int64_t>(i);
    Stage(buf, EntryKind::kOp, op);
  }
  uint64_t seq = 5;
  auto batches = enc.Encode(buf.data(), buf.size(), nullptr, false, &seq, nullptr);
  ASSERT_EQ(batches.size(), 3u);  // 2 + 2 + 1 ops
  EXPECT_EQ(seq, 8u);
  const w::Batch* b = Open(batches[0]);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->seq(), 5u);
  ASSERT_EQ(b->strings()->size(), 1u);
  EXPECT_EQ(b->strings()->Get(0)->text()->str(), "abc");
  ASSERT_EQ(b->gaps()->size(), 2u);
  EXPECT_EQ(b->gaps()->Get(0)->lane(), 2u);
  EXPECT_EQ(b->gaps()->Get(0)->first_op(), 10u);
  EXPECT_EQ(b->gaps()->Get(0)->last_op(), 19u);
  EXPECT_EQ(b->gaps()->Get(0)->reason()->str(), "full");
  EXPECT_EQ(b->gaps()->Get(1)->communicator(), 99u);
  EXPECT_EQ(b->gaps()->Get(1)->first_seq(), 3u);
  EXPECT_EQ(b->gaps()->Get(1)->last_seq(), 5u);
  ASSERT_EQ(b->ops()->size(), 2u);
  EXPECT_TRUE(b->ops()->Get(1)->backward());
  EXPECT_EQ(b->ops()->Get(1)->seq_nr(), 101);
  EXPECT_FALSE(b->ops()->Get(0)->replicated());
  EXPECT_TRUE(b->ops()->Get(1)->replicated());
  EXPECT_TRUE(b->ops()->Get(0)->trusted());
  EXPECT_FALSE(b->ops()->Get(1)->trusted());
  EXPECT_EQ(batches[0].records, 2u);
  const w::Batch* c = Open(batches[2]);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->ops()->Get(0)->op_index(), 4u);
}

// Encoding in pieces of at most N batches (the sender does this so that a
// backlog never keeps it from acks for long) gives the same batches as one call.
TEST(ShimEncoder, EncodingInPiecesGivesTheSameBatches) {
  BatchEncoder enc({"run-c", 1, 9}, 2, 1024);
  StagingBuffer buf;
  for (uint64_t i = 0; i < 7; ++i) {
    Stage(buf, EntryKind::kString, StringFixed{i, 1}, "s");
    OpFixed op{};
    op.op_index = i;
    Stage(buf, EntryKind::kOp, op);
  }
  AnnounceInfo a;
  a.framework = "pytorch";
  uint64_t whole_seq = 0;
  auto whole = enc.Encode(buf.data(), buf.size(), &a, true, &whole_seq, nullptr);
  ASSERT_EQ(whole.size(), 4u);  // 2 + 2 + 2 + 1 ops, the last with end_of_run

  uint64_t seq = 0;
  size_t offset = 0;
  std::vector<EncodedBatch> pieces;
  for (int call = 0; offset < buf.size() || call == 0; ++call) {
    ASSERT_LT(call, 10);
    size_t consumed = 0;
    auto got = enc.Encode(buf.data() + offset, buf.size() - offset, call == 0 ? &a : nullptr, true, &seq,
                          nullptr, /*max_batches=*/1, &consumed);
    ASSERT_FALSE(got.empty());
    ASSERT_GT(consumed, 0u);
    offset += consumed;
    // Only the call that reaches the end marks the end of the run.
    EXPECT_EQ(Open(got.back())->end_of_run(), offset == buf.size());
    for (auto& b : got) pieces.push_back(std::move(b));
  }
  EXPECT_EQ(offset, buf.size());
  EXPECT_EQ(seq, whole_seq);
  ASSERT_EQ(pieces.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_EQ(pieces[i].buffer.size(), whole[i].buffer.size()) << i;
    EXPECT_EQ(std::memcmp(pieces[i].buffer.data(), whole[i].buffer.data(), whole[i].buffer.size()), 0) << i;
    EXPECT_EQ(pieces[i].records, whole[i].records);
  }
}

}  // namespace
}  // namespace opguard::shim
