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
// batch. At most kMaxRanges ranges are kept, and nothing is ever given up: a
// seq that would need one more range is not applied (CanMark), its batch is
// answered "retry later" and the sender sends it again, by then next to a
// range (docs/daemon.md, "The ingest contract").
struct SessionState {
  static constexpr size_t kMaxRanges = 64;

  uint64_t contiguous = 0;             // every seq < contiguous was applied
  std::map<uint64_t, uint64_t> above;  // applied [first, end) ranges > contiguous, apart
  uint64_t last_ns = 0;                // for dropping old sessions
  // The session was forgotten once (RankState::TrimSessions) and sent again:
  // a seq not marked may still have been applied before it was forgotten,
  // so such a batch is applied with each record checked against the store.
  bool revived = false;
  // Not persisted: the ingest commit group that last marked a seq (0: loaded
  // from the store). A session is forgotten only once that group is durable.
  uint64_t group = 0;

  bool Applied(uint64_t seq) const;
  // True when `seq` is applied or can be marked within kMaxRanges.
  bool CanMark(uint64_t seq) const;
  void Mark(uint64_t seq);
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
  // Ids of sessions forgotten by TrimSessions, oldest first: a batch of one
  // of them may be a resend of a batch already applied.
  std::vector<uint64_t> retired;
  // Retired ids were dropped too (more than kMaxRetired): any session not in
  // `sessions` may be one seen before.
  bool forgot_retired = false;

  // Keep the dedup state bounded: the most recent sessions only, and the ids
  // of the kMaxRetired sessions forgotten before them.
  static constexpr size_t kMaxSessions = 8;
  static constexpr size_t kMaxRetired = 256;
  // Forgets the least recent sessions beyond kMaxSessions whose marks are
  // durable (SessionState::group <= durable_group).
  void TrimSessions(uint64_t durable_group);
  // A session not in `sessions` that may have been applied before.
  bool MaybeSeen(uint64_t session) const;
  // The state of `session` for a batch about to be marked: a new one, or
  // one brought back from `retired` (revived).
  SessionState& Session(uint64_t session);
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
