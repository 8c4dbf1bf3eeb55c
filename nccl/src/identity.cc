#include "identity.h"

#include <algorithm>
#include <cstring>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace opguard::nccl {
namespace {

// Seeds keep the derivations apart (a split can never equal a channel).
constexpr uint64_t kUniqueIdSeed = 0x6e63636c2d756964;  // "nccl-uid"
constexpr uint64_t kSplitSeed = 0x6e63636c2d73706c;     // "nccl-spl"
constexpr uint64_t kShrinkSeed = 0x6e63636c2d736872;    // "nccl-shr"
constexpr uint64_t kChannelSeed = 0x6e63636c2d703270;   // "nccl-p2p"

// 0 means "derive from the name" to opguard_communicator_define.
uint64_t NonZero(uint64_t id) { return id == 0 ? 1 : id; }

uint64_t HashWords(std::span<const uint64_t> words, uint64_t seed) {
  return NonZero(XXH64(words.data(), words.size_bytes(), seed));
}

}  // namespace

uint64_t IdentityOfUniqueIds(const void* ids, size_t bytes) {
  return NonZero(XXH64(ids, bytes, kUniqueIdSeed));
}

uint64_t IdentityOfSplit(uint64_t parent, int color, uint64_t ordinal) {
  const uint64_t words[] = {parent, ordinal, static_cast<uint64_t>(static_cast<int64_t>(color))};
  return HashWords(words, kSplitSeed);
}

uint64_t IdentityOfShrink(uint64_t parent, uint64_t ordinal, std::span<const int> excluded) {
  std::vector<uint64_t> words = {parent, ordinal};
  std::vector<int> sorted(excluded.begin(), excluded.end());
  std::sort(sorted.begin(), sorted.end());
  for (int r : sorted) words.push_back(static_cast<uint64_t>(static_cast<int64_t>(r)));
  return HashWords(words, kShrinkSeed);
}

uint64_t IdentityOfChannel(uint64_t comm, int src, int dst) {
  const uint64_t words[] = {comm, static_cast<uint64_t>(static_cast<uint32_t>(src)),
                            static_cast<uint64_t>(static_cast<uint32_t>(dst))};
  return HashWords(words, kChannelSeed);
}

}  // namespace opguard::nccl
