// Tensor fingerprints as the adapter takes them: host tensors read in place
// (strided ones in logical order), through the calling thread's cache of the
// fingerprints it already took. Tensors OpGuard cannot read on the host
// (device tensors in a build without the CUDA path, sparse, quantized) are
// reported as such, never given a made-up fingerprint.
#pragma once

#include <ATen/ATen.h>

#include "adapter_state.h"
#include "op_record.h"
#include "opguard/shim.h"
#include "thread_state.h"

namespace opguard::torch_adapter {

// Whether `t` holds no bytes at all: on the meta device, a FakeTensor (meta
// storage behind another device), or a functionalization wrapper (whose data
// pointer throws). torch.compile traces its graphs on such tensors, also
// lazily inside the first backward; DTensor learns its outputs' shapes so.
inline bool HoldsNoData(const at::Tensor& t) {
  if (!t.defined()) return false;
  if (t.is_meta() || t.key_set().has(c10::DispatchKey::Functionalize)) return true;
  return t.has_storage() && t.storage().device().is_meta();
}

// Fills `out` (its shape pointer unset) with the tensor's fingerprint and
// stores its shape in `shapes` at `*shape`; false if it has no host bytes
// OpGuard can read. `cached_since`: a fingerprint cached for the same bytes
// may be used if it was put at or after that cache mark (FingerprintCache::
// Mark; 0: any, kHashBytes: none, the bytes are read). `may_defer`: the bytes are final (an op's
// output at its end), so a large tensor may be hashed off this thread (async_fingerprints.h) and
// `out` be a pending fingerprint.
bool FingerprintTensor(const at::Tensor& t, ThreadState& ts, Shapes& shapes, opguard_tensor* out,
                       Shapes::At* shape, uint64_t cached_since = 0, bool may_defer = false);

inline constexpr uint64_t kHashBytes = UINT64_MAX;

// Trusted mode: fills `out` with the tensor's dtype, shape and device only
// (fingerprint zero, no statistics; the op's record says so), storing its
// shape as FingerprintTensor does. False for tensors whose dtype OpGuard
// cannot name or that hold no data.
bool DescribeTensor(const at::Tensor& t, Shapes& shapes, opguard_tensor* out, Shapes::At* shape);

// Fingerprints `tensors` from their bytes into ctx.outputs; false if one has
// no host bytes. Never from the cache: an Entered record must show memory
// changed behind torch's back (a bit flipped in a gradient before its
// all-reduce), a Completed one the bytes the collective wrote. The results
// are cached for the ops that read them next. Sets ctx.uninitialised_output
// when a tensor's memory was never written.
bool FingerprintAll(at::TensorList tensors, OpContext& ctx, ThreadState& ts);

// Scalars are recorded as their raw bits (a Python float is a double). False
// (nothing set) for other values.
bool ScalarValue(const c10::IValue& v, opguard_value* out);

// Ops whose outputs are freshly allocated, uninitialised memory.
bool HasUninitialisedOutput(const char* name);

// Drops the thread's cached fingerprints of the tensors in `v` (nested lists
// too): their bytes are about to change behind the version counter.
void ForgetTensors(const c10::IValue& v, ThreadState& ts);

// Bounds the thread's cache to one step's tensors: call before fingerprinting.
inline void BeginCacheStep(ThreadState& ts) {
  const uint64_t step = CurrentStep();
  if (ts.cache_step != step) {
    ts.cache.NewStep();
    ts.cache_step = step;
  }
}

}  // namespace opguard::torch_adapter
