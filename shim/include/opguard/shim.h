/* OpGuard shim: the C API that framework adapters (shim/torch), the NCCL
 * interposer and opguard-loadgen call from inside a training process.
 *
 * Why C: this header is the only surface of libopguard_shim.so. It must stay
 * callable from any compiler, language and C++ standard library, so it uses
 * plain C types and exports nothing else (every other symbol is hidden).
 *
 * Stability rules (this layout is an ABI contract):
 *  - Functions are only added, never changed or removed.
 *  - Call structs that may grow (opguard_op, opguard_collective,
 *    opguard_communicator, opguard_counters) begin with `struct_size`, which
 *    the caller sets to sizeof(the struct it was compiled with). The library
 *    reads only what the caller declared and zero-fills the rest, so an old
 *    caller keeps working with a newer library and vice versa. New fields are
 *    appended at the end; a zero value always means "the old behaviour".
 *  - Element structs used in arrays (opguard_tensor, opguard_value) are
 *    frozen: growth happens by appending a new parallel array to a call struct.
 *
 * Behaviour contract (the shim lives in someone else's process):
 *  - Configuration comes from the environment only (docs/shim.md). With
 *    OPGUARD unset or 0 every call returns at once: no thread, no socket, no
 *    allocation.
 *  - Initialisation happens on the first call of any function (or explicitly
 *    with opguard_init). Invalid configuration prints one warning line and
 *    disables the shim; the host carries on.
 *  - No call throws, aborts, installs a signal handler or blocks on the
 *    network. Recording calls copy the record into a bounded in-process buffer
 *    and return; only opguard_flush and opguard_shutdown wait, and only for
 *    the time they are given.
 *  - Every function is thread-safe and may be called from any thread.
 *  - After fork() the child's shim is disabled (it never touches the parent's
 *    sockets); the parent carries on. A child that exec()s starts afresh.
 *  - At normal exit (exit(), return from main) pending records are flushed
 *    with a bounded wait (OPGUARD_FLUSH_TIMEOUT_MS).
 *  - Any internal failure is logged once and disables the shim.
 */
#ifndef OPGUARD_SHIM_H_
#define OPGUARD_SHIM_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define OPGUARD_API
#else
#define OPGUARD_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this header's API; opguard_api_version() returns the library's.
 * 2: opguard_fingerprint_host_sums, opguard_fingerprint_reshape.
 * 3: pending fingerprints (OPGUARD_TENSOR_PENDING, opguard_pending_*,
 *    opguard_fingerprint_host_async, opguard_fingerprint_device_async) and
 *    the fp_* counters.
 * 4: kernel attribution (opguard_kernels_*, opguard_op.kernels_key, the
 *    kernel_* counters).
 * 5: opguard_fingerprint_host_parallel.
 * 6: OPGUARD_OP_TRUSTED. */
#define OPGUARD_SHIM_API_VERSION 6

/* ---- return codes ------------------------------------------------------ */
#define OPGUARD_OK 0
#define OPGUARD_ERR_DISABLED (-1)    /* shim is off (not enabled, bad config, failed, forked) */
#define OPGUARD_ERR_INVALID (-2)     /* bad argument; nothing was recorded; counted */
#define OPGUARD_ERR_DROPPED (-3)     /* buffer full: record dropped, counted, gap reported */
#define OPGUARD_ERR_TIMEOUT (-4)     /* flush/shutdown deadline passed with records pending */
#define OPGUARD_ERR_UNSUPPORTED (-5) /* feature not built into this library */

/* "Let the shim choose" for op indices and collective sequence numbers. */
#define OPGUARD_AUTO UINT64_MAX

