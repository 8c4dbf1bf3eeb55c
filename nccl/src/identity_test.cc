#include "identity.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

namespace opguard::nccl {
namespace {

TEST(NcclIdentity, SameUniqueIdBytesGiveTheSameIdentityAndOthersDiffer) {
  unsigned char a[128], b[128];
  for (int i = 0; i < 128; ++i) a[i] = b[i] = static_cast<unsigned char>(i * 7);
  EXPECT_EQ(IdentityOfUniqueIds(a, sizeof(a)), IdentityOfUniqueIds(b, sizeof(b)));
  b[127] ^= 1;
  EXPECT_NE(IdentityOfUniqueIds(a, sizeof(a)), IdentityOfUniqueIds(b, sizeof(b)));
  EXPECT_NE(IdentityOfUniqueIds(a, sizeof(a)), 0u);
}

TEST(NcclIdentity, SplitsDependOnParentColorAndOrdinal) {
  std::set<uint64_t> seen;
  for (uint64_t parent : {1ull, 2ull}) {
    for (int color : {0, 1, 7}) {
      for (uint64_t ordinal : {0ull, 1ull}) {
        uint64_t id = IdentityOfSplit(parent, color, ordinal);
        EXPECT_EQ(id, IdentityOfSplit(parent, color, ordinal));
        EXPECT_TRUE(seen.insert(id).second) << parent << " " << color << " " << ordinal;
      }
    }
  }
}

TEST(NcclIdentity, ShrinkIgnoresTheOrderOfExcludedRanks) {
  std::vector<int> one = {3, 1}, other = {1, 3}, fewer = {1};
  EXPECT_EQ(IdentityOfShrink(9, 0, one), IdentityOfShrink(9, 0, other));
  EXPECT_NE(IdentityOfShrink(9, 0, one), IdentityOfShrink(9, 0, fewer));
  EXPECT_NE(IdentityOfShrink(9, 0, one), IdentityOfShrink(9, 1, one));
}

TEST(NcclIdentity, ChannelsAreDirectedAndApartFromSplits) {
  EXPECT_NE(IdentityOfChannel(5, 0, 1), IdentityOfChannel(5, 1, 0));
  EXPECT_EQ(IdentityOfChannel(5, 0, 1), IdentityOfChannel(5, 0, 1));
  EXPECT_NE(IdentityOfChannel(5, 0, 1), IdentityOfSplit(5, 0, 1));
}

}  // namespace
}  // namespace opguard::nccl
