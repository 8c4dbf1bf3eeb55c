// The shim core: the recording side called by the C API on the host's
// threads, and the sender thread that batches, sends, resends and counts.
//
// Threads:
//  - producer calls (Record*, Intern, Site, ...) come from any host thread;
//    they take mu_ for a short copy and never wait for anything else;
//  - one sender thread ("opguard-send") owns the ZeroMQ socket, the encoder
//    and the Sender (sender.h), which holds the unacknowledged batches and
//    decides what to send and resend; this file drives it with the socket's
//    acks, the connection monitor's events and the clock;
//  - Flush/Shutdown wait on condition variables with a deadline;
//  - pending fingerprints (shim.h) resolve on the host fingerprint thread or
//    when the sender thread harvests the device backend; a record that
//    waits for one is held, with everything ordered after it, in held_;
//  - with OPGUARD_KERNELS=1 an op record that names its kernel attribution
//    key is held too, until the sender thread has its kernel names
//    (AttachKernels; docs/kernels.md).
// The object is created once per process by the C API and never destroyed
// while the process may still call it (see c_api.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <zmq.hpp>

#include "config.h"
#include "encoder.h"
#include "fp_backends.h"
#include "kernel_source.h"
#include "opguard/shim.h"
#include "pending_table.h"
#include "sender.h"
#include "staging.h"

namespace opguard::shim {

inline constexpr uint32_t kMaxLanes = 4096;

// XXH64(text, seed 0): the wire id of a string.
uint64_t StringId(std::string_view text);
// XXH64 over "file:line:function".
uint64_t SiteId(std::string_view file, uint32_t line, std::string_view function);
uint64_t WallNs();
// CLOCK_REALTIME_COARSE (a few ns instead of ~50 on a busy VM; ms resolution):
// the stamp of records whose caller passed no time. Viewer-only data.
uint64_t CoarseWallNs();

class Core final : private FpSink {
 public:
  // Creates the core and starts the sender thread; errors (socket, thread)
  // come back as a Status for the caller to log. Any thread, once.
  // `load_device` makes the device backend when the first device
  // fingerprint is asked for (nullptr and a reason when there is none);
  // empty: LoadCudaBackend.
  using DeviceLoader =
      std::function<std::unique_ptr<DeviceFingerprinter>(uint32_t slots, std::string* why)>;
  static Result<std::unique_ptr<Core>> Start(const Config& config, DeviceLoader load_device = {});
  // Stops the sender without waiting for acknowledgements; blocks only until
  // the sender's current loop turn ends.
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // True while records are accepted (not failed, not shut down, not forked).
  bool accepting() const { return accepting_.load(std::memory_order_acquire); }
  const Config& config() const { return config_; }
  uint64_t session() const { return session_; }
  // The sender's current ack timeout (OPGUARD_ACK_TIMEOUT_MS adapted to the
  // observed ack latency, before backoff). For tests and diagnostics.
  uint32_t ack_timeout_now_ms() const { return ack_timeout_now_ms_.load(std::memory_order_relaxed); }

  // ---- producer side: any thread, never blocks beyond mu_ -----------------
  int RecordOp(const opguard_op& op, uint64_t* op_index_out);
  int RecordCollective(const opguard_collective& c, uint64_t* seq_out);
  uint64_t Intern(std::string_view text);
  uint64_t Site(std::string_view file, uint32_t line, std::string_view function);
  uint64_t SourceFile(std::string_view path, const void* content, size_t len);
  uint64_t DefineCommunicator(const opguard_communicator& c);
  int MarkStep(uint32_t lane, uint64_t step);
  int ReportGap(uint32_t lane, uint64_t count, std::string_view reason, uint64_t* first_out);
  int SetRunInfo(int kind, std::string_view key, std::string_view value);
  uint64_t LanePosition(uint32_t lane);
  void GetCounters(opguard_counters* out);