/* ---- values ------------------------------------------------------------ */
/* dtype numbering equals opguard.wire.DType (idl/common.fbs). */
enum {
  OPGUARD_DTYPE_UNKNOWN = 0,
  OPGUARD_DTYPE_FLOAT64, OPGUARD_DTYPE_FLOAT32, OPGUARD_DTYPE_FLOAT16, OPGUARD_DTYPE_BFLOAT16,
  OPGUARD_DTYPE_FLOAT8_E4M3, OPGUARD_DTYPE_FLOAT8_E5M2,
  OPGUARD_DTYPE_INT64, OPGUARD_DTYPE_INT32, OPGUARD_DTYPE_INT16, OPGUARD_DTYPE_INT8,
  OPGUARD_DTYPE_UINT8, OPGUARD_DTYPE_BOOL,
  OPGUARD_DTYPE_UINT16, OPGUARD_DTYPE_UINT32, OPGUARD_DTYPE_UINT64,
  OPGUARD_DTYPE_COMPLEX64, OPGUARD_DTYPE_COMPLEX128
};

typedef struct opguard_tensor_stats {
  uint64_t nan_count;
  uint64_t inf_count;
  double min;
  double max;
  double sum;
  double l2;
} opguard_tensor_stats;

/* A tensor by its fingerprint (frozen layout). `shape` is read during the
 * call only. */
typedef struct opguard_tensor {
  uint64_t fp_lo;              /* digest bytes 0..7, little-endian */
  uint64_t fp_hi;              /* digest bytes 8..15, little-endian */
  const int64_t* shape;
  uint32_t ndim;
  uint8_t dtype;               /* OPGUARD_DTYPE_* */
  uint8_t has_stats;           /* 1: `stats` is meaningful */
  int16_t device;              /* -1 host, else device ordinal */
  opguard_tensor_stats stats;
} opguard_tensor;

enum { OPGUARD_VALUE_NONE = 0, OPGUARD_VALUE_TENSOR, OPGUARD_VALUE_SCALAR, OPGUARD_VALUE_TENSOR_LIST };

/* One op input (frozen layout): a tensor, a scalar as its raw bits (float 3.0
 * -> 0x40400000 with scalar_dtype FLOAT32, int 7 -> 7, bool -> 0/1), or a
 * list of tensors. */
typedef struct opguard_value {
  uint8_t kind;                /* OPGUARD_VALUE_* */
  uint8_t scalar_dtype;
  uint16_t reserved;
  uint32_t num_tensors;        /* TENSOR_LIST */
  uint64_t scalar_bits;        /* SCALAR */
  opguard_tensor tensor;       /* TENSOR */
  const opguard_tensor* tensors; /* TENSOR_LIST */
} opguard_value;

/* ---- lifecycle ----------------------------------------------------------- */
OPGUARD_API int opguard_api_version(void);
/* Reads the environment and starts the background sender if OPGUARD=1.
 * Idempotent. Returns 1 if recording, 0 if not. Any call initialises on its
 * own; call this early only to fail fast or to print the run name early. */
OPGUARD_API int opguard_init(void);
/* 1 while records are being accepted. Cheap (one atomic load after init). */
OPGUARD_API int opguard_enabled(void);
/* Run name and identity as configured (empty string / 0 when disabled). The
 * string lives until process exit. */
OPGUARD_API const char* opguard_run_name(void);
OPGUARD_API uint32_t opguard_rank(void);
OPGUARD_API uint32_t opguard_world_size(void);
/* Sends everything recorded so far and waits up to timeout_ms for the daemon
 * to acknowledge it. OPGUARD_OK once nothing is pending, else TIMEOUT. */
OPGUARD_API int opguard_flush(uint32_t timeout_ms);
/* Marks the rank's run as finished (end_of_run), flushes with a bounded wait
 * and stops the sender. Later calls return OPGUARD_ERR_DISABLED. Called
 * automatically at normal exit with OPGUARD_FLUSH_TIMEOUT_MS. */
OPGUARD_API int opguard_shutdown(uint32_t timeout_ms);

