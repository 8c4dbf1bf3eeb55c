// The one table of the collectives OpGuard records from PyTorch: each
// torch.distributed function, the c10d dispatcher op it reaches, its
// OPGUARD_COLL_* kind and where that op's arguments are. The Python package
// reads it through the C surface (opguard_torch_collective_*).
#pragma once

#include <cstddef>
#include <cstdint>

namespace opguard::torch_adapter {

// Argument positions of a c10d op (the same in torch 1.13 and 2.x); -1:
// none. The process group is found by its type: its position differs
// (c10d::barrier takes a tensor first in 2.x, not in 1.13).
struct CollectiveKind {
  const char* function;  // torch.distributed's name, for "c10d::<function> [enter]"
  const char* op;        // c10d dispatcher op, without "c10d::"
  uint8_t kind;          // OPGUARD_COLL_*
  int inputs;            // Tensor, Tensor[] or Tensor[][]
  int outputs;           // fingerprinted after completion
  int reduce_op;         // ReduceOp
  int root;              // int: root or peer rank in the group
};

// Every row, in table order.
const CollectiveKind* CollectiveKinds(size_t* count);
// The first row whose c10d op is `op` ("c10d::allreduce_"), or null.
const CollectiveKind* CollectiveKindOfOp(const char* op);
// The row of torch.distributed function `function`, or null.
const CollectiveKind* CollectiveKindOfFunction(const char* function);

}  // namespace opguard::torch_adapter
