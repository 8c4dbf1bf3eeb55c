/* The table of functions a device backend gives the shim core. C, because
 * it crosses a dlopen boundary: the CUDA backend (libopguard_shim_cuda.so,
 * cuda/src/shim_cuda_backend.cc) is loaded only when a device fingerprint is
 * first asked for. Tests implement it on host memory. Internal to one build
 * of OpGuard (both sides come from the same tree); `abi` guards against a
 * stale library all the same. */
#ifndef OPGUARD_SHIM_DEVICE_OPS_H_
#define OPGUARD_SHIM_DEVICE_OPS_H_

#include <stddef.h>
#include <stdint.h>

#include "opguard/shim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OPGUARD_DEVICE_OPS_ABI 1u

typedef struct opguard_device_tensor {
  const void* data;
  const int64_t* shape;
  uint32_t ndim;
  uint8_t dtype;
  int32_t device;
} opguard_device_tensor;

typedef struct opguard_device_ops {
  uint32_t abi;    /* OPGUARD_DEVICE_OPS_ABI */
  uint32_t slots;  /* result slots 0..slots-1 */
  void* self;
  /* Recording thread; calls for one slot never overlap. Enqueues the
   * fingerprint of the C-contiguous tensor `t` on `stream` behind its work,
   * its result into `slot`, without waiting for anything. 0 on success;
   * otherwise writes why into why[why_len] (e.g. "cuda graph capture") and
   * enqueued nothing. */
  int (*launch)(void* self, uint32_t slot, const opguard_device_tensor* t, void* stream,
                char* why, size_t why_len);
  /* Sender thread. 1: the slot's result has landed and is written to
   * out's fp_lo, fp_hi, has_stats and stats; 0: not yet; -1: failed (why). */
  int (*poll)(void* self, uint32_t slot, opguard_tensor* out, char* why, size_t why_len);
  /* Once, when the shim is done; no call is in progress. */
  void (*close)(void* self);
} opguard_device_ops;

/* The CUDA backend's entry point: fills *ops with `slots` slots, or returns
 * nonzero with why (no driver, no device). */
typedef int (*opguard_device_open_fn)(uint32_t slots, opguard_device_ops* ops, char* why,
                                      size_t why_len);
#define OPGUARD_DEVICE_OPEN_SYMBOL "opguard_shim_cuda_open"

#ifdef __cplusplus
}
#endif

#endif /* OPGUARD_SHIM_DEVICE_OPS_H_ */
