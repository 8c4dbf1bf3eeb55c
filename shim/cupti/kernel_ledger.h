// The kernel ledger: which device kernels each recorded op launched, in
// launch order, built from CUPTI activity records (docs/kernels.md).
//
// Pure logic, no CUPTI calls: CuptiSession (cupti_session.h) feeds it the
// records CUPTI delivers; tests feed it records built from the real
// cupti_activity.h structs.
//
// How a kernel finds its op. Around each op the training thread pushes the
// op's key as a CUPTI external correlation id (kind CUSTOM2; torch's own
// profiler uses CUSTOM0 and CUSTOM1). CUPTI then emits, for each CUDA API call
// made inside the op, an ExternalCorrelation record {key, correlationId}; a
// kernel record carries the correlationId of the API call that launched it.
// The ledger joins the two on correlationId, whichever arrives first.
//
// When an op's list is final. CUPTI writes an op's API and external records
// before the launching calls return, and its kernel records no later than the
// kernels' completion. So once (1) the op's GPU work is known to have
// completed (the caller saw an event recorded after the op complete) and
// (2) a flush that *started after* that has been delivered, every record of
// the op has arrived. GpuWorkDone() marks (1); FlushStarted()/FlushDelivered()
// bracket each flush; KernelsFor() answers kReady only when both hold.
// Flushes must be forced (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED): a default flush
// holds back any buffer that also contains a record of a kernel still
// running, which may hold a finished op's kernels too.
//
// Threads: OnRecord runs on whichever thread CUPTI delivers buffers on (its
// own, or the flushing thread inside cuptiActivityFlushAll); everything else
// on the caller's thread (the shim's sender thread). One mutex guards the
// state; the training thread never touches the ledger.
//
// Failure: on CUPTI-reported dropped records, or when more ops are open than
// kMaxOpenOps (a caller that never finalises), the ledger turns itself off:
// every op not already final answers kUnavailable, and off() is true so the
// session can stop CUPTI. It never throws (allocation failure included: the
// session catches and turns off).
#pragma once

#include <cupti_activity.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace opguard::shim::cupti {

// The external correlation kind the shim pushes its op keys under.
inline constexpr CUpti_ExternalCorrelationKind kOpCorrelationKind =
    CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;

// An op's key: lane (< 4096) in the top 12 bits, op index (< 2^52) below.
// Any caller-chosen 64-bit value that names one op of the process works; this
// is the one for callers that know the op's lane and index when it starts.
constexpr uint64_t OpKey(uint32_t lane, uint64_t op_index) {
  return (uint64_t{lane} << 52) | (op_index & ((uint64_t{1} << 52) - 1));
}

enum class KernelsState : uint8_t {
  kPending,      // not final yet: GPU work not done, or no flush since
  kReady,        // final: `names` is every kernel the op launched, in launch order
  kUnavailable,  // never final: attribution turned off (dropped records, overload)
};

struct KernelList {
  KernelsState state = KernelsState::kPending;
  // Demangled where the name demangles (C++ kernels), else as CUPTI gives it;
  // valid until the ledger is destroyed.
  std::vector<std::string_view> names;
};

struct LedgerCounters {
  uint64_t kernels = 0;          // kernel records attributed to an op
  uint64_t unattributed = 0;     // kernel records with no op (launched outside any op)
  uint64_t ops_ready = 0;        // KernelsFor answers kReady handed out
  uint64_t ops_unavailable = 0;  // ops that became kUnavailable
  uint64_t flushes = 0;          // flushes delivered
  uint64_t dropped_records = 0;  // CUPTI's count of records it had no buffer for
};

class KernelLedger {
 public:
  // More ops open at once than this means the caller does not finalise them
  // (or the GPU is hopelessly behind): the ledger turns off.
  static constexpr size_t kMaxOpenOps = 1 << 18;
  // Kernel names longer than this demangled are kept mangled (shorter), and
  // any name is cut to kMaxNameBytes: the daemon refuses texts over 64 KiB.
  static constexpr size_t kMaxDemangledBytes = 4096;
  static constexpr size_t kMaxNameBytes = 16384;