  // ---- pending fingerprints (shim.h): any thread, never wait ----------------
  int PendingBegin(uint64_t* handle_out);
  int PendingResolve(uint64_t handle, const FpResult& result);
  int PendingFail(uint64_t handle, std::string_view reason);
  // Arguments already checked by the C API; `job.handle` is filled here.
  int FingerprintHostAsync(HostFingerprinter::Job job, uint64_t* handle_out);
  // Always gives a handle (OK) while accepting; failures resolve it as failed.
  int FingerprintDeviceAsync(const opguard_device_tensor& t, bool contiguous, void* stream,
                             uint64_t* handle_out);

  // ---- kernel attribution (shim.h, API 4): recording threads, never wait -----
  // OK and a key pushed on this thread; UNSUPPORTED when kernel names are
  // not recorded (OPGUARD_KERNELS unset, no CUPTI, attribution turned off).
  int KernelsBegin(uint64_t* key_out);
  void KernelsEnd(uint64_t key);
  // The op of `key` will not be recorded with it.
  void KernelsDiscard(uint64_t key);

  // ---- waiting calls: any host thread, bounded by timeout_ms --------------
  int Flush(uint32_t timeout_ms);
  // end_of_run, flush, stop the sender. Idempotent. A sender still busy at
  // the deadline (plus one loop turn of grace) is detached and ends by itself.
  int Shutdown(uint32_t timeout_ms);

  // In a forked child: stop accepting; touches no lock, socket or thread.
  void AbandonAfterFork() { accepting_.store(false, std::memory_order_release); }

 private:
  struct LaneState {
    uint64_t next_op = 0;
    bool gap_open = false;
    uint64_t gap_first = 0;
    uint64_t gap_last = 0;
    uint64_t gap_count = 0;
  };
  struct CollGap {
    uint64_t first = 0, last = 0, count = 0;
  };
  // A record (or gap, or step mark) that waits for pending fingerprints, or
  // that was made while an earlier one waits: the daemon must see each lane
  // in index order.
  struct Held {
    struct Ref {
      uint32_t offset;  // of a TensorFixed in `bytes`
      uint64_t handle;
    };
    std::vector<uint8_t> bytes;  // the whole entry, header included
    std::vector<Ref> refs;
    bool record = false;         // an op or collective (counts as a staged record)
    // An op whose kernel names it waits for (0: none). gpu_done once its
    // fingerprints settled (the device ones: an event after the op
    // completed); kernels_settled once its names are appended, or known to
    // be unavailable.
    uint64_t kernels_key = 0;
    bool gpu_done = false;
    bool kernels_settled = false;
  };
  // Kernel names of one op at most; beyond, the list is cut (and counted).
  static constexpr size_t kMaxKernelsPerOp = 4096;
  // Keys of ops not recorded, waiting to be forgotten, at most.
  static constexpr size_t kMaxDiscardedKernelKeys = 1 << 16;

  explicit Core(const Config& config);
  Status StartSender();

  // FpSink: the backends' results.
  void ResolveFp(uint64_t handle, const FpResult& result) override { (void)PendingResolve(handle, result); }
  void FailFp(uint64_t handle, std::string_view reason) override { (void)PendingFail(handle, reason); }

