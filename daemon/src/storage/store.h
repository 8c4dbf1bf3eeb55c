// The RocksDB store: one database with a column family per kind of data
// (keys.h, docs/storage.md). Thread-safe as RocksDB is: the ingest committer
// writes, queries and the HTTP server read concurrently, the maintenance
// thread compacts deleted ranges.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "opguard/common/status.h"
#include "opguard/daemon/config.h"
#include "registry.h"

namespace opguard::daemon {

enum class Cf : int { kOps = 0, kCollectives, kStrings, kSources, kEvents, kMeta, kCount };
inline constexpr int kCfCount = static_cast<int>(Cf::kCount);
const char* CfName(Cf cf);

class Store {
 public:
  // Opens (creating if needed) the database under config.data_dir.
  static Result<std::unique_ptr<Store>> Open(const Config& config);
  ~Store();

  // Flushes memtables (so the next start replays no WAL) and closes. Called
  // once at shutdown after the last write; the destructor calls it too.
  Status Close();

  rocksdb::ColumnFamilyHandle* cf(Cf which) const { return handles_[static_cast<int>(which)]; }
  rocksdb::DB* db() const { return db_.get(); }

  // Durable write: returns once the WAL holding `batch` is synced.
  Status Write(rocksdb::WriteBatch* batch, bool sync);

  // Reads the run registry (meta CF) and the next free run id.
  Status LoadRegistry(std::map<std::string, RunState>* runs, uint64_t* next_id);

  // Adds to `batch` the deletion of every record and the metadata of `run`.
  void AddDeleteRun(rocksdb::WriteBatch* batch, const RunState& run) const;
  // Compacts the (deleted) key range of `run` so its space is given back.
  // Slow; call from the maintenance thread.
  void CompactRun(uint64_t run_id);

  // Calls `fn(op_index, value)` for ops of (run, rank, lane) from `from_op`
  // on, in op order, at most `max` times. *more is set when ops remain after
  // the last one. `value` is one OpRecord root (unverified), 8-aligned, valid
  // during the call; chunked values (record_copy.h) are split into records.
  Status ScanOps(uint64_t run, uint32_t rank, uint32_t lane, uint64_t from_op, uint32_t max,
                 const std::function<void(uint64_t, const rocksdb::Slice&)>& fn, bool* more) const;
  // Point lookups in the strings CF; missing ids are absent from the result.
  std::map<uint64_t, std::string> GetDefs(uint64_t run, char kind,
                                          const std::vector<uint64_t>& ids) const;

  // Bytes of every file in the data directory (SSTs, WAL, manifests).
  uint64_t DiskBytes() const;
  uint64_t CfSstBytes(Cf cf) const;
  uint64_t IntProperty(const std::string& property) const;  // summed over CFs
  const std::string& dir() const { return dir_; }

 private:
  Store() = default;
  std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
  std::array<rocksdb::ColumnFamilyHandle*, kCfCount> handles_{};
  bool closed_ = false;
};

}  // namespace opguard::daemon