/* ---- run metadata (goes into RunAnnounce) ------------------------------- */
enum {
  OPGUARD_INFO_FRAMEWORK = 1,  /* value: "pytorch", "loadgen", ...; key ignored */
  OPGUARD_INFO_JOB_ID = 2,     /* value: scheduler job id; key ignored */
  OPGUARD_INFO_VERSION = 3,    /* key: library, value: version */
  OPGUARD_INFO_DETERMINISM = 4,/* key: setting, value: what was applied */
  OPGUARD_INFO_ENVIRONMENT = 5 /* key: variable, value: its value */
};
/* Call before recording ops: the announcement rides in the first batch.
 * Later changes are re-announced in the next batch (the daemon merges).
 * key and value must be UTF-8 (convert Latin-1 paths first): otherwise
 * OPGUARD_ERR_INVALID and nothing is recorded, since the daemon would refuse
 * every batch carrying them. Unknown kind, or an empty key where one is
 * needed: OPGUARD_ERR_INVALID too. */
OPGUARD_API int opguard_set_run_info(int kind, const char* key, const char* value);

/* ---- interning ------------------------------------------------------------ */
/* Text that is not UTF-8 (a Latin-1 path, say) is repaired first, here and in
 * every string argument below: each byte outside a well-formed sequence
 * becomes the four characters \xNN, and ids are those of the repaired text.
 * (opguard_set_run_info alone refuses such text instead.)
 * Returns XXH64(text, seed 0), the string's id on the wire, and makes sure the
 * daemon receives its text once per run and rank before any record using it.
 * Returns the id even when disabled (pure function), 0 for NULL. Callers on a
 * hot path should cache ids. */
OPGUARD_API uint64_t opguard_intern(const char* text, size_t len);
/* Site id = XXH64 over "file:line:function"; interns file and function. */
OPGUARD_API uint64_t opguard_site(const char* file, uint32_t line, const char* function);
/* Sends a source file once per run and path. content == NULL: the background
 * thread reads `path` itself (up to OPGUARD_MAX_SOURCE_KB). Returns the path's
 * string id. */
OPGUARD_API uint64_t opguard_source_file(const char* path, const void* content, size_t len);

/* ---- op records ------------------------------------------------------------ */
enum {
  OPGUARD_OP_BACKWARD = 1u << 0,         /* recorded during backward */
  OPGUARD_OP_NONDETERMINISTIC = 1u << 1, /* preflight verdict */
  OPGUARD_OP_HAS_SEQ_NR = 1u << 2,       /* seq_nr is valid */
  OPGUARD_OP_EXPLICIT_STEP = 1u << 3,   /* use `step` instead of the current step */
  OPGUARD_OP_REPLICATED = 1u << 4,       /* data-parallel replicas must agree on
                                          * its bits (e.g. the optimizer's step) */
  OPGUARD_OP_TRUSTED = 1u << 5           /* API 6, trusted mode: recorded without
                                          * fingerprints (its tensors' fp_* and
                                          * stats are not read); never compared */
};

typedef struct opguard_op {
  uint32_t struct_size;        /* sizeof(opguard_op) */
  uint32_t lane;               /* per-thread/stream lane, < 4096 */
  /* OPGUARD_AUTO: the shim assigns the lane's next index (0, 1, 2, ... per
   * lane, in call order; dropped records consume theirs). Explicit indices
   * must be strictly increasing per lane. */
  uint64_t op_index;
  uint64_t step;               /* with OPGUARD_OP_EXPLICIT_STEP */
  uint64_t name;               /* string id (opguard_intern), e.g. "aten::linear" */
  uint64_t site;               /* site id (opguard_site), 0 unknown */
  int64_t seq_nr;              /* autograd sequence number, with OPGUARD_OP_HAS_SEQ_NR */
  uint32_t flags;              /* OPGUARD_OP_* */
  uint32_t num_inputs;
  const opguard_value* inputs;
  uint32_t num_outputs;
  uint32_t num_kernels;
  const opguard_tensor* outputs;
  const uint64_t* kernels;     /* string ids of kernel names */
  uint64_t start_ns;           /* wall clock; 0: the shim stamps the call time (coarse, ~ms) */
  uint64_t duration_ns;
  /* A backward op with a site of its own (a custom Function's backward, a
   * recompute): the site of the forward call that created its autograd node,
   * shown as context in reports; 0 none. Added after duration_ns: callers
   * built against an older shim.h (smaller struct_size) send 0. */
  uint64_t forward_site;
  /* API 4: the key opguard_kernels_begin gave for this op (0 none). The
   * shim appends the names of the kernels launched between begin and end
   * to `kernels`, in launch order, once the op's device work has completed
   * (the record is held until then, like one with a pending fingerprint). */
  uint64_t kernels_key;
} opguard_op;

