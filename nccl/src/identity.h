// Communicator identities: one 64-bit id that every member of an NCCL
// communicator computes alike, from what every member passes to NCCL, with no
// extra communication (docs/nccl.md, "Communicator identity").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace opguard::nccl {

// ncclCommInitRank / InitRankConfig (one id) and InitRankScalable (several):
// every member passes the same ncclUniqueId bytes.
uint64_t IdentityOfUniqueIds(const void* ids, size_t bytes);

// ncclCommSplit: every member of the parent calls it (NCCL_SPLIT_NOCOLOR for
// those left out) in the same order, so the split's ordinal on the parent and
// the color name the child alike on each of its members.
uint64_t IdentityOfSplit(uint64_t parent, int color, uint64_t ordinal);

// ncclCommShrink: the remaining members pass the same excluded ranks, and
// count their shrinks of the parent alike.
uint64_t IdentityOfShrink(uint64_t parent, uint64_t ordinal, std::span<const int> excluded);

// Point-to-point traffic from communicator rank `src` to `dst`: its own
// sequence (a send on src and the matching recv on dst share a number), since
// ranks do not take part in each other's sends and receives.
uint64_t IdentityOfChannel(uint64_t comm, int src, int dst);

}  // namespace opguard::nccl
