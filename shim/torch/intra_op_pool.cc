// The adapter is compiled with OpenMP (shim/torch/CMakeLists.txt) for this
// file: at::parallel_for is inline, and runs on torch's OpenMP pool only
// where the including file is compiled with OpenMP too (serially otherwise).
// At run time the process has one OpenMP runtime, the libgomp.so.1 torch loaded.
#include "intra_op_pool.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "adapter_state.h"

namespace opguard::torch_adapter {

int IntraOpShares(uint64_t bytes) {
  static const uint64_t min_bytes = EnvByteCount("OPGUARD_INTRA_OP_FP_MIN_BYTES", 256u << 10);
  constexpr uint64_t kShareBytes = 128u << 10;  // two of the fingerprint's 64 KiB tiles
  if (min_bytes == 0 || bytes < min_bytes || at::in_parallel_region()) return 1;
  const int threads = at::get_num_threads();
  if (threads <= 1) return 1;
  return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads),
                                             std::max<uint64_t>(1, bytes / kShareBytes)));
}

void RunOnIntraOpPool(void* /*pool_ctx*/, int tasks, void (*task)(void* task_ctx, int index),
                      void* task_ctx) {
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) task(task_ctx, static_cast<int>(i));
  });
}

}  // namespace opguard::torch_adapter
