// GPU path of the fingerprint: kernels enqueued on the caller's stream that
// write results to device memory, and a collector that brings them to the
// host asynchronously. Same specification and bits as FingerprintHost
// (docs/fingerprint.md). Nothing here synchronizes the device or the stream.
//
// Threading: a Fingerprinter is used from one host thread at a time, and its
// launches must be ordered on one stream (it reuses its workspace); give each
// stream its own Fingerprinter.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "opguard/fingerprint/fingerprint.h"

namespace opguard::fingerprint::cuda {

// One result as the kernels write it to device memory. Stable layout
// (64 bytes) so callers may keep slot arrays in their own allocations.
struct alignas(16) ResultSlot {
  uint64_t lo;  // digest
  uint64_t hi;
  uint64_t nan_count;
  uint64_t inf_count;
  double min;
  double max;
  double sum;
  double l2;
};
static_assert(sizeof(ResultSlot) == 64);

inline Fingerprint ToFingerprint(const ResultSlot& s) {
  return {{s.lo, s.hi}, {s.nan_count, s.inf_count, s.min, s.max, s.sum, s.l2}};
}

class Fingerprinter {
 public:
  // Allocates the workspace on the current device. `max_batch`: most tensors
  // per EnqueueBatch call. nullptr (and *error set) on failure, e.g. no device.
  static std::unique_ptr<Fingerprinter> Create(cudaError_t* error, uint32_t max_batch = 4096);
  ~Fingerprinter();
  Fingerprinter(const Fingerprinter&) = delete;
  Fingerprinter& operator=(const Fingerprinter&) = delete;

  // Fingerprints one contiguous tensor in device memory (tensor.strides empty
  // or C-contiguous; make strided tensors contiguous first). Writes *slot
  // (device memory) when the work completes on `stream`. Any alignment.
  cudaError_t Enqueue(const TensorView& tensor, ResultSlot* slot, cudaStream_t stream);

  // Fingerprints tensors[i] into slots[i] (device memory) with one kernel,
  // one CTA per tensor: meant for many small tensors. Tensors larger than
  // kBatchMaxBytes are launched with Enqueue instead, still on `stream`.
  // Blocks the host only if the previous batch's descriptor upload has not
  // finished yet.
  cudaError_t EnqueueBatch(std::span<const TensorView> tensors, ResultSlot* slots,
                           cudaStream_t stream);

  static constexpr uint64_t kBatchMaxBytes = 1u << 20;

 private:
  Fingerprinter() = default;
  struct Impl;
  Impl* impl_ = nullptr;
};

// Copies result slots to pinned host memory on a stream and tells when they
// have landed, without blocking: Collect(), then poll Ready().
class ResultCollector {
 public:
  static std::unique_ptr<ResultCollector> Create(cudaError_t* error, size_t capacity);
  ~ResultCollector();
  ResultCollector(const ResultCollector&) = delete;
  ResultCollector& operator=(const ResultCollector&) = delete;

  // Enqueues the copy of `count` slots (<= capacity) after the work already
  // on `stream`, and records an event behind it.
  cudaError_t Collect(const ResultSlot* device_slots, size_t count, cudaStream_t stream);
  // True once the last Collect's copy has completed (cudaEventQuery).
  bool Ready() const;
  // The event's state itself: cudaSuccess (landed), cudaErrorNotReady, or
  // the error that the work on the stream ran into.
  cudaError_t Query() const;
  // Blocks on the event only (not the device or the stream).
  cudaError_t Wait() const;
  // The last collected results; valid once Ready().
  std::span<const ResultSlot> results() const;

 private:
  ResultCollector() = default;
  ResultSlot* host_ = nullptr;
  size_t capacity_ = 0;
  size_t count_ = 0;
  cudaEvent_t done_ = nullptr;
};

}  // namespace opguard::fingerprint::cuda
