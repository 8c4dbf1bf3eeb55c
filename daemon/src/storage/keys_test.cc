#include "keys.h"

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
  EXPECT_EQ(GetU64(OpKey(7, 3, 1, 0x0102030405060708ull).data() + 16), 0x0102030405060708ull);
}

TEST(Keys, EveryRunKeyIsInsideTheRunRange) {
  const std::string begin = RunBegin(5), end = RunBegin(6);
  for (const std::string& k : {OpKey(5, UINT32_MAX, UINT32_MAX, UINT64_MAX), CollectiveKey(5, UINT64_MAX, 1, 2, 1),
                               DefKey(5, kStringKind, UINT64_MAX), SourceKey(5, 1),
                               EventKey(5, 1, kGapKind, 0, 1)}) {
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
