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
#include <rocksdb/sst_file_manager.h>
#include <rocksdb/write_batch.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "opguard/common/cancel.h"
#include "opguard/common/status.h"
#include "opguard/daemon/config.h"
#include "registry/run_state.h"

namespace opguard::daemon {

enum class Cf : int { kOps = 0, kCollectives, kStrings, kSources, kEvents, kMeta, kCores, kCount };
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

  // Record puts return whether the record is new: true, unless
  // CheckExisting is on and the store already holds its key (then it is
  // written again all the same: the same key gets the same bytes).
  // Ingest turns the check on for a batch it cannot prove it never applied,
  // so that counters count distinct stored records.
  void CheckExisting(bool on) { check_existing_ = on; }

  void PutNextRunId(uint64_t next_id);
  void PutRunMeta(const RunState& run);  // without ranks
  void PutRank(uint64_t run, uint32_t rank, const RankState& state);
  bool PutString(uint64_t run, uint64_t id, std::string_view text);
  bool PutSite(uint64_t run, uint64_t id, const SiteDef& site);
  bool PutCommunicator(uint64_t run, uint64_t id, std::string_view def);
  bool PutOpChunk(uint64_t run, uint32_t rank, uint32_t lane, uint64_t last_op, std::string_view chunk);
  // The event cores of the chunk of the same key (OpChunkWriter::FinishCores).
  void PutOpCores(uint64_t run, uint32_t rank, uint32_t lane, uint64_t last_op, std::string_view cores);
  // Marks that every chunk of (run, rank) has its cores under their own key
  // (ingest writes it with the rank's first ops), or that not (with any
  // chunk stored without them).
  void PutCoresComplete(uint64_t run, uint32_t rank);
  void DeleteCoresComplete(uint64_t run, uint32_t rank);
  bool PutCollective(uint64_t run, uint32_t rank, uint64_t communicator, uint64_t seq, uint8_t phase,
                     std::string_view record);
  bool PutStep(uint64_t run, uint32_t rank, uint32_t lane, uint64_t step, uint64_t op_index,
               uint64_t time_ns);
  bool PutOpGap(uint64_t run, uint32_t rank, uint32_t lane, uint64_t first_op, std::string_view notice);
  bool PutCollectiveGap(uint64_t run, uint32_t rank, uint64_t communicator, uint64_t first_seq,
                        std::string_view notice);
  bool PutSource(uint64_t run, uint64_t file, std::string_view content);
  // Every record and the metadata of `run`.
  void DeleteRun(const RunState& run);
  // A named preflight plan (an opaque document, query/plans.h): plans are
  // objects of their own, kept when the runs they were made from go.
  void PutPlan(std::string_view name, std::string_view document);
  void DeletePlan(std::string_view name);

  size_t bytes() const { return batch_.GetDataSize(); }
  uint32_t count() const { return batch_.Count(); }
  void Clear() { batch_.Clear(); }

 private:
  friend class Store;
  rocksdb::ColumnFamilyHandle* cf(Cf which) const;
  bool Put(Cf which, const rocksdb::Slice& key, const rocksdb::Slice& value);
  const Store* store_;
  rocksdb::WriteBatch batch_;
  bool check_existing_ = false;
};

class Store {
 public:
  // Opens (creating if needed) the database under config.data_dir. On a
  // file system too full to open it for writing, opens it read-only
  // (read_only(): queries answer, every write is refused) rather than fail.
  static Result<std::unique_ptr<Store>> Open(const Config& config);
  ~Store();

