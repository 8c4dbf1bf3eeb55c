// The ingest pipeline: shims' batches in, durable acks out.
//
//   receiver thread ("og-ingest"): owns the ROUTER socket. Verifies each
//     message, rejects bad ones at once (Rejected ack, counted by reason),
//     drops resends already applied, and appends good batches to the open
//     commit group (one RocksDB WriteBatch). Sends the acks of committed groups.
//   committer thread ("og-commit"): writes one sealed group at a time with
//     sync=true (one fsync covers every batch of the group), then hands it
//     back through an eventfd.
//
// Disk space (docs/storage.md): while the store refuses new records (free
// space below storage.reserved_bytes, storage.max_bytes reached, or RocksDB
// stopped by ENOSPC), batches are answered "retry later" and their senders
// keep them; deletions go on. A write that fails for lack of space rolls the
// working state back to the durable one; once space is back the store is
// resumed and ingest goes on, without a restart.
//
// Bounded: at most one group is being written and one is filling; when the
// two hold ingest.max_inflight_bytes of batches (or the filling group reaches
// ingest.max_group_bytes) the receiver stops reading the socket, ZeroMQ's
// queues fill to their HWM (ingest.hwm messages per sender) and the shims' own
// bounded buffers take over (they never block training).
//
// Counters and dedup state (per run, rank and shim session: which batch seqs
// were applied) are persisted in the same WriteBatch as the records, so after
// kill -9 the store and its counters agree and a resend is applied exactly once.
// Once a group is durable, the receiver publishes the runs it touched to the
// RunRegistry (what the read side sees) and only then acknowledges it.
//
// Included by daemon.cc only; the read side reaches the pipeline through
// RunWriter (registry/run_registry.h).
#pragma once

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ingest/batch_writer.h"
#include "metrics.h"
#include "opguard/daemon/config.h"
#include "registry/run_registry.h"
#include "storage/store.h"

namespace opguard::daemon {

class Ingest final : public RunWriter {
 public:
  Ingest(const Config& config, Store* store, RunRegistry* registry, Metrics* metrics,
         zmq::context_t* context);
  ~Ingest() override;

  // Loads the registry from the store (and publishes it), binds the ingest
  // endpoint and starts both threads. Main thread, once.
  Status Start();
  // Stops reading, commits and acknowledges what was received, joins the
  // threads, closes the socket. Main thread; idempotent.
  void Stop();

  // Any thread. Removes a run (records and metadata) through the pipeline,
  // so it is ordered with ingest; returns once the deletion is durable.
  Status DeleteRun(const std::string& name, std::chrono::milliseconds timeout) override;

  // Any thread. True while both threads make progress (the receiver wakes at
  // least every 100 ms; a commit taking longer than `stall` is unhealthy).
  bool Healthy(std::chrono::seconds stall) const;
  // Any thread. A store write failed: the daemon must exit (and be restarted);
  // nothing after the failure was acknowledged.
  bool Failed() const override { return failed_.load(); }
  // Any thread. Set by the receiver thread when a pause begins or ends.
  std::vector<IngestPause> Pauses() const override;

  // Called on the receiver thread after a run's deletion is durable.
  void SetOnRunDeleted(std::function<void(uint64_t run_id)> fn) { on_run_deleted_ = std::move(fn); }

 private:
  struct PendingAck;
  struct Group;
  struct DeleteRequest {
    std::string name;
    uint64_t run_id = 0;
    std::shared_ptr<std::promise<Status>> done;
  };

