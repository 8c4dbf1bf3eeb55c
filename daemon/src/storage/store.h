// The RocksDB store: one database with a column family per kind of data
// (keys.h, docs/storage.md). Thread-safe as RocksDB is: the ingest committer
// writes, queries and the HTTP server read concurrently, the maintenance
// thread compacts deleted ranges.
//
// Writers fill a StoreBatch (one accessor per kind of record) and readers use
// the typed lookups and scans below; nobody outside the storage room touches
// a column-family handle or builds a key.
//
// Included by every room that reads or writes runs (ingest, query, daemon.cc,
// metrics).
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "opguard/common/status.h"
#include "opguard/daemon/config.h"
#include "registry/run_state.h"

namespace opguard::daemon {

enum class Cf : int { kOps = 0, kCollectives, kStrings, kSources, kEvents, kMeta, kCount };
inline constexpr int kCfCount = static_cast<int>(Cf::kCount);
const char* CfName(Cf cf);

// A call site as stored: string ids of its file and function, and its line.
struct SiteDef {
  uint64_t file = 0;
  uint32_t line = 0;
  uint64_t function = 0;
};

class Store;

// One atomic write (a commit group, a run's deletion). Values are stored as
// given: records are FlatBuffers roots (record_copy.h), op chunks come from
// OpChunkWriter (op_chunk.h). Not thread-safe; reusable after Clear().
class StoreBatch {
 public:
  explicit StoreBatch(const Store* store) : store_(store) {}

  void PutNextRunId(uint64_t next_id);
  void PutRunMeta(const RunState& run);  // without ranks
  void PutRank(uint64_t run, uint32_t rank, const RankState& state);
  void PutString(uint64_t run, uint64_t id, std::string_view text);
  void PutSite(uint64_t run, uint64_t id, const SiteDef& site);
  void PutCommunicator(uint64_t run, uint64_t id, std::string_view def);
  void PutOpChunk(uint64_t run, uint32_t rank, uint32_t lane, uint64_t last_op, std::string_view chunk);
  void PutCollective(uint64_t run, uint32_t rank, uint64_t communicator, uint64_t seq, uint8_t phase,
                     std::string_view record);
  void PutStep(uint64_t run, uint32_t rank, uint32_t lane, uint64_t step, uint64_t op_index,
               uint64_t time_ns);
  void PutOpGap(uint64_t run, uint32_t rank, uint32_t lane, uint64_t first_op, std::string_view notice);
  void PutCollectiveGap(uint64_t run, uint32_t rank, uint64_t communicator, uint64_t first_seq,
                        std::string_view notice);
  void PutSource(uint64_t run, uint64_t file, std::string_view content);
  // Every record and the metadata of `run`.
  void DeleteRun(const RunState& run);

  size_t bytes() const { return batch_.GetDataSize(); }
  uint32_t count() const { return batch_.Count(); }
  void Clear() { batch_.Clear(); }

 private:
  friend class Store;
  rocksdb::ColumnFamilyHandle* cf(Cf which) const;
  const Store* store_;
  rocksdb::WriteBatch batch_;
};

class Store {
 public:
  // Opens (creating if needed) the database under config.data_dir.
  static Result<std::unique_ptr<Store>> Open(const Config& config);
  ~Store();

  // Flushes memtables (so the next start replays no WAL) and closes. Called
  // once at shutdown after the last write; the destructor calls it too.
  Status Close();
  // Flushes every memtable to SST and blob files (Close; tests).
  Status Flush();

  // Durable write: returns once the WAL holding `batch` is synced.
  Status Write(StoreBatch* batch, bool sync);

  // Reads the run registry (meta CF) and the next free run id.
  Status LoadRegistry(std::map<std::string, RunState>* runs, uint64_t* next_id);

  // Compacts the (deleted) key range of `run` so its space is given back.
  // Slow; call from the maintenance thread.
  void CompactRun(uint64_t run_id);

  // Calls `fn(op_index, value)` for ops of (run, rank, lane) from `from_op`
  // on, in op order, at most `max` times. *more is set when ops remain after
  // the last one. `value` is one OpRecord root (unverified), 8-aligned, valid
  // during the call; chunked values (op_chunk.h) are split into records.
  Status ScanOps(uint64_t run, uint32_t rank, uint32_t lane, uint64_t from_op, uint32_t max,
                 const std::function<void(uint64_t, const rocksdb::Slice&)>& fn, bool* more) const;
  // The first lane of (run, rank) after `lane` that holds ops.
  std::optional<uint32_t> NextLane(uint64_t run, uint32_t rank, uint32_t lane) const;
  // The lanes of (run, rank) that hold ops, ascending, each with its last op
  // index (chunks are keyed by their last op: one seek per lane).
  struct LaneExtent {
    uint32_t lane = 0;
    uint64_t last_op = 0;
  };
  std::vector<LaneExtent> OpLanes(uint64_t run, uint32_t rank) const;
  // Point lookups of definitions; missing (or damaged) ids are absent.
  std::map<uint64_t, std::string> GetStrings(uint64_t run, const std::vector<uint64_t>& ids) const;
  std::map<uint64_t, SiteDef> GetSites(uint64_t run, const std::vector<uint64_t>& ids) const;
  // A source file the run sent, if any.
  std::optional<std::string> GetSource(uint64_t run, uint64_t file) const;
  // An iterator over one column family up to `upper` (keys.h builds the
  // bounds), for whole-range scans: read ahead, and with `fill_cache` false
  // a scan does not evict the hot blocks ingest and pages use.
  std::unique_ptr<rocksdb::Iterator> NewScan(Cf cf, const rocksdb::Slice* upper,
                                             bool fill_cache) const;

  // Bytes of every file in the data directory (SSTs, WAL, manifests).
  uint64_t DiskBytes() const;
  uint64_t CfSstBytes(Cf cf) const;
  uint64_t IntProperty(const std::string& property) const;  // summed over CFs
  const std::string& dir() const { return dir_; }

 private:
  friend class StoreBatch;
  Store() = default;
  rocksdb::ColumnFamilyHandle* cf(Cf which) const { return handles_[static_cast<int>(which)]; }
  std::map<uint64_t, std::string> GetDefs(uint64_t run, char kind,
                                          const std::vector<uint64_t>& ids) const;
  std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
  std::array<rocksdb::ColumnFamilyHandle*, kCfCount> handles_{};
  bool closed_ = false;
};

}  // namespace opguard::daemon