  // Space management (docs/storage.md, "Disk space"). Why the store refuses
  // new records now, or "" when it takes them: opened read-only, a RocksDB
  // background error (ENOSPC) not yet cleared, free space on the data
  // directory's file system below storage.reserved_bytes or its free inodes
  // below storage.reserved_inodes, or the store's files at storage.max_bytes. Deletions are refused only in the first two
  // cases. Any thread; a statvfs and a few counters.
  std::string WhyFull() const;
  // WhyFull's reasons that refuse ingest alone: free space below
  // storage.reserved_bytes or below what RoomFor(0) needs, free inodes below
  // storage.reserved_inodes, the store at storage.max_bytes.
  std::string SpaceShortage() const;
  // "" when the file system has room to write `bytes` and later flush the
  // memtables (2 x bytes + memtables + 1 MiB, and the inodes of a flush
  // unless storage.reserved_inodes is 0); else why not. Write refuses
  // without it (Unavailable), so RocksDB itself never meets ENOSPC from our
  // writes; only a disk filled by others between two checks can.
  std::string RoomFor(uint64_t bytes) const;
  // After a failed write: a RocksDB background error with no space left
  // (ENOSPC, or storage.max_bytes) holds writes until Resume.
  bool StoppedForSpace() const;
  // Clears a background error once SpaceShortage() is empty and the file
  // system has the inodes a flush needs (DB::Resume: flushes the memtables
  // again). OK when there was none; Unavailable, saying to restart, for an
  // error RocksDB cannot resume from.
  Status Resume();
  bool read_only() const { return read_only_; }
  // Bytes of SST and blob files, as RocksDB's SstFileManager tracks them
  // (what storage.max_bytes bounds; the WAL, at most 4 write buffers, and
  // memtables not yet flushed come on top).
  uint64_t StoreBytes() const;
  // Free bytes for this process on the data directory's file system.
  uint64_t FreeBytes() const;
  // Free inodes there (UINT64_MAX on a file system without an inode limit).
  uint64_t FreeInodes() const;

  // Flushes memtables (so the next start replays no WAL) and closes. Called
  // once at shutdown after the last write; the destructor calls it too.
  Status Close();
  // Flushes every memtable to SST and blob files (Close; tests).
  Status Flush();

  // Durable write: returns once the WAL holding `batch` is synced.
  // Unavailable (nothing written) when there is no room for it (RoomFor)
  // or the store is read-only.
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
  // True when `key` is stored in `cf` (a read error counts as absent).
  bool Contains(Cf cf, const rocksdb::Slice& key) const;
  // Point lookups of definitions; missing (or damaged) ids are absent.
  std::map<uint64_t, std::string> GetStrings(uint64_t run, const std::vector<uint64_t>& ids) const;
  std::map<uint64_t, SiteDef> GetSites(uint64_t run, const std::vector<uint64_t>& ids) const;
  // A source file the run sent, if any.
  std::optional<std::string> GetSource(uint64_t run, uint64_t file) const;
  // Preflight plans (StoreBatch::PutPlan): one by name, or every one by name.
  std::optional<std::string> GetPlan(std::string_view name) const;
  std::map<std::string, std::string> ListPlans() const;
  // An iterator over one column family up to `upper` (keys.h builds the
  // bounds), for whole-range scans: read ahead `readahead` bytes at a time,
  // and with `fill_cache` false a scan does not evict the hot blocks ingest
  // and pages use. Scans of a few keys pass readahead 0 (RocksDB's own,
  // from 8 KiB up): each read ahead of theirs would be thrown away.
  static constexpr size_t kScanReadahead = 2 << 20;
  std::unique_ptr<rocksdb::Iterator> NewScan(Cf cf, const rocksdb::Slice* upper, bool fill_cache,
                                             size_t readahead = kScanReadahead) const;
  // False only for the cores column family of a store written before it,
  // opened read-only (which cannot add it): its readers use the chunks.
  bool Has(Cf which) const { return cf(which) != nullptr; }

  // A scan of the ops column family (`it`, from NewScan) stopped on a value
  // it cannot read: a blob or block whose checksum does not match, an I/O
  // error. The damage is at or after the op key `key` (after it, when
  // `after_key`: the last key read fine). Finds, with at most ~256 seeks, the
  // first key after the damage that reads and leaves `it` there; *to_end when
  // nothing after the damage reads (then `it` is left failed). Returns the
  // damaged key, whose ops the caller reports as a gap. Logs the
  // first damage and counts each (read_errors()). The damaged key is exact
  // for one damaged value; damage spread over several values may put the
  // good values between them into the gap too.
  std::string SkipDamagedOps(rocksdb::Iterator* it, std::string_view key, bool after_key,
                             bool* to_end) const;
  uint64_t read_errors() const { return read_errors_.load(std::memory_order_relaxed); }