  void ReceiverLoop();
  bool Full() const;
  void CommitterLoop();
  void HandleMessage(std::vector<zmq::message_t>& frames);
  void Reject(PendingAck& ack, RejectReason reason, const std::string& error);
  // The store refuses new records (disk full): "retry later" (no ack to a
  // sender too old to know that answer; it resends on its ack timeout).
  // `why`: the reason given ("": the store's, full_reason_).
  void Defer(PendingAck& ack, const std::string& why = "");
  // Every few hundred ms, and after a failed write: resumes a store stopped
  // for space once there is space again, and updates full_reason_.
  void CheckSpace(int64_t now_ns, bool force);
  // A group failed for lack of space: nothing of it or of the open group
  // is acknowledged ("retry later"), and the working state goes back to the
  // durable one, so the senders' resends are applied once space is back.
  void RollBack(Group* failed);
  // Counts an exception caught while handling one message; logs once per type.
  void NoteException(const std::exception& e);
  void SendAck(PendingAck& ack, wire::AckCode code, const std::string& error);
  // The steps of one verified batch. `buffer`: the message that holds it.
  // `sender`: the sending uid (kUnknownOwner when the transport has none).
  void ApplyBatch(const uint8_t* buffer, const wire::Batch& batch, size_t bytes, int64_t sender,
                  PendingAck& ack);
  int64_t SenderUid(const zmq::message_t& message) const;
  RunState& WorkingRun(const std::string& name, uint64_t now, int64_t owner);
  std::string CheckCapacity(const wire::Batch& batch) const;
  void AckResend(const RunState& run, const wire::Batch& batch, PendingAck& ack);
  void ApplyAnnounce(const wire::RunAnnounce& a, RunState* run, RankState* rank);
  void CountBatch(const RecordCounts& records, size_t bytes, uint64_t now, const wire::Batch& batch,
                  RankState* rank);
  void HandleDeleteRequests();
  void SealAndHandOff();
  void DrainCommitted();
  void Wake();

  const Config config_;
  Store* store_;
  RunRegistry* registry_;
  Metrics* metrics_;
  zmq::context_t* context_;
  std::unique_ptr<zmq::socket_t> socket_;  // receiver thread only (after Start)
  int wake_fd_ = -1;                       // eventfd: committed groups, requests, stop

  // Receiver thread only: the working registry (ahead of disk by the open
  // and in-flight groups) and what the open group changed.
  std::map<std::string, RunState> working_;
  std::map<uint64_t, std::string> id_to_name_;
  uint64_t next_run_id_ = 1;
  uint64_t working_ranks_ = 0;  // ranks of all working runs
  std::map<uint64_t, std::set<uint32_t>> dirty_ranks_;
  std::set<uint64_t> dirty_meta_;
  std::set<std::string> exception_kinds_logged_;  // receiver thread
  bool repair_logged_ = false;                     // text repaired: logged once
  bool source_refusal_logged_ = false;             // a source over the limit: logged once
  std::unique_ptr<Group> open_;
  std::unique_ptr<Group> spare_;  // a committed group, kept for reuse
  uint64_t next_group_ = 1;       // the number the next group opened gets
  uint64_t durable_group_ = 0;    // every group up to this number is durable (or was rolled back)
  bool committer_busy_ = false;
  uint64_t committing_bytes_ = 0;  // message bytes of the group being written
  int64_t paused_since_ns_ = 0;    // when reading stopped for the budget (0: reading)
  // Why the store refuses new records ("": it takes them) and when to look again.
  std::string full_reason_;
  int64_t next_space_check_ns_ = 0;
  int64_t next_resume_log_ns_ = 0;  // a refused resume is logged at most once a minute
  BatchWriter writer_;
  const bool unix_ingest_;  // ipc:// endpoint: senders are known by uid

  // Receiver <-> committer handoff.
  std::mutex handoff_mu_;
  std::condition_variable handoff_cv_;
  std::unique_ptr<Group> to_commit_;
  std::deque<std::unique_ptr<Group>> committed_;
  bool committer_stop_ = false;

  // What Pauses() answers: the receiver sets, any thread reads.
  mutable std::mutex pauses_mu_;
  IngestPause space_pause_, budget_pause_;  // empty cause: not paused

  // Requests from other threads.
  std::mutex requests_mu_;
  std::vector<DeleteRequest> delete_requests_;

  std::function<void(uint64_t)> on_run_deleted_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> receiver_beat_ns_{0};
  std::atomic<int64_t> commit_started_ns_{0};  // 0 when idle
  std::thread receiver_, committer_;
  std::atomic<bool> started_{false};
};

}  // namespace opguard::daemon