/* Copies the record (all pointed-to data) into the buffer and returns.
 * op_index_out (may be NULL) receives the op index the record carries, also
 * when it was dropped. Returns OK, DISABLED, INVALID or DROPPED. */
OPGUARD_API int opguard_record_op(const opguard_op* op, uint64_t* op_index_out);

/* The lane's next op index: the number of indices used on it so far. */
OPGUARD_API uint64_t opguard_lane_position(uint32_t lane);

/* Starts step `step`: later ops without OPGUARD_OP_EXPLICIT_STEP carry it, and
 * a StepMark records the lane's next op index. */
OPGUARD_API int opguard_mark_step(uint32_t lane, uint64_t step);

/* Reserves `count` op indices on `lane` that the caller could not record (for
 * example a fingerprint it could not take) and tells the daemon they are
 * missing. first_op_out receives the first reserved index. */
OPGUARD_API int opguard_report_gap(uint32_t lane, uint64_t count, const char* reason,
                                   uint64_t* first_op_out);

/* ---- collectives ----------------------------------------------------------- */
typedef struct opguard_communicator {
  uint32_t struct_size;
  uint32_t size;               /* members */
  uint64_t id;                 /* 0: XXH64 over name then ranks (same on every member) */
  const char* name;            /* e.g. "world", "tp0" */
  const uint32_t* ranks;       /* global rank of each member, by rank in communicator; may be NULL */
} opguard_communicator;

/* Defines a communicator once per run and rank; returns its id (0 on error). */
OPGUARD_API uint64_t opguard_communicator_define(const opguard_communicator* comm);

enum { OPGUARD_PHASE_COMPLETED = 0, OPGUARD_PHASE_ENTERED = 1 };
/* Numbering equals opguard.wire.CollectiveKind. */
enum {
  OPGUARD_COLL_UNKNOWN = 0, OPGUARD_COLL_ALL_REDUCE, OPGUARD_COLL_BROADCAST, OPGUARD_COLL_REDUCE,
  OPGUARD_COLL_ALL_GATHER, OPGUARD_COLL_REDUCE_SCATTER, OPGUARD_COLL_ALL_TO_ALL, OPGUARD_COLL_SEND,
  OPGUARD_COLL_RECV, OPGUARD_COLL_BARRIER, OPGUARD_COLL_GATHER, OPGUARD_COLL_SCATTER
};

typedef struct opguard_collective {
  uint32_t struct_size;        /* sizeof(opguard_collective) */
  uint8_t phase;               /* OPGUARD_PHASE_*: Entered at launch, Completed after the work finished */
  uint8_t kind;                /* OPGUARD_COLL_* */
  uint8_t dtype;               /* OPGUARD_DTYPE_* */
  uint8_t reduce_op;           /* 0 sum, 1 prod, 2 max, 3 min, 4 avg, 255 none */
  uint64_t communicator;       /* id from opguard_communicator_define */
  /* Per communicator from 0. OPGUARD_AUTO with phase ENTERED: the shim
   * assigns the communicator's next number (returned in seq_out); COMPLETED
   * must repeat the number of its ENTERED record. */
  uint64_t seq;
  uint64_t count;              /* elements per rank */
  int32_t root;                /* root/peer rank in the communicator, -1 none */
  uint32_t lane;
  /* OPGUARD_AUTO: opguard_lane_position(lane), i.e. ops with a smaller index
   * on that lane were issued before this collective. */
  uint64_t op_index;
  uint64_t step;               /* OPGUARD_AUTO: current step */
  uint64_t site;
  uint32_t num_inputs;
  uint32_t num_outputs;
  const opguard_tensor* inputs;
  const opguard_tensor* outputs; /* Completed only: fingerprints taken after completion */
  uint64_t time_ns;            /* 0: the shim stamps the call time (coarse, ~ms) */
} opguard_collective;

