// Large host tensors fingerprinted off the training thread (docs/torch.md,
// "Large tensors"): an op's output of at least OPGUARD_ASYNC_FP_MIN_BYTES is
// handed to the shim's fingerprint thread (opguard_fingerprint_host_async)
// and its record carries a pending fingerprint that the shim fills in before
// sending it.
//
// The fingerprint must be of the bytes the op produced:
//  - the tensor is referenced until hashed, so its storage cannot be freed
//    and reused;
//  - before any op runs, AwaitPendingWrites waits for the pending hashes of
//    every storage that op may write: the arguments its schema marks as
//    written (Tensor(a!): in-place and out= ops), every tensor of a
//    collective (their schemas mark none, and the backend's thread writes
//    them), or all its tensor arguments when the op has no schema. Writes that bypass
//    aten ops (a numpy view of the tensor, custom C++ writing through
//    data_ptr) are not seen; the threshold keeps such tensors (small index
//    tensors, data-loader buffers) mostly inline.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdint>

#include "opguard/shim.h"

namespace opguard::torch_adapter {

// OPGUARD_ASYNC_FP_MIN_BYTES, read once: 0 turns deferral off; default
// 1 MiB. An invalid value warns once and keeps the default.
uint64_t AsyncMinBytes();

// Hands the contiguous host tensor `t` to the fingerprint thread and fills
// `out` with the pending marker (shape, ndim, dtype as given). False when it
// was not taken (shim older than API 3, pending limit): hash it inline.
bool SubmitHostFingerprint(const at::Tensor& t, uint8_t dtype, const int64_t* shape, uint32_t ndim,
                           opguard_tensor* out);

// Before `fn` runs: waits until no storage it may write has a pending hash.
// Cheap (one atomic load) while nothing is pending.
void AwaitPendingWrites(const at::RecordFunction& fn);

// Pending hashes of `storage` now (for tests and diagnostics).
size_t PendingHashesOf(const c10::StorageImpl* storage);

}  // namespace opguard::torch_adapter
