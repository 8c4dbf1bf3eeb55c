// The run registry: the durable state of every run, the one copy the read
// side (queries, cluster fan-out, HTTP, retention) sees. Ingest publishes
// into it after each group commit, so a reader never sees a run, rank or
// counter that is not on disk yet.
//
// RunWriter is what the read side may ask of the write pipeline without
// depending on it: Ingest implements it, daemon.cc wires the two together.
//
// May be included by every room of the daemon (it depends on run_state.h only).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "opguard/common/status.h"
#include "registry/run_state.h"

namespace opguard::daemon {

// What one group commit changed in a run: its metadata (a run without
// ranks) when that changed or the run is new, and the ranks it touched. A
// group publishes only these, so its cost does not grow with the run.
struct RunUpdate {
  uint64_t id = 0;
  std::string name;
  std::optional<RunState> meta;
  std::vector<std::pair<uint32_t, RankState>> ranks;
};

class RunRegistry {
 public:
  // Any thread: copies of the durable state.
  std::vector<RunState> Runs() const;
  std::optional<RunState> Find(const std::string& name) const;
  size_t Count() const;

  // The durable state loaded from the store. Main thread, before ingest starts.
  void Reset(std::map<std::string, RunState> runs);
  // Once a group commit is durable: `deleted` (name, id) are removed, then
  // `updates` applied (moved from). Ingest's receiver thread only (the one
  // writer, so it may read through Writer() without a lock).
  void Publish(std::vector<RunUpdate>* updates,
               const std::vector<std::pair<std::string, uint64_t>>& deleted);
  // The published map, for the writer's own lock-free reads (see Publish).
  const std::map<std::string, RunState>& Writer() const { return runs_; }

 private:
  mutable std::shared_mutex mu_;
  std::map<std::string, RunState> runs_;
};

// Why ingest holds senders' batches back now (`opguard status`).
struct IngestPause {
  // "disk_space": the store refuses new records (batches are answered
  // "retry later"); "inflight_budget": ingest.max_inflight_bytes (or a full
  // commit group) is received and not yet durable, so the daemon stops
  // reading until the store catches up.
  std::string cause;
  std::string reason;         // one line
  int64_t since_unix_ns = 0;  // when the pause began (wall clock)
};

class RunWriter {
 public:
  virtual ~RunWriter() = default;
  // Any thread. Removes a run (records and metadata) through the write
  // pipeline, so it is ordered with ingest; returns once the deletion is durable.
  virtual Status DeleteRun(const std::string& name, std::chrono::milliseconds timeout) = 0;
  // Any thread. A store write failed: the registry no longer follows what
  // senders send (the daemon exits and is restarted).
  virtual bool Failed() const = 0;
  // Any thread. The pauses in force now (empty: batches are taken).
  virtual std::vector<IngestPause> Pauses() const = 0;
};

}  // namespace opguard::daemon