OPGUARD_API int opguard_record_collective(const opguard_collective* coll, uint64_t* seq_out);

/* ---- counters --------------------------------------------------------------- */
typedef struct opguard_counters {
  uint32_t struct_size;        /* sizeof(opguard_counters) */
  uint32_t enabled;
  uint64_t records_enqueued;   /* ops + collectives accepted into the buffer */
  uint64_t records_dropped;    /* buffer full (each covered by a gap notice) */
  uint64_t records_invalid;    /* rejected arguments */
  uint64_t records_sent;       /* first transmissions */
  uint64_t records_acked;      /* acknowledged durable by the daemon */
  uint64_t records_rejected;   /* in batches the daemon rejected */
  uint64_t batches_sent;
  uint64_t batches_acked;
  uint64_t batches_resent;
  uint64_t batches_rejected;
  uint64_t gaps_reported;      /* gap notices queued (shim drops + opguard_report_gap) */
  uint64_t ops_missing;        /* op indices covered by gap notices */
  uint64_t bytes_sent;
  uint64_t buffered_bytes;     /* staged + unacknowledged, now */
  uint64_t pending_batches;    /* unacknowledged, now */
  /* API 3: pending fingerprints. */
  uint64_t fp_pending;         /* submitted and not yet resolved, now */
  uint64_t fp_resolved;        /* resolved with a fingerprint */
  uint64_t fp_failed;          /* failed (no device, capture, error, limit, shutdown) */
  uint64_t fp_refused;         /* opguard_fingerprint_host_async at the limit */
  uint64_t records_held;       /* records waiting for a fingerprint, now */
  /* API 4: kernel attribution. */
  uint64_t kernel_names;             /* kernel names appended to op records */
  uint64_t kernel_lists_unavailable; /* ops sent without their names (attribution off, shutdown) */
  uint64_t kernel_lists_cut;         /* ops that launched more kernels than a record keeps (4096) */
} opguard_counters;

/* Fills min(out->struct_size, sizeof) bytes; works (zeros) when disabled. */
OPGUARD_API int opguard_get_counters(opguard_counters* out);

/* ---- fingerprint helper ------------------------------------------------------- */
/* Fingerprints a host buffer with the OpGuard fingerprint (docs/fingerprint.md)
 * on the calling thread and fills `out` (fingerprint, stats, dtype; shape
 * points to `shape`). strides in elements, NULL for C-contiguous. Works
 * whether or not recording is enabled. */
OPGUARD_API int opguard_fingerprint_host(const void* data, uint8_t dtype, const int64_t* shape,
                                         uint32_t ndim, const int64_t* strides, opguard_tensor* out);

/* The two sums over a tensor's logical bytes that its fingerprint finalizes
 * with its dtype and shape (opaque to callers). */
typedef struct opguard_byte_sums {
  uint64_t a0;
  uint64_t a1;
} opguard_byte_sums;

/* opguard_fingerprint_host that also fills `sums` (may be NULL). */
OPGUARD_API int opguard_fingerprint_host_sums(const void* data, uint8_t dtype,
                                              const int64_t* shape, uint32_t ndim,
                                              const int64_t* strides, opguard_tensor* out,
                                              opguard_byte_sums* sums);

/* A caller's thread pool: runs task(task_ctx, i) for every i in [0, tasks),
 * in any order and on any of its threads, and returns once all have
 * returned. */
