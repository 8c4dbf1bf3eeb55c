#include "collective_kinds.h"

#include <cstring>
#include <iterator>

#include "opguard/shim.h"

namespace opguard::torch_adapter {
namespace {

// Where a c10d op is reached by several functions, the first row names it
// (all_gather_into_tensor, not the deprecated _all_gather_base).
constexpr CollectiveKind kKinds[] = {
    {"all_reduce", "allreduce_", OPGUARD_COLL_ALL_REDUCE, 0, 0, 2, -1},
    {"broadcast", "broadcast_", OPGUARD_COLL_BROADCAST, 0, 0, -1, 2},
    {"reduce", "reduce_", OPGUARD_COLL_REDUCE, 0, 0, 2, 3},
    {"all_gather", "allgather_", OPGUARD_COLL_ALL_GATHER, 1, 0, -1, -1},
    {"all_gather_into_tensor", "_allgather_base_", OPGUARD_COLL_ALL_GATHER, 1, 0, -1, -1},
    {"_all_gather_base", "_allgather_base_", OPGUARD_COLL_ALL_GATHER, 1, 0, -1, -1},
    {"reduce_scatter", "reduce_scatter_", OPGUARD_COLL_REDUCE_SCATTER, 1, 0, 3, -1},
    {"reduce_scatter_tensor", "_reduce_scatter_base_", OPGUARD_COLL_REDUCE_SCATTER, 1, 0, 3, -1},
    {"all_to_all", "alltoall_", OPGUARD_COLL_ALL_TO_ALL, 1, 0, -1, -1},
    {"all_to_all_single", "alltoall_base_", OPGUARD_COLL_ALL_TO_ALL, 1, 0, -1, -1},
    {"gather", "gather_", OPGUARD_COLL_GATHER, 1, 0, -1, 3},
    {"scatter", "scatter_", OPGUARD_COLL_SCATTER, 1, 0, -1, 3},
    {"send", "send", OPGUARD_COLL_SEND, 0, -1, -1, 2},
    {"recv", "recv_", OPGUARD_COLL_RECV, -1, 0, -1, 2},
    {"barrier", "barrier", OPGUARD_COLL_BARRIER, -1, -1, -1, -1},
    // torch 2.x only: coalesced collectives (dist.all_reduce_coalesced,
    // all_gather_coalesced, and what _coalescing_manager issues at its exit:
    // one collective over a list of tensors), gather into one tensor, recv
    // from any source, and the monitored barrier (synchronous: it returns no
    // work, so it completes when it returns).
    {"all_reduce_coalesced", "allreduce_coalesced_", OPGUARD_COLL_ALL_REDUCE, 0, 0, 2, -1},
    {"all_gather_coalesced", "allgather_coalesced_", OPGUARD_COLL_ALL_GATHER, 1, 0, -1, -1},
    {"all_gather_into_tensor_coalesced", "allgather_into_tensor_coalesced_",
     OPGUARD_COLL_ALL_GATHER, 1, 0, -1, -1},
    {"reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced_",
     OPGUARD_COLL_REDUCE_SCATTER, 1, 0, 3, -1},
    {"gather_into_tensor", "gather_into_tensor_", OPGUARD_COLL_GATHER, 1, 0, -1, 3},
    {"recv_any_source", "recv_any_source_", OPGUARD_COLL_RECV, -1, 0, -1, -1},
    {"monitored_barrier", "monitored_barrier_", OPGUARD_COLL_BARRIER, -1, -1, -1, -1},
};

}  // namespace

const CollectiveKind* CollectiveKinds(size_t* count) {
  *count = std::size(kKinds);
  return kKinds;
}

const CollectiveKind* CollectiveKindOfOp(const char* op) {
  if (std::strncmp(op, "c10d::", 6) != 0) return nullptr;
  for (const CollectiveKind& k : kKinds) {
    if (std::strcmp(op + 6, k.op) == 0) return &k;
  }
  return nullptr;
}

const CollectiveKind* CollectiveKindOfFunction(const char* function) {
  for (const CollectiveKind& k : kKinds) {
    if (std::strcmp(function, k.function) == 0) return &k;
  }
  return nullptr;
}

}  // namespace opguard::torch_adapter