  KernelLedger() = default;
  KernelLedger(const KernelLedger&) = delete;
  KernelLedger& operator=(const KernelLedger&) = delete;

  // CUPTI's delivery thread: one record of a delivered buffer. Kinds other
  // than CONCURRENT_KERNEL/KERNEL and EXTERNAL_CORRELATION are ignored, as are
  // external ids of other kinds. Reads only the kernel record fields shared by
  // every record version since CUpti_ActivityKernel4 (correlationId, name).
  void OnRecord(const CUpti_Activity* record);

  // Caller's thread: the op's GPU work has completed.
  void GpuWorkDone(uint64_t key);
  // Caller's thread, one flush at a time: before cuptiActivityFlushAll, and
  // after it returned with CUPTI's dropped-record count since the last call.
  void FlushStarted();
  void FlushDelivered(size_t dropped_records);

  // Caller's thread. kReady hands the list out and forgets the op; asking
  // again answers kPending (as for any op the ledger has not seen).
  KernelList KernelsFor(uint64_t key);
  // The caller will not ask for this op (its record was dropped).
  void Forget(uint64_t key);

  // True once the ledger turned itself off; `why` says why (one line).
  bool off() const;
  std::string off_reason() const;
  // Called by the session when it fails: every open op becomes unavailable.
  void TurnOff(std::string why);
  LedgerCounters counters() const;
  // Ops done and waiting for a flush: the caller should flush soon.
  bool waiting_for_flush() const;

 private:
  struct Launch {
    uint32_t correlation_id;
    const std::string* name;
  };
  struct OpEntry {
    std::vector<Launch> launches;
    std::vector<uint32_t> correlation_ids;  // its ExternalCorrelation records
    bool done = false;
    bool lost = false;        // attribution turned off before it was final
    uint64_t done_after = 0;  // flushes_started_ when GpuWorkDone was called
  };
  struct Orphan {
    const std::string* name;
    uint64_t seen_at_flush;  // flushes_delivered_ when it arrived
  };

  // Under mu_.
  const std::string* NameLocked(const char* cupti_name);
  void AttachLocked(uint64_t key, uint32_t correlation_id, const std::string* name);
  void EraseLocked(uint64_t key, OpEntry& op);
  void TurnOffLocked(std::string why);
  bool FinalLocked(const OpEntry& op) const { return op.done && flushes_delivered_ > op.done_after; }

  mutable std::mutex mu_;
  std::unordered_map<uint64_t, OpEntry> ops_;
  std::unordered_map<uint32_t, uint64_t> key_by_correlation_;
  // Kernel records whose ExternalCorrelation record has not arrived (yet:
  // CUPTI may deliver them in either order within a flush).
  std::unordered_map<uint32_t, Orphan> orphans_;
  // CUPTI gives each kernel's name as one shared pointer; the cache keeps the
  // text it pointed to (checked on every hit) and the name the ledger reports.
  struct CachedName {
    std::string cupti;
    std::string reported;
  };
  std::unordered_map<const char*, std::unique_ptr<CachedName>> names_;
  // Entries replaced because their pointer now holds another name: kept
  // alive, ops may still point at them.
  std::vector<std::unique_ptr<CachedName>> retired_names_;
  uint64_t flushes_started_ = 0;
  uint64_t flushes_delivered_ = 0;
  uint64_t waiting_ = 0;  // ops done, not yet final
  bool off_ = false;
  std::string off_reason_;
  LedgerCounters counters_;
};

// The name a kernel is reported by: demangled when `mangled` is an Itanium
// C++ name whose demangled form fits kMaxDemangledBytes, else as given; at
// most kMaxNameBytes.
std::string ReportedKernelName(const char* mangled);

}  // namespace opguard::shim::cupti