typedef void (*opguard_parallel_for)(void* pool_ctx, int tasks,
                                     void (*task)(void* task_ctx, int index), void* task_ctx);

/* opguard_fingerprint_host_sums with the tensor split into at most `tasks`
 * shares that `pool` runs (a framework's intra-op pool, idle while the
 * calling thread fingerprints); the same result whatever the split. Since
 * API 5. */
OPGUARD_API int opguard_fingerprint_host_parallel(const void* data, uint8_t dtype,
                                                  const int64_t* shape, uint32_t ndim,
                                                  const int64_t* strides, int tasks,
                                                  opguard_parallel_for pool, void* pool_ctx,
                                                  opguard_tensor* out, opguard_byte_sums* sums);

/* The fingerprint of the same bytes under another shape of the same dtype
 * (a reshape or view of a contiguous tensor, whose statistics are also the
 * same): sets out's fp_lo, fp_hi, dtype, shape and ndim from `sums` and
 * leaves its other fields as they are. The caller vouches that the bytes
 * are those `sums` came from (same dtype, same byte length). */
OPGUARD_API int opguard_fingerprint_reshape(const opguard_byte_sums* sums, uint8_t dtype,
                                            const int64_t* shape, uint32_t ndim,
                                            opguard_tensor* out);

/* ---- pending fingerprints (API 3) ------------------------------------------
 * A fingerprint may be computed after the op is recorded: off the calling
 * thread (large host tensors) or on a device stream after the op's kernels.
 * The caller gets a handle, puts it into an opguard_tensor with the pending
 * marker, and records the op or collective at once as usual. The shim holds
 * that record (and every op, collective, step mark and gap recorded after it,
 * so the daemon still sees each lane in index order) until each of its
 * fingerprints is resolved, then sends it with the bits filled in.
 *
 * The marker: has_stats == OPGUARD_TENSOR_PENDING, fp_hi == OPGUARD_PENDING_TAG
 * and fp_lo == the handle; dtype, shape, ndim and device are the caller's as
 * always. Callers built against API 2 never produce it (they set has_stats to
 * 0 or 1). A library older than API 3 would record the marker as bits, so
 * callers use pending fingerprints only when opguard_api_version() >= 3.
 *
 * A fingerprint that fails (no device, CUDA graph capture, an error, the
 * pending limit, shutdown) never fails the host: the op that references it is
 * sent as a gap notice for its op index (a collective: a collective gap) whose
 * reason starts with "missing fingerprint: ". A handle stays usable for more
 * records after it resolves, until OPGUARD_MAX_PENDING_FP newer handles have
 * resolved; a record that references a handle so old (or never issued) is a
 * gap with reason "missing fingerprint: unknown handle".
 *
 * Memory is bounded: at most OPGUARD_MAX_PENDING_FP (default 4096)
 * fingerprints are unresolved at once, and held records count against
 * OPGUARD_BUFFER_MB like staged ones. No call waits for a fingerprint. */
#define OPGUARD_TENSOR_PENDING 0x50u
#define OPGUARD_PENDING_TAG 0x676e69646e65506full /* "oPending" */

/* Marks `t` as the pending fingerprint `handle` (a helper for the three
 * fields above). */
static inline void opguard_tensor_set_pending(opguard_tensor* t, uint64_t handle) {
  t->fp_lo = handle;
  t->fp_hi = OPGUARD_PENDING_TAG;
  t->has_stats = OPGUARD_TENSOR_PENDING;
}

/* A fingerprint the caller computes itself (its own device work): begin
 * returns a handle (never 0) in *handle_out; exactly one of resolve (with
 * fp_lo, fp_hi, has_stats and stats of `result`) or fail must follow, from
 * any thread. OK, DISABLED, INVALID, or DROPPED when OPGUARD_MAX_PENDING_FP
 * fingerprints are already unresolved (no handle; counted in fp_refused). */
