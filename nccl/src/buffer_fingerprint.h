// Fingerprints of collective buffers: the one place that knows where a
// buffer lives and how its fingerprint can be taken (docs/nccl.md, "Buffer
// fingerprints").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "opguard/shim.h"

namespace opguard::nccl {

enum class BufferFingerprint {
  kTaken,         // `out` holds the fingerprint, or the shim's pending marker for it
  kDeviceMemory,  // device memory with a shim that cannot take device fingerprints (counted, logged once)
  kNotTaken       // nothing to fingerprint (no dtype the fingerprint knows, NULL) or it failed
};

// The fingerprint of `elements` elements of `dtype` (OPGUARD_DTYPE_*) at
// `data`, a buffer of a collective on `stream`. Call it for inputs before the
// collective is issued and for outputs after the operation completed. Host
// memory (plain or pinned; where no CUDA driver is loaded, all memory is) is
// fingerprinted on the calling thread. Device memory is fingerprinted on
// `stream` after the work already enqueued there (so call it for outputs
// right after the collective was issued): `out` gets the shim's pending
// marker and the shim holds the record until the result lands (or turns it
// into a gap with the reason). `shape` receives the buffer's 1-D
// shape, which `out->shape` points to; it must outlive the record.
BufferFingerprint FingerprintBuffer(const void* data, uint8_t dtype, uint64_t elements,
                                    cudaStream_t stream, int64_t* shape, opguard_tensor* out);

// Device buffers met so far that could not be fingerprinted.
uint64_t DeviceBuffersNotFingerprinted();

}  // namespace opguard::nccl
