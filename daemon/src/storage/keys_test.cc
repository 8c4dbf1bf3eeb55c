#include "storage/keys.h"

#include <gtest/gtest.h>

namespace opguard::daemon::keys {
namespace {

TEST(Keys, OpKeysSortNumerically) {
  EXPECT_EQ(OpKey(1, 2, 3, 4).size(), 24u);
  EXPECT_LT(OpKey(1, 0, 0, 255), OpKey(1, 0, 0, 256));
  EXPECT_LT(OpKey(1, 0, 0, UINT64_MAX), OpKey(1, 0, 1, 0));
  EXPECT_LT(OpKey(1, 0, UINT32_MAX, 0), OpKey(1, 1, 0, 0));
  EXPECT_LT(OpKey(1, UINT32_MAX, 0, 0), OpKey(2, 0, 0, 0));
  EXPECT_EQ(OpKey(7, 3, 1, 9).substr(0, 16), LanePrefix(7, 3, 1));
  EXPECT_EQ(OpKeyIndex(OpKey(7, 3, 1, 0x0102030405060708ull)), 0x0102030405060708ull);
  EXPECT_EQ(OpKeyLane(OpKey(7, 3, 0x0a0b0c0d, 1)), 0x0a0b0c0du);
  char raw[kOpKeySize];
  EncodeOpKey(raw, 7, 3, 1, 9);
  EXPECT_EQ(std::string(raw, sizeof raw), OpKey(7, 3, 1, 9));
}

TEST(Keys, KindRangesHoldTheirKeysOnly) {
  const std::string gaps = EventKindPrefix(5, 2, kCollectiveGapKind), upper = KindUpperBound(gaps);
  const std::string key = CollectiveGapKey(5, 2, UINT64_MAX, UINT64_MAX);
  EXPECT_EQ(key.size(), 29u);
  EXPECT_EQ(key.substr(0, gaps.size()), gaps);
  EXPECT_LT(key, upper);
  EXPECT_GE(EventKey(5, 2, kStepKind, 0, 0), upper);  // 's' sorts after 'G'
  EXPECT_LT(EventKey(5, 2, kGapKind, UINT32_MAX, UINT64_MAX), KindUpperBound(EventKindPrefix(5, 2, kGapKind)));
  EXPECT_EQ(DefKey(5, kCommunicatorKind, 1).substr(0, 9), DefKindPrefix(5, kCommunicatorKind));
  EXPECT_EQ(CollectiveKeyRank(CollectiveKey(5, 1, 2, 0x01020304, 1)), 0x01020304u);
}

TEST(Keys, SiteValuesRoundTrip) {
  uint64_t file = 0, function = 0;
  uint32_t line = 0;
  ASSERT_TRUE(DecodeSiteValue(SiteValue(0x1122334455667788ull, 214, 42), &file, &line, &function));
  EXPECT_EQ(file, 0x1122334455667788ull);
  EXPECT_EQ(line, 214u);
  EXPECT_EQ(function, 42u);
  EXPECT_FALSE(DecodeSiteValue("short", &file, &line, &function));
}

TEST(Keys, EveryRunKeyIsInsideTheRunRange) {
  const std::string begin = RunBegin(5), end = RunBegin(6);
  for (const std::string& k : {OpKey(5, UINT32_MAX, UINT32_MAX, UINT64_MAX), CollectiveKey(5, UINT64_MAX, 1, 2, 1),
                               DefKey(5, kStringKind, UINT64_MAX), SourceKey(5, 1),
                               EventKey(5, 1, kGapKind, 0, 1), CollectiveGapKey(5, 1, 2, 3)}) {
    EXPECT_LE(begin, k);
    EXPECT_LT(k, end);
  }
}

TEST(Keys, CollectivesOrderByCommunicatorThenSeqThenRank) {
  EXPECT_LT(CollectiveKey(1, 9, 1, 7, 0), CollectiveKey(1, 9, 2, 0, 0));
  EXPECT_LT(CollectiveKey(1, 9, 2, 0, 1), CollectiveKey(1, 9, 2, 1, 0));
  EXPECT_LT(CollectiveKey(1, 9, 2, 0, 0), CollectiveKey(1, 9, 2, 0, 1));
}

}  // namespace
}  // namespace opguard::daemon::keys