OPGUARD_API int opguard_pending_begin(uint64_t* handle_out);
OPGUARD_API int opguard_pending_resolve(uint64_t handle, const opguard_tensor* result);
OPGUARD_API int opguard_pending_fail(uint64_t handle, const char* reason);

/* Called once by the shim when it no longer needs the bytes it was given. */
typedef void (*opguard_release_fn)(void* context);

/* Fingerprints a host buffer on the shim's fingerprint thread (same bits as
 * opguard_fingerprint_host) and fills `out` with the pending marker, shape
 * (the caller's pointer, read during the call only), ndim, dtype and device
 * -1. The bytes must stay unchanged until `release(release_context)` is
 * called (any thread, exactly once, after they were read). On anything but
 * OPGUARD_OK nothing was taken: release is not called and `out` is
 * untouched; DROPPED means the pending limit was reached (counted in
 * fp_refused): fingerprint inline instead, which bounds the caller's wait by
 * one tensor's hash. release may be NULL. */
OPGUARD_API int opguard_fingerprint_host_async(const void* data, uint8_t dtype,
                                               const int64_t* shape, uint32_t ndim,
                                               const int64_t* strides,
                                               opguard_release_fn release,
                                               void* release_context, opguard_tensor* out);

/* Enqueues the fingerprint of device memory on `stream` (a cudaStream_t;
 * NULL is the legacy default stream) of device `device`, behind the work
 * already on it, and fills `out` like opguard_fingerprint_host_async (device
 * = `device`). Nothing synchronises the device or the stream: the result is
 * copied to pinned host memory behind the fingerprint and harvested by the
 * shim's sender thread when its event has completed. Stream order makes the
 * kernel read the op's result before the caching allocator can hand the
 * memory to later work on that stream. `strides` must be NULL or
 * C-contiguous (make a strided tensor contiguous on the same stream first).
 *
 * Returns OK whenever the shim is on and the arguments are valid; the
 * handle then either resolves or fails, and a failure becomes a gap with
 * its reason: "no CUDA device" (no driver, no backend library: logged once),
 * "cuda graph capture" (the stream is capturing: nothing is enqueued into
 * the graph), "pending fingerprint limit", "non-contiguous device tensor",
 * or the CUDA error. Otherwise DISABLED or INVALID with `out` untouched. */
OPGUARD_API int opguard_fingerprint_device_async(const void* data, uint8_t dtype,
                                                 const int64_t* shape, uint32_t ndim,
                                                 const int64_t* strides, int device,
                                                 void* stream, opguard_tensor* out);

/* ---- kernel attribution (API 4) ---------------------------------------------
 * With OPGUARD_KERNELS=1 each op record can carry the names of the device
 * kernels the op launched, in launch order (docs/kernels.md), from CUPTI.
 * Around the op, on the thread that runs it:
 *     uint64_t key = 0;
 *     int on = opguard_kernels_begin(&key) == OPGUARD_OK;
 *     ... the op launches its kernels ...
 *     if (on) opguard_kernels_end(key);
 *     op.kernels_key = key; opguard_record_op(&op, NULL);   (or discard)
 * Begin after the op's inputs were fingerprinted and end before its outputs
 * are: kernels launched in between are the op's (nested begins: the
 * innermost). begin returns OPGUARD_ERR_UNSUPPORTED (no key; do not call
 * end) when kernel names are not recorded: OPGUARD_KERNELS unset, no CUPTI,
 * no CUDA driver (logged once), or attribution turned off after a failure.
 * Neither call waits. */
OPGUARD_API int opguard_kernels_begin(uint64_t* key_out);
OPGUARD_API int opguard_kernels_end(uint64_t key);
/* The op of `key` is not recorded with it (the caller reports a gap or
 * nothing): the shim forgets its kernels once CUPTI delivered them. */
OPGUARD_API int opguard_kernels_discard(uint64_t key);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* OPGUARD_SHIM_H_ */