  // Damage found by any read since the daemon started (a trace page, a
  // diff, a scrub): the ops of (run, rank) that cannot be read. A diff reads
  // the event cores, not the records, so it also adds the damage found
  // before in the records it depends on as gaps: its answer is then
  // `incomplete` and names those ops (docs/storage.md, "Damage").
  struct DamagedOps {
    uint32_t lane = 0;
    uint64_t first_op = 0, last_op = 0;
  };
  // Records damage at op key `key` (an ops or cores key) whose ops run from
  // `first_op` to the key's op; counts it and logs the first of each key.
  void NoteDamagedOps(std::string_view key, uint64_t first_op, const std::string& error) const;
  // Damage of another kind (a definition, a collective, a whole scan):
  // counted and logged, the first of each `what` once.
  void NoteReadError(const std::string& what, const std::string& error) const;
  std::vector<DamagedOps> KnownDamage(uint64_t run, uint32_t rank) const;
  // Every damaged op range known, by (run id, rank).
  std::map<std::pair<uint64_t, uint32_t>, std::vector<DamagedOps>> AllKnownDamage() const;
  // A scrub (`GET /api/verify`): reads every value of run `run` (0: of every
  // run, and RocksDB's own check of every file's checksums) in every column
  // family, verifying checksums and opening every ops chunk, at least as
  // strictly as any query would. Damage is noted as by any read (above).
  // `cancel`, when set, is checked every 256 values.
  struct ScrubResult {
    uint64_t values = 0, ops = 0, errors = 0;
  };
  Result<ScrubResult> Scrub(uint64_t run, const CancelToken* cancel) const;
  // Grows with every new damaged range (the trace cache's stamps mix it in).
  uint64_t damage_generation() const { return damage_generation_.load(std::memory_order_relaxed); }

  // Bytes of every file in the data directory (SSTs, WAL, manifests).
  uint64_t DiskBytes() const;
  uint64_t CfSstBytes(Cf cf) const;
  uint64_t IntProperty(const std::string& property) const;  // summed over CFs
  const std::string& dir() const { return dir_; }

 private:
  friend class StoreBatch;
  Store() = default;
  rocksdb::ColumnFamilyHandle* cf(Cf which) const { return handles_[static_cast<int>(which)]; }
  uint64_t FlushBytes() const;  // free space a flush of every memtable may need
  struct FreeSpace {
    uint64_t bytes, inodes;
  };
  static FreeSpace FreeSpaceOf(const std::string& dir);
  std::string RoomFor(uint64_t bytes, const FreeSpace& space) const;
  std::map<uint64_t, std::string> GetDefs(uint64_t run, char kind,
                                          const std::vector<uint64_t>& ids) const;
  class ErrorListener;
  std::string dir_;
  uint64_t max_bytes_ = 0;       // storage.max_bytes (0: none)
  uint64_t reserved_bytes_ = 0;   // storage.reserved_bytes
  uint64_t reserved_inodes_ = 0;  // storage.reserved_inodes
  bool read_only_ = false;
  std::shared_ptr<rocksdb::SstFileManager> files_;
  std::shared_ptr<ErrorListener> errors_;
  std::unique_ptr<rocksdb::DB> db_;
  std::array<rocksdb::ColumnFamilyHandle*, kCfCount> handles_{};
  bool closed_ = false;
  mutable std::atomic<uint64_t> read_errors_{0};
  mutable std::atomic<uint64_t> damage_generation_{0};
  mutable std::mutex damage_mu_;
  mutable std::map<std::pair<uint64_t, uint32_t>, std::vector<DamagedOps>> damage_;  // (run, rank)
  mutable std::set<std::string> damage_logged_;  // under damage_mu_
};

}  // namespace opguard::daemon