  // Under mu_: reserves `bytes` in staging unless the buffer is full
  // (`defer_to_cap`), writes the header and returns a writer; nullptr when
  // dropped.
  uint8_t* ReserveLocked(EntryKind kind, size_t bytes, bool subject_to_cap);
  // For entries whose order matters (ops, collectives, gaps, step marks):
  // staged directly, or held behind earlier held entries, or held because
  // it waits itself (`hold`); the header is written.
  uint8_t* ReserveOrderedLocked(EntryKind kind, size_t bytes, bool hold);
  // Bytes in staging, in flight and held: what the buffer cap limits.
  uint64_t BufferedLocked() const;
  // Moves the settled head of held_ into staging: fingerprints filled in, or
  // the record replaced by a gap when one failed.
  void ReleaseHeldLocked();
  // The state of the pending markers among `tensors`: `hold` when one is
  // unresolved; a non-empty *missing when one failed or is unknown.
  void CheckMarkersLocked(const opguard_tensor* tensors, uint32_t n, bool* hold, std::string* missing);
  // Writes t, with its resolved bits when it is a settled marker; an
  // unresolved one is left for ReleaseHeldLocked and noted in `refs`.
  void PutTensorLocked(EntryWriter& w, const opguard_tensor& t, const uint8_t* entry,
                       std::vector<Held::Ref>* refs);
  bool EmitOpGapLocked(uint32_t lane, uint64_t first, uint64_t last, uint64_t count,
                       std::string_view reason);
  void EmitCollGapLocked(uint64_t comm, uint64_t first, uint64_t last, uint64_t count,
                         std::string_view reason);
  // Fails every unresolved handle (shutdown), releasing what waited on them.
  void FailAllPendingLocked(std::string_view reason);
  void EmitGapLocked(uint32_t lane, LaneState& ls, std::string_view reason);
  uint64_t InternLocked(std::string_view text);
  // Appends `names` (interned) to the held op's kernels.
  void AppendKernelsLocked(Held& h, const std::vector<std::string_view>& names);
  void DiscardKernelsLocked(uint64_t key);
  void CloseOpenGapsLocked();
  void CountStagedRecordLocked();
  static std::vector<uint8_t> GapEntry(uint32_t lane, uint64_t first, uint64_t last, uint64_t count,
                                       std::string_view reason);
  void Wake();
  void Fail(std::string_view what);

  // ---- sender thread ---------------------------------------------------------
  void SenderMain();
  void SenderLoop();
  // Everything staged so far, encoded now (flush, stop): finishes the cut in
  // progress, cuts, encodes it all.
  void CutAndEncode(bool end_of_run);
  // Moves what is staged into spare_ for encoding; false when there is nothing
  // to send. Only when no cut is in progress.
  bool Cut(bool end_of_run);
  // Encodes up to `max_batches` more batches of the cut in progress, so that
  // a backlog is encoded a window at a time and acks are not kept waiting.
  void EncodeSome(size_t max_batches);
  void ReceiveAcks(zmq::socket_t& sock);
  // Takes the acks that arrived, then lets sender_ resend what is presumed
  // lost and send new batches while the window has room.
  void SendPending(zmq::socket_t& sock);
  // Puts one batch on the wire (first time or again) without copying it;
  // false when ZeroMQ would not take it.
  bool Transmit(zmq::socket_t& sock, const Sender::Batch& batch, bool resend);
  // Connection monitor: a lost connection loses what was in flight on it.
  void ReceiveMonitorEvents(zmq::socket_t& monitor);
  // Hands landed device results to the core; true while some are in flight.
  bool HarvestDevice();
  // Kernel names for held op records: marks the ops whose GPU work is done,
  // flushes CUPTI when one waits, appends the final lists and releases what
  // settled. True while some op waits for its names.
  bool AttachKernels();
  // Held entries released up to `target` (held_pushed_ at some moment).
  bool HeldReleasedUpTo(uint64_t target);
  uint64_t HeldPushed();
  AnnounceInfo SnapshotAnnounce();

  const Config config_;
  const uint64_t session_;
  std::atomic<bool> accepting_{true};
  std::atomic<bool> failed_{false};

