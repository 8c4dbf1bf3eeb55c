// What the daemon knows about each run and rank: plain values, no locking.
// Ingest keeps a working copy (ahead of the disk by at most one group
// commit) and publishes the durable state to the RunRegistry
// (run_registry.h); the storage room persists them in the meta column
// family (storage/meta_values.h), in the same WriteBatch as the records they
// count, so counters and data can never disagree after a crash.
//
// May be included by every room of the daemon: it depends on nothing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace opguard::daemon {

// Which batches of one shim session have been applied: a contiguous prefix
// plus ranges of seqs above it. Batches usually arrive in order; a missing
// seq (a rejected batch, a run removed while its job still sends) leaves one
// range that then grows at its end, so marking and persisting stay O(1) per
// batch. At most kMaxRanges ranges are kept: beyond that the lowest gap is
// given up (its seqs count as applied), which bounds the state.
struct SessionState {
  static constexpr size_t kMaxRanges = 64;

  uint64_t contiguous = 0;             // every seq < contiguous was applied
  std::map<uint64_t, uint64_t> above;  // applied [first, end) ranges > contiguous, apart
  uint64_t last_ns = 0;                // for dropping old sessions

  bool Applied(uint64_t seq) const;
  // Returns true when marking `seq` gave up a gap (see kMaxRanges).
  bool Mark(uint64_t seq);
};

struct RankState {
  uint64_t ops = 0;
  uint64_t collectives = 0;       // completed collective records
  uint64_t steps = 0;             // step marks
  uint64_t gap_records = 0;       // op records reported missing
  uint64_t collective_gap_records = 0;  // collective records reported missing
  uint64_t gap_notices = 0;
  uint64_t batches = 0;
  uint64_t bytes = 0;             // message bytes accepted
  uint64_t first_ns = 0;          // wall clock of the first and last batch
  uint64_t last_ns = 0;
  std::string node;
  uint32_t local_rank = 0;
  uint64_t pid = 0;
  uint32_t world_size = 0;        // as this rank announced it (0: never announced)
  bool ended = false;
  std::map<uint64_t, SessionState> sessions;

  // Keep the dedup state bounded: the most recent sessions only.
  static constexpr size_t kMaxSessions = 8;
  void TrimSessions();
};

// The owner of a run whose creator is unknown: stored by an older daemon, or
// sent over a network ingest endpoint. Only such senders write into it.
inline constexpr int64_t kUnknownOwner = -1;

struct RunState {
  uint64_t id = 0;
  std::string name;
  int64_t owner_uid = kUnknownOwner;  // the uid whose batch created the run (access/access.h)
  std::string job_id;
  uint32_t world_size = 0;        // the one most ranks announced (see WorldSizeVote)
  std::string framework;
  uint64_t start_ns = 0;          // earliest announce start (or first batch)
  uint64_t created_ns = 0;
  std::vector<std::pair<std::string, std::string>> determinism, versions, environment;
  std::map<uint32_t, RankState> ranks;

  uint64_t LastNs() const;        // latest record of any rank
  // The world size announced by the most ranks; ties keep `world_size`, so a
  // first (wrong or hostile) announce is outvoted by the ranks that follow.
  uint32_t WorldSizeVote() const;
  // Bytes of the metadata the run holds (job id, framework, settings).
  uint64_t MetadataBytes() const;
};

}  // namespace opguard::daemon
