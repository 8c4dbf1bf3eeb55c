// Large tensors fingerprinted on torch's intra-op thread pool. The training
// thread fingerprints between ops, while the pool's threads (which compute
// torch's own ops, and sit idle then) wait: a large tensor's fingerprint is
// split into shares they run too. The result does not depend on the split
// (docs/fingerprint.md: a keyed sum, statistics folded tile by tile).
#pragma once

#include <cstdint>

namespace opguard::torch_adapter {

// How many shares a fingerprint of `bytes` hashed on the calling thread is
// split into: 1 (the calling thread alone) below OPGUARD_INTRA_OP_FP_MIN_BYTES
// (read once: default 256 KiB, 0 turns splitting off), inside a parallel
// region, or with one intra-op thread; else at most one per intra-op thread
// and per 128 KiB.
int IntraOpShares(uint64_t bytes);

// An opguard_parallel_for (shim.h) that runs the tasks with at::parallel_for.
void RunOnIntraOpPool(void* pool_ctx, int tasks, void (*task)(void* task_ctx, int index),
                      void* task_ctx);

}  // namespace opguard::torch_adapter