  // ---- producer state, guarded by mu_ ----------------------------------------
  std::mutex mu_;
  StagingBuffer staging_;
  uint64_t staged_bytes_ = 0;
  std::unique_ptr<LaneState[]> lanes_;
  std::vector<uint32_t> lanes_with_gap_;
  std::unordered_map<uint64_t, CollGap> coll_gaps_;
  std::unordered_map<uint64_t, uint64_t> coll_next_seq_;
  std::unordered_set<uint64_t> sent_strings_, sent_sites_, sent_sources_, sent_comms_;
  uint64_t current_step_ = 0;
  uint64_t records_enqueued_ = 0, records_dropped_ = 0, records_invalid_ = 0;
  uint64_t gaps_reported_ = 0, ops_missing_ = 0;
  std::atomic<uint32_t> staged_records_{0};
  PendingTable pending_;
  std::deque<Held> held_;
  uint64_t held_bytes_ = 0;
  uint64_t held_records_ = 0;
  uint64_t held_pushed_ = 0, held_released_ = 0;  // entries ever held / released
  uint64_t fp_refused_ = 0;
  std::vector<uint64_t> handle_scratch_;
  std::vector<uint64_t> kernels_discarded_;  // KernelsDiscard, for the sender
  uint64_t kernel_names_ = 0, kernel_lists_unavailable_ = 0, kernel_lists_cut_ = 0;

  // ---- kernel attribution: set by Start, before the sender starts ------------
  std::unique_ptr<KernelSource> kernels_;
  std::atomic<uint64_t> next_kernels_key_{1};
  std::vector<uint64_t> kernel_keys_scratch_;           // sender thread only
  std::vector<uint64_t> kernels_forgetting_;            // sender thread only: discarded, done
  std::vector<std::string_view> kernel_names_scratch_;  // under mu_

  // ---- fingerprint backends --------------------------------------------------
  std::unique_ptr<HostFingerprinter> host_fp_;  // created with the core
  std::once_flag device_once_;
  DeviceLoader load_device_;                        // set by Start
  std::unique_ptr<DeviceFingerprinter> device_fp_;  // set once, under device_once_
  std::atomic<DeviceFingerprinter*> device_ready_{nullptr};

  // ---- run metadata, guarded by meta_mu_ ----------------------------------------
  std::mutex meta_mu_;
  AnnounceInfo announce_;
  bool announce_dirty_ = true;

  // ---- shared with the sender --------------------------------------------------
  std::atomic<uint64_t> unacked_bytes_{0};
  std::atomic<uint64_t> records_sent_{0}, records_acked_{0}, records_rejected_{0};
  std::atomic<uint64_t> batches_sent_{0}, batches_acked_{0}, batches_resent_{0},
      batches_rejected_{0}, bytes_sent_{0}, pending_batches_{0};
  std::atomic<uint32_t> ack_timeout_now_ms_{0};
  int wake_fd_ = -1;

  // Flush/stop requests and their completion, guarded by wait_mu_.
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  uint64_t flush_requested_ = 0;   // generation asked for
  uint64_t flush_completed_ = 0;   // generation whose batches are all settled
  bool stop_requested_ = false;
  std::chrono::steady_clock::time_point stop_deadline_{};
  bool sender_done_ = false;
  bool shutdown_clean_ = false;    // everything acknowledged when the sender stopped
  std::atomic<bool> flush_pending_{false};  // cheap check for the sender loop

  // ---- sender thread only ----------------------------------------------------------
  std::unique_ptr<zmq::context_t> ctx_;
  std::thread sender_thread_;    // joined or detached under wait_mu_ (Shutdown)
  bool sender_started_ = false;  // set once by StartSender, before the Core is shared
  BatchEncoder encoder_;
  StagingBuffer spare_;           // the cut being encoded
  bool encoding_ = false;         // a cut is in spare_, encoded up to spare_offset_
  size_t spare_offset_ = 0;
  bool spare_end_of_run_ = false;
  bool spare_announce_due_ = false;  // spare_announce_ goes into the cut's first batch
  AnnounceInfo spare_announce_;
  uint64_t next_seq_ = 0;
  Sender sender_;
  bool warned_unreachable_ = false;
  bool warned_rejected_ = false;
  bool warned_deferred_ = false;  // "retry later" from a daemon with a full disk
};

}  // namespace opguard::shim
