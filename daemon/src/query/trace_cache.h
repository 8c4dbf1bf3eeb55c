// Rank traces kept between queries (docs/daemon.md, "Query speed").
//
// Reading a rank's trace (scan the stored event cores, or decompress, verify
// and reduce every record of a value without them: trace_source.h) is most of
// a first diff's time; the alignment itself is 10-15% of it. People ask about the same runs again and again (a diff, the
// viewer's alignment of the same ranks, a diff against another reference), so
// the traces read last are kept, up to query.trace_cache_bytes, least
// recently used dropped first.
//
// An entry is the trace of (run id, rank) with its collectives, stamped with
// the rank's batch count in the registry when the query began. The registry
// counts a batch only once it is durable (ingest publishes after the commit),
// so a scan made after reading the stamp holds at least the stamped batches;
// a rank that received a batch since has a new count and is read again. Run
// ids are never reused, so a removed run's entries are only dropped (Forget)
// to free their memory.
//
// Thread-safe. Private to the query room.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "opguard/aligner/trace.h"
#include "opguard/common/cancel.h"
#include "opguard/common/status.h"
#include "query/trace_source.h"
#include "registry/run_state.h"
#include "storage/store.h"

namespace opguard::daemon {

using SharedTrace = std::shared_ptr<const aligner::RankTrace>;

class TraceCache {
 public:
  explicit TraceCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  SharedTrace Find(uint64_t run, uint32_t rank, uint64_t stamp);
  // Keeps `trace` unless it alone exceeds the budget.
  void Put(uint64_t run, uint32_t rank, uint64_t stamp, SharedTrace trace);
  void Forget(uint64_t run);
  uint64_t bytes() const;

  // Memory a trace holds (vector capacities).
  static uint64_t BytesOf(const aligner::RankTrace& trace);

 private:
  struct Entry {
    uint64_t run;
    uint32_t rank;
    uint64_t stamp;
    uint64_t bytes;
    SharedTrace trace;
  };
  void EvictTo(uint64_t budget);  // under mu_

  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t bytes_ = 0;
};

// What one query reads of one run: the traces of its ranks through the cache,
// and the run's details (pivot lookups) and strings for the report. The
// run's collectives are read once, on the first rank not in the cache.
// One thread at a time per object; different objects may load in parallel.
class RunReader {
 public:
  RunReader(const Store* store, const RunState& run, TraceCache* cache);

  // Ops, op gaps and collectives of `rank`.
  Result<SharedTrace> Rank(uint32_t rank, const CancelToken* cancel);

  StoreDetails& details() { return details_; }
  StoreStrings& strings() { return strings_; }

 private:
  const Store* store_;
  const RunState run_;
  TraceCache* cache_;
  StoreDetails details_;
  StoreStrings strings_;
  bool collectives_loaded_ = false;
  std::map<uint32_t, std::vector<aligner::CollectiveEvent>> collectives_;
};

}  // namespace opguard::daemon
