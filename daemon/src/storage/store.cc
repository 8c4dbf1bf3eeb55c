#include "storage/store.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/table.h>
#include <rocksdb/write_buffer_manager.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "opguard/common/log.h"
#include "storage/keys.h"
#include "storage/meta_values.h"
#include "storage/op_chunk.h"

namespace opguard::daemon {
namespace {

bool Supported(rocksdb::CompressionType type) {
  auto all = rocksdb::GetSupportedCompressions();
  return std::find(all.begin(), all.end(), type) != all.end();
}

rocksdb::CompressionType ChooseCompression(const std::string& name) {
  rocksdb::CompressionType want = rocksdb::kLZ4Compression;
  if (name == "zstd") want = rocksdb::kZSTD;
  if (name == "snappy") want = rocksdb::kSnappyCompression;
  if (name == "none") return rocksdb::kNoCompression;
  if (Supported(want)) return want;
  if (Supported(rocksdb::kSnappyCompression)) return rocksdb::kSnappyCompression;
  return rocksdb::kNoCompression;
}

Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  return Internal(what + ": " + s.ToString());
}

bool IsSpaceError(const rocksdb::Status& s) {
  return s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit;
}

// A background error DB::Resume() refuses (e.g. a new WAL that could not be
// created): writes can start again only in a new DB::Open.
bool IsFatal(const rocksdb::Status& s) { return s.severity() >= rocksdb::Status::Severity::kFatalError; }

std::string MiB(uint64_t bytes) {
  char text[32];
  if (bytes < (1u << 20)) {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return text;
}

}  // namespace

// One statvfs for both figures; UINT64_MAX for what is unknown (do not
// refuse for it) and for the inodes of a file system without an inode limit
// (f_files 0, e.g. btrfs).
Store::FreeSpace Store::FreeSpaceOf(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return {UINT64_MAX, UINT64_MAX};
  return {static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize,
          fs.f_files == 0 ? UINT64_MAX : static_cast<uint64_t>(fs.f_favail)};
}

namespace {

// Free inodes a flush may need: a new WAL, an SST and a blob file per column
// family, a MANIFEST. A resume needs them whatever storage.reserved_inodes
// says: a resume that finds no inode fails on its new WAL, and RocksDB
// takes that as an error only a restart clears.
constexpr uint64_t kFlushInodes = 32;

// Free space opening an existing store for writing needs: a new MANIFEST (a
// copy of the current one), an OPTIONS file and a WAL, with room to spare.
uint64_t OpenBytes(const std::string& dir) {
  uint64_t manifests = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code fec;
    if (e.path().filename().string().rfind("MANIFEST-", 0) == 0) manifests += e.file_size(fec);
  }
  return manifests + (4u << 20);
}

}  // namespace

// Keeps the background error RocksDB stops writes for (a failed WAL append,
// flush or compaction), and turns RocksDB's own recovery off: the ingest
// thread resumes (Store::Resume) as soon as the space checks pass, instead
// of RocksDB polling every 5 s, and no recovery runs behind a deletion.
class Store::ErrorListener final : public rocksdb::EventListener {
 public:
  void OnBackgroundError(rocksdb::BackgroundErrorReason, rocksdb::Status* error) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error->ok()) error_ = *error;
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
  rocksdb::Status error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  void Set(const rocksdb::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = s;
  }

 private:
  mutable std::mutex mu_;
  rocksdb::Status error_;
};

const char* CfName(Cf cf) {
  static constexpr const char* kNames[kCfCount] = {keys::kOps,    keys::kCollectives,
                                                   keys::kStrings, keys::kSources,
                                                   keys::kEvents, keys::kMeta,
                                                   keys::kCores};
  return kNames[static_cast<int>(cf)];
}

Result<std::unique_ptr<Store>> Store::Open(const Config& config) {
  std::error_code ec;
  std::filesystem::create_directories(config.data_dir, ec);
  if (ec) return Unavailable("cannot create data dir " + config.data_dir + ": " + ec.message());
  // Records are the daemon's alone: others read them through queries, which
  // apply the access rules (docs/operations.md). A dir made group- or
  // world-readable by hand (or an older daemon) is closed again.
  struct stat st {};
  if (::stat(config.data_dir.c_str(), &st) == 0 && (st.st_mode & 077) != 0 &&
      ::chmod(config.data_dir.c_str(), 0700) != 0) {
    OPGUARD_LOG(LogLevel::kWarn, "cannot make data dir " + config.data_dir + " private (mode 0700)");
  }

  // DB-wide options: one writer (the ingest committer) doing synced group
  // commits; a memtable budget shared by all column families so memory stays
  // bounded no matter how many runs are live.
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  // Damage is found, never read past (RocksDB's defaults, stated): files are
  // checked as they are opened, and every read verifies block and blob
  // checksums (ReadOptions::verify_checksums, on in every ReadOptions here).
  db_options.paranoid_checks = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = config.background_jobs;
  db_options.bytes_per_sync = 1 << 20;
  // The meta CF sees tiny writes and would otherwise pin old WAL files.
  db_options.max_total_wal_size = 4 * config.write_buffer_bytes;
  db_options.keep_log_file_num = 4;
  db_options.max_log_file_size = 16 << 20;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.write_buffer_manager =
      std::make_shared<rocksdb::WriteBufferManager>(config.memtable_budget_bytes);
  // Vector memtables (below) cannot take concurrent inserts; there is one writer anyway.
  db_options.allow_concurrent_memtable_write = false;
  db_options.enable_write_thread_adaptive_yield = false;
  // On a full disk the WAL is replayed into memtables and kept, instead of
  // being flushed to new SST files during open (which needs the space the
  // disk has not got); Close flushes as usual.
  db_options.avoid_flush_during_recovery = true;
  // Tracks SST and blob bytes for storage.max_bytes (checked at ingest,
  // docs/storage.md: RocksDB's own hard limit would also fail the
  // compaction that gives a removed run's space back), and keeps
  // storage.reserved_bytes free for compactions after an ENOSPC.
  std::shared_ptr<rocksdb::SstFileManager> files(rocksdb::NewSstFileManager(rocksdb::Env::Default()));
  files->SetCompactionBufferSize(config.reserved_bytes);
  db_options.sst_file_manager = files;
  auto errors = std::make_shared<ErrorListener>();
  db_options.listeners.push_back(errors);

  auto cache = rocksdb::NewLRUCache(config.block_cache_bytes);
  const auto compression = ChooseCompression(config.compression);
  const auto bottom = ChooseCompression(config.bottommost_compression);

  auto make_cf = [&](Cf cf) {
    rocksdb::ColumnFamilyOptions o;
    rocksdb::BlockBasedTableOptions t;
    t.block_cache = cache;
    t.cache_index_and_filter_blocks = true;
    t.pin_l0_filter_and_index_blocks_in_cache = true;
    t.format_version = 5;
    o.compression = compression;
    o.bottommost_compression = bottom;
    o.level_compaction_dynamic_level_bytes = true;
    switch (cf) {
      case Cf::kOps:
      case Cf::kCollectives:
      case Cf::kEvents:
        // Written in key order per rank, read back as range scans: large
        // blocks compress better and scan faster; no bloom filter (scans
        // never use it). Vector memtable: O(1) appends, sorted once at flush.
        t.block_size = 64 << 10;
        o.write_buffer_size = cf == Cf::kOps ? config.write_buffer_bytes
                                             : std::max<uint64_t>(config.write_buffer_bytes / 4, 4 << 20);
        o.max_write_buffer_number = 4;
        o.memtable_factory = std::make_shared<rocksdb::VectorRepFactory>();
        o.target_file_size_base = 64 << 20;
        o.max_bytes_for_level_base = 512 << 20;
        o.level0_file_num_compaction_trigger = 4;
        o.level0_slowdown_writes_trigger = 24;
        o.level0_stop_writes_trigger = 40;
        if (cf == Cf::kOps) {
          // Ops values are chunks of up to 128 records (tens of KiB): key-value
          // separation writes each chunk once, compressed once at flush, into
          // a blob file; compactions then move only the small keys (blob
          // references) instead of recompressing every byte at every level.
          // No blob GC during ingest (it would relocate, i.e. recompress,
          // live blobs of old files at every compaction: -15% CPU per record
          // without it). Ops are never overwritten, only deleted by run:
          // CompactRun drops a deleted run's keys with GC forced, and a blob
          // file is removed once every blob in it is garbage.
          // Ingest compresses every chunk itself before the write (the WAL
          // and the memtable then carry compressed bytes too), so blob files
          // store the values as they are.
          o.enable_blob_files = true;
          o.min_blob_size = 1024;
          o.blob_file_size = 256 << 20;
          o.blob_compression_type = rocksdb::kNoCompression;
          o.enable_blob_garbage_collection = false;
        }
        if (config.compaction == "universal") {
          o.compaction_style = rocksdb::kCompactionStyleUniversal;
          o.level_compaction_dynamic_level_bytes = false;
          o.compaction_options_universal.max_size_amplification_percent = 200;
          o.compaction_options_universal.size_ratio = 10;
        }
        break;
      case Cf::kCores:
        // The first diff of a run reads every core of its ranks and nothing
        // else (docs/storage.md): inline values (no blob files), in large
        // sequentially read blocks. Ingest compresses the cores already, so
        // RocksDB does not try again; XXH3 block checksums cost a fraction
        // of the software CRC32C of the distribution's librocksdb.
        t.block_size = 64 << 10;
        t.checksum = rocksdb::kXXH3;
        o.compression = rocksdb::kNoCompression;
        o.bottommost_compression = rocksdb::kNoCompression;
        o.write_buffer_size = std::max<uint64_t>(config.write_buffer_bytes / 2, 4 << 20);
        o.max_write_buffer_number = 4;
        o.memtable_factory = std::make_shared<rocksdb::VectorRepFactory>();
        o.target_file_size_base = 64 << 20;
        o.max_bytes_for_level_base = 512 << 20;
        if (config.compaction == "universal") {
          o.compaction_style = rocksdb::kCompactionStyleUniversal;
          o.level_compaction_dynamic_level_bytes = false;
        }
        break;
      case Cf::kStrings:
      case Cf::kSources:
      case Cf::kMeta:
        // Small and looked up by key: bloom filters, default memtable.
        t.block_size = 16 << 10;
        t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
        o.write_buffer_size = 8 << 20;
        o.max_write_buffer_number = 2;
        break;
      case Cf::kCount:
        break;
    }
    o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    return o;
  };

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
  for (int i = 0; i < kCfCount; ++i) {
    descriptors.emplace_back(CfName(static_cast<Cf>(i)), make_cf(static_cast<Cf>(i)));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  // Opening for writing writes a new MANIFEST and WAL; on a file system
  // without room for them, a failed write would leave RocksDB with a file it
  // cannot close. Read-only, the daemon still answers queries, so the
  // operator sees what is stored while freeing space; a restart then opens
  // it for writing.
  const bool exists = std::filesystem::exists(config.data_dir + "/CURRENT", ec);
  const uint64_t free = FreeSpaceOf(config.data_dir).bytes, need = OpenBytes(config.data_dir);
  bool read_only = exists && free < need;
  rocksdb::Status s;
  if (!read_only) {
    s = rocksdb::DB::Open(db_options, config.data_dir, descriptors, &handles, &raw);
    read_only = exists && !s.ok() && IsSpaceError(s);
  }
  if (read_only) {
    OPGUARD_LOG(LogLevel::kError, "cannot open the store in " + config.data_dir + " for writing (" +
                                      (s.ok() ? MiB(free) + " free, " + MiB(need) + " needed" : s.ToString()) +
                                      "); opening it read-only (queries only) until restarted with free space");
    handles.clear();
    // Read-only, RocksDB cannot add a column family the store lacks (one
    // written before `cores` existed): open those it has.
    std::vector<std::string> names;
    if (rocksdb::DB::ListColumnFamilies(db_options, config.data_dir, &names).ok()) {
      std::erase_if(descriptors, [&](const rocksdb::ColumnFamilyDescriptor& d) {
        return std::find(names.begin(), names.end(), d.name) == names.end();
      });
    }
    s = rocksdb::DB::OpenForReadOnly(db_options, config.data_dir, descriptors, &handles, &raw);
  }
  if (!s.ok()) return Unavailable("cannot open store in " + config.data_dir + ": " + s.ToString());
  std::unique_ptr<Store> store(new Store());
  store->dir_ = config.data_dir;
  store->max_bytes_ = config.max_bytes;
  store->reserved_bytes_ = config.reserved_bytes;
  store->reserved_inodes_ = config.reserved_inodes;
  store->read_only_ = read_only;
  store->files_ = std::move(files);
  store->errors_ = std::move(errors);
  store->db_.reset(raw);
  // handles[0] is the default CF: unused, but RocksDB wants it open.
  raw->DestroyColumnFamilyHandle(handles[0]);
  for (size_t h = 1; h < handles.size(); ++h) {
    for (int i = 0; i < kCfCount; ++i) {
      if (descriptors[h].name == CfName(static_cast<Cf>(i))) store->handles_[i] = handles[h];
    }
  }
  return store;
}

Store::~Store() { (void)Close(); }

Status Store::Flush() {
  rocksdb::FlushOptions flush;
  flush.wait = true;
  std::vector<rocksdb::ColumnFamilyHandle*> all;
  for (auto* h : handles_) {
    if (h != nullptr) all.push_back(h);
  }
  return FromRocks(db_->Flush(flush, all), "store flush");
}

Status Store::Close() {
  if (closed_ || !db_) return Status::Ok();
  closed_ = true;
  // Without room for the flush the WAL keeps the records for the next start
  // (which replays it without flushing): a flush that fails for space would
  // leave RocksDB with a file it cannot close.
  Status fs;
  if (!read_only_) {
    if (std::string no_room = RoomFor(0); no_room.empty()) {
      fs = Flush();
    } else {
      OPGUARD_LOG(LogLevel::kWarn, "store: not flushing at close (" + no_room + "); the WAL keeps the records");
    }
  }
  if (!fs.ok()) OPGUARD_LOG(LogLevel::kWarn, "store: flush at close failed: " + fs.message());
  for (auto* h : handles_) {
    if (h != nullptr) db_->DestroyColumnFamilyHandle(h);
  }
  handles_.fill(nullptr);
  auto s = db_->Close();
  db_.reset();
  return FromRocks(s, "store close");
}

Status Store::Write(StoreBatch* batch, bool sync) {
  if (read_only_) return Unavailable("store write: " + WhyFull());
  // RocksDB never gets to write into a full file system: a WAL or SST file
  // that met ENOSPC stays broken until the DB is closed (and Debian's
  // RocksDB, built with assertions, aborts when it closes such a file).
  if (std::string no_room = RoomFor(batch->bytes()); !no_room.empty()) {
    return Unavailable("store write: " + no_room);
  }
  rocksdb::WriteOptions options;
  options.sync = sync;
  auto s = db_->Write(options, &batch->batch_);
  // A write that found the WAL's disk full stops the DB like a background
  // error does; remember it even if no listener call came with it.
  if (IsSpaceError(s) && errors_->error().ok()) errors_->Set(s);
  return FromRocks(s, "store write");
}

bool Store::StoppedForSpace() const {
  const auto error = errors_->error();
  return !error.ok() && IsSpaceError(error);
}

uint64_t Store::FreeBytes() const { return FreeSpaceOf(dir_).bytes; }

uint64_t Store::FreeInodes() const { return FreeSpaceOf(dir_).inodes; }

uint64_t Store::StoreBytes() const { return files_->GetTotalSize(); }

std::string Store::WhyFull() const {
  if (read_only_) {
    return "the store was opened read-only because its disk was full at start (" + MiB(FreeBytes()) +
           " free now); restart opguardd once there is space";
  }
  if (const auto error = errors_->error(); !error.ok()) {
    if (IsFatal(error)) {
      return "the store stopped writing after an error RocksDB cannot resume from (" + error.ToString() +
             "); restart opguardd once there is space, " + MiB(FreeBytes()) + " free on its file system now";
    }
    return "the store stopped writing after an error (" + error.ToString() + "), " + MiB(FreeBytes()) +
           " free on its file system";
  }
  return SpaceShortage();
}

uint64_t Store::FlushBytes() const { return IntProperty("rocksdb.cur-size-all-mem-tables") + (1u << 20); }

std::string Store::RoomFor(uint64_t bytes) const { return RoomFor(bytes, FreeSpaceOf(dir_)); }

std::string Store::RoomFor(uint64_t bytes, const FreeSpace& space) const {
  // The write goes to the WAL, and later its memtable (with the others) to
  // SST and blob files.
  const uint64_t need = 2 * bytes + FlushBytes();
  if (const uint64_t free = space.bytes; free < need) {
    return "the data directory's file system has " + MiB(free) + " free, less than " +
           (bytes != 0 ? "writing " + MiB(bytes) + " and " : std::string()) + "flushing the memtables needs (" +
           MiB(need) + ")";
  }
  // A write may switch memtables: a new WAL, then a flush's files.
  // storage.reserved_inodes 0 turns this check off (for file systems whose
  // inode counts mean nothing).
  if (const uint64_t need = std::min(reserved_inodes_, kFlushInodes), free = space.inodes; free < need) {
    return "the data directory's file system has " + std::to_string(free) +
           " free inodes, fewer than a flush of the memtables may need (" + std::to_string(need) + ")";
  }
  return "";
}

std::string Store::SpaceShortage() const {
  const FreeSpace space = FreeSpaceOf(dir_);
  if (const uint64_t free = space.bytes; free < reserved_bytes_) {
    return "the data directory's file system has " + MiB(free) + " free, below storage.reserved_bytes (" +
           MiB(reserved_bytes_) + ")";
  }
  if (const uint64_t free = space.inodes; free < reserved_inodes_) {
    return "the data directory's file system has " + std::to_string(free) +
           " free inodes, below storage.reserved_inodes (" + std::to_string(reserved_inodes_) + ")";
  }
  if (std::string no_room = RoomFor(0, space); !no_room.empty()) return no_room;
  if (const uint64_t used = max_bytes_ != 0 ? StoreBytes() : 0; max_bytes_ != 0 && used >= max_bytes_) {
    return "the store holds " + MiB(used) + ", storage.max_bytes is " + MiB(max_bytes_);
  }
  return "";
}

Status Store::Resume() {
  if (read_only_) return Unavailable(WhyFull());
  const auto error = errors_->error();
  if (error.ok()) return Status::Ok();
  if (IsFatal(error)) return Unavailable(WhyFull());
  // Resuming flushes the memtables: only with the space to do it.
  if (std::string shortage = SpaceShortage(); !shortage.empty()) return Unavailable(shortage);
  if (const uint64_t free = FreeInodes(); free < kFlushInodes) {
    return Unavailable("the data directory's file system has " + std::to_string(free) +
                       " free inodes, fewer than resuming the store needs (" + std::to_string(kFlushInodes) + ")");
  }
  auto s = db_->Resume();
  if (!s.ok()) return FromRocks(s, "resuming the store");
  errors_->Set(rocksdb::Status::OK());
  return Status::Ok();
}

Status Store::LoadRegistry(std::map<std::string, RunState>* runs, uint64_t* next_id) {
  runs->clear();
  *next_id = 1;
  std::string value;
  auto s = db_->Get(rocksdb::ReadOptions(), cf(Cf::kMeta), keys::MetaNextIdKey(), &value);
  if (s.ok() && value.size() == 8) *next_id = keys::GetU64(value.data());
  std::map<uint64_t, RunState*> by_id;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf(Cf::kMeta)));
  // Runs ('N') sort before ranks ('R'), so every rank finds its run.
  for (it->Seek(std::string(1, keys::kMetaRun)); it->Valid(); it->Next()) {
    auto key = it->key();
    if (key.empty()) continue;
    try {
      if (key[0] == keys::kMetaRun) {
        RunState run = RunMetaFromJson(nlohmann::json::parse(it->value().ToStringView()));
        auto& slot = (*runs)[run.name];
        slot = std::move(run);
        by_id[slot.id] = &slot;
        *next_id = std::max(*next_id, slot.id + 1);
      } else if (key[0] == keys::kMetaRank && key.size() == 13) {
        uint64_t id = keys::GetU64(key.data() + 1);
        uint32_t rank = keys::GetU32(key.data() + 9);
        auto found = by_id.find(id);
        if (found == by_id.end()) continue;  // run deleted in the same batch
        found->second->ranks[rank] = RankFromJson(nlohmann::json::parse(it->value().ToStringView()));
      }
    } catch (const std::exception& e) {
      return DataLoss("meta record " + key.ToString(true) + " is corrupt: " + e.what());
    }
  }
  if (!it->status().ok()) return FromRocks(it->status(), "reading run registry");
  return Status::Ok();
}

void Store::CompactRun(uint64_t run_id) {
  const std::string begin = keys::RunBegin(run_id), end = keys::RunBegin(run_id + 1);
  rocksdb::Slice b(begin), e(end);
  rocksdb::CompactRangeOptions options;
  options.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  // Relocate the live blobs that share blob files with the deleted run (only
  // those referenced from the compacted key range), so those files can go.
  options.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  options.blob_garbage_collection_age_cutoff = 1.0;
  // RocksDB must not meet a full disk here: a blob file whose write failed
  // is flushed again when the compaction gives it up, and Debian's RocksDB
  // (built with assertions) aborts the daemon there. The compaction writes
  // at most the memtables, the SST files it reads and, relocating, the live
  // blobs; without room for the blobs it only drops the run's keys (a blob
  // file that held nothing else goes too), without room for the rest it
  // waits for a later deletion.
  uint64_t sst_bytes = 0;
  std::vector<rocksdb::LiveFileMetaData> files;
  db_->GetLiveFilesMetaData(&files);
  for (const auto& f : files) {
    if (f.largestkey >= begin && f.smallestkey < end) sst_bytes += f.size;
  }
  const uint64_t free = FreeBytes(), rewrite = FlushBytes() + sst_bytes;
  const uint64_t blobs = IntProperty("rocksdb.live-blob-file-size");
  if (free < rewrite) {
    OPGUARD_LOG(LogLevel::kWarn, "store: not compacting the deleted run now (" + MiB(free) +
                                     " free, its compaction may write " + MiB(rewrite) +
                                     "); its space comes back with a later deletion");
    return;
  }
  if (free < rewrite + blobs) {
    OPGUARD_LOG(LogLevel::kWarn, "store: compacting the deleted run without moving shared blobs (" +
                                     MiB(free) + " free, the live blobs are " + MiB(blobs) + ")");
    options.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kDisable;
  }
  for (Cf c : {Cf::kOps, Cf::kCollectives, Cf::kStrings, Cf::kSources, Cf::kEvents, Cf::kCores}) {
    if (!Has(c)) continue;
    auto s = db_->CompactRange(options, cf(c), &b, &e);
    if (!s.ok()) OPGUARD_LOG(LogLevel::kWarn, "store: compacting deleted run failed: " + s.ToString());
  }
}

namespace {

// Op keys are run | rank | lane | op_index, big-endian: past the run, a
// 128-bit number that orders them.
using Position = unsigned __int128;
constexpr Position kLastPosition = ~Position{0};

Position PositionOf(std::string_view key) {
  Position p = 0;
  for (size_t i = 8; i < keys::kOpKeySize; ++i) p = (p << 8) | static_cast<uint8_t>(key[i]);
  return p;
}

std::string KeyAt(std::string_view run_key, Position p) {
  std::string key(run_key.substr(0, 8));
  key.resize(keys::kOpKeySize);
  for (size_t i = keys::kOpKeySize; i-- > 8;) {
    key[i] = static_cast<char>(static_cast<uint8_t>(p));
    p >>= 8;
  }
  return key;
}

}  // namespace

Status Store::ScanOps(uint64_t run, uint32_t rank, uint32_t lane, uint64_t from_op, uint32_t max,
                      const std::function<void(uint64_t, const rocksdb::Slice&)>& fn,
                      bool* more) const {
  *more = false;
  const std::string prefix = keys::LanePrefix(run, rank, lane);
  std::string upper = keys::LanePrefix(run, rank, lane + 1);
  if (lane == UINT32_MAX) upper = keys::LanePrefix(run, rank + 1, 0);
  rocksdb::Slice upper_slice(upper);
  auto it = NewScan(Cf::kOps, &upper_slice, /*fill_cache=*/true);
  uint32_t n = 0;
  OpChunkView chunk;
  // Chunks are keyed by their last op: Seek(from_op) lands on the chunk that
  // holds from_op (or the first one after it).
  bool any = false;
  uint64_t last = 0;  // ops are emitted strictly ascending
  const std::string start = keys::OpKey(run, rank, lane, from_op);
  std::string last_key;  // the last key read fine
  for (it->Seek(start);; it->Next()) {
    // A value that cannot be read is skipped like an undecodable chunk.
    while (!it->Valid() && !it->status().ok()) {
      bool to_end = false;
      last_key = SkipDamagedOps(it.get(), last_key.empty() ? start : last_key, !last_key.empty(), &to_end);
      if (to_end) return Status::Ok();
    }
    if (!it->Valid()) break;
    auto key = it->key();
    if (key.size() != keys::kOpKeySize || !key.starts_with(prefix)) continue;
    const uint64_t first_in_key = last_key.size() == key.size() && key.starts_with(rocksdb::Slice(last_key.data(), 16))
                                      ? keys::OpKeyIndex(last_key) + 1
                                      : keys::OpKeyIndex(key.ToStringView());
    last_key = key.ToString();
    if (!chunk.Open(keys::OpKeyIndex(key.ToStringView()), it->value().ToStringView())) {
      NoteDamagedOps(key.ToStringView(), first_in_key, "an ops chunk whose framing or compression does not open");
      continue;
    }
    for (size_t i = chunk.LowerBound(from_op); i < chunk.size(); ++i) {
      const uint64_t op = chunk.op_index(i);
      if (any && op <= last) continue;
      if (n == max) {
        *more = true;
        return FromRocks(it->status(), "reading trace");
      }
      const auto record = chunk.record(i);
      fn(op, rocksdb::Slice(record.data(), record.size()));
      any = true;
      last = op;
      ++n;
    }
  }
  return FromRocks(it->status(), "reading trace");
}


std::string Store::SkipDamagedOps(rocksdb::Iterator* it, std::string_view key, bool after_key,
                                  bool* to_end) const {
  // unreadable(p): the first key at or after p cannot be read. True at the
  // start; gallop, then bisect, to the first p where it is false: the key
  // just before p is the damaged one.
  auto unreadable = [&](Position p) {
    it->Seek(KeyAt(key, p));
    return !it->Valid() && !it->status().ok();
  };
  Position bad = PositionOf(key);
  if (after_key) ++bad;
  unreadable(bad);
  const rocksdb::Status error = it->status();
  Position good = bad;
  *to_end = false;
  for (Position step = 1;; step <<= 1) {
    good = kLastPosition - bad > step ? bad + step : kLastPosition;
    if (!unreadable(good)) break;
    bad = good;
    if (good == kLastPosition) {
      *to_end = true;
      break;
    }
  }
  while (!*to_end && good - bad > 1) {
    const Position mid = bad + (good - bad) / 2;
    (unreadable(mid) ? bad : good) = mid;
  }
  if (!*to_end) it->Seek(KeyAt(key, good));
  const std::string damaged = KeyAt(key, bad);
  // Its first op is not known: from just after the last key read fine (the
  // same lane), else the damaged key's own op.
  uint64_t first = keys::OpKeyIndex(damaged);
  if (after_key && key.size() == keys::kOpKeySize && keys::OpKeyLane(key) == keys::OpKeyLane(damaged) &&
      std::string_view(key).substr(0, 12) == std::string_view(damaged).substr(0, 12)) {
    first = std::min(first, keys::OpKeyIndex(key) + 1);
  }
  NoteDamagedOps(damaged, first, error.ToString());
  return damaged;
}

void Store::NoteDamagedOps(std::string_view key, uint64_t first_op, const std::string& error) const {
  if (key.size() != keys::kOpKeySize) return NoteReadError("ops key " + rocksdb::Slice(key).ToString(true), error);
  read_errors_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t run = keys::GetU64(key.data());
  const uint32_t rank = keys::GetU32(key.data() + 8);
  const DamagedOps ops{keys::OpKeyLane(key), first_op, keys::OpKeyIndex(key)};
  std::lock_guard<std::mutex> lock(damage_mu_);
  auto& known = damage_[{run, rank}];
  for (const DamagedOps& d : known) {
    if (d.lane == ops.lane && d.first_op <= ops.first_op && ops.last_op <= d.last_op) return;  // seen
  }
  known.push_back(ops);
  damage_generation_.fetch_add(1, std::memory_order_relaxed);
  OPGUARD_LOG(LogLevel::kError, "store: damaged data, run id " + std::to_string(run) + " rank " +
                                    std::to_string(rank) + " lane " + std::to_string(ops.lane) + " ops " +
                                    std::to_string(ops.first_op) + ".." + std::to_string(ops.last_op) + " (" +
                                    error + "); answers that read them are incomplete "
                                    "(counted in opguard_store_read_errors_total)");
}

void Store::NoteReadError(const std::string& what, const std::string& error) const {
  read_errors_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(damage_mu_);
  if (damage_logged_.size() < 1000 && damage_logged_.insert(what).second) {
    OPGUARD_LOG(LogLevel::kError, "store: damaged data in " + what + " (" + error +
                                      "); counted in opguard_store_read_errors_total");
  }
}

std::map<std::pair<uint64_t, uint32_t>, std::vector<Store::DamagedOps>> Store::AllKnownDamage() const {
  std::lock_guard<std::mutex> lock(damage_mu_);
  return damage_;
}

Result<Store::ScrubResult> Store::Scrub(uint64_t run, const CancelToken* cancel) const {
  ScrubResult result;
  const uint64_t errors_before = read_errors();
  const std::string begin = run == 0 ? std::string() : keys::RunBegin(run);
  const std::string end = run == 0 ? std::string() : keys::RunBegin(run + 1);
  rocksdb::Slice end_slice(end);
  // The ops: every chunk opened; a value that does not read is skipped as
  // ScanOps does, so one damaged blob does not hide the rest.
  {
    auto it = NewScan(Cf::kOps, run == 0 ? nullptr : &end_slice, /*fill_cache=*/false);
    OpChunkView chunk;
    std::string last_key;
    const std::string first_key = keys::OpKey(run, 0, 0, 0);  // run 0: below every run id
    for (it->Seek(first_key);; it->Next()) {
      while (!it->Valid() && !it->status().ok()) {
        bool to_end = false;
        last_key = SkipDamagedOps(it.get(), last_key.empty() ? std::string_view(first_key) : std::string_view(last_key),
                                  !last_key.empty(), &to_end);
        if (to_end) break;
      }
      if (!it->Valid()) break;
      if (++result.values % 256 == 0 && cancel != nullptr) OPGUARD_RETURN_IF_ERROR(cancel->Check());
      const auto key = it->key();
      if (key.size() != keys::kOpKeySize) continue;
      const bool same_lane = last_key.size() == key.size() && key.starts_with(rocksdb::Slice(last_key.data(), 16));
      const uint64_t first = same_lane ? keys::OpKeyIndex(last_key) + 1 : keys::OpKeyIndex(key.ToStringView());
      last_key = key.ToString();
      if (!chunk.Open(keys::OpKeyIndex(key.ToStringView()), it->value().ToStringView())) {
        NoteDamagedOps(key.ToStringView(), first, "an ops chunk whose framing or compression does not open");
        continue;
      }
      result.ops += chunk.size();
    }
  }
  // Every other column family: each value read (and its block's checksum
  // verified). A damaged block ends the scan of its family, said as such.
  for (Cf which : {Cf::kCollectives, Cf::kStrings, Cf::kSources, Cf::kEvents, Cf::kCores}) {
    if (!Has(which)) continue;
    auto it = NewScan(which, run == 0 ? nullptr : &end_slice, /*fill_cache=*/false);
    uint64_t checksum = 0;
    for (it->Seek(begin); it->Valid(); it->Next()) {
      if (++result.values % 256 == 0 && cancel != nullptr) OPGUARD_RETURN_IF_ERROR(cancel->Check());
      checksum += it->value().size();  // reads the value
    }
    if (!it->status().ok()) {
      NoteReadError(std::string("the ") + CfName(which) + " column family" +
                        (run == 0 ? std::string() : " of run id " + std::to_string(run)),
                    it->status().ToString());
    }
    (void)checksum;
  }
  if (run == 0) {
    // Every SST file's blocks, including those no key range above reaches.
    if (rocksdb::Status st = db_->VerifyChecksum(); !st.ok()) NoteReadError("the store's files", st.ToString());
  }
  result.errors = read_errors() - errors_before;
  return result;
}

std::vector<Store::DamagedOps> Store::KnownDamage(uint64_t run, uint32_t rank) const {
  std::lock_guard<std::mutex> lock(damage_mu_);
  auto found = damage_.find({run, rank});
  return found == damage_.end() ? std::vector<DamagedOps>() : found->second;
}

std::optional<uint32_t> Store::NextLane(uint64_t run, uint32_t rank, uint32_t lane) const {
  if (lane == UINT32_MAX) return std::nullopt;
  const std::string upper =
      rank == UINT32_MAX ? keys::LanePrefix(run + 1, 0, 0) : keys::LanePrefix(run, rank + 1, 0);
  rocksdb::Slice upper_slice(upper);
  auto it = NewScan(Cf::kOps, &upper_slice, /*fill_cache=*/true);
  const std::string rank_prefix = keys::LanePrefix(run, rank, 0).substr(0, 12);  // run | rank
  for (it->Seek(keys::LanePrefix(run, rank, lane + 1)); it->Valid(); it->Next()) {
    auto key = it->key();
    if (key.size() == keys::kOpKeySize && key.starts_with(rank_prefix)) {
      return keys::OpKeyLane(key.ToStringView());
    }
  }
  return std::nullopt;
}

std::vector<Store::LaneExtent> Store::OpLanes(uint64_t run, uint32_t rank) const {
  std::vector<LaneExtent> lanes;
  const std::string rank_prefix = keys::LanePrefix(run, rank, 0).substr(0, 12);
  std::string upper = keys::LanePrefix(run, rank + 1, 0);
  if (rank == UINT32_MAX) upper = keys::RunBegin(run + 1);
  rocksdb::Slice upper_slice(upper);
  auto it = NewScan(Cf::kOps, &upper_slice, /*fill_cache=*/true);
  it->Seek(rank_prefix);
  while (it->Valid() && it->key().size() == keys::kOpKeySize && it->key().starts_with(rank_prefix)) {
    const uint32_t lane = keys::OpKeyLane(it->key().ToStringView());
    // The last key below the next lane's prefix is this lane's last chunk.
    const std::string next = lane == UINT32_MAX ? upper : keys::LanePrefix(run, rank, lane + 1);
    it->SeekForPrev(next);
    if (!it->Valid()) break;
    lanes.push_back({lane, keys::OpKeyIndex(it->key().ToStringView())});
    if (lane == UINT32_MAX) break;
    it->Seek(next);
  }
  return lanes;
}

std::map<uint64_t, std::string> Store::GetDefs(uint64_t run, char kind,
                                               const std::vector<uint64_t>& ids) const {
  std::map<uint64_t, std::string> out;
  if (ids.empty()) return out;
  std::vector<std::string> key_storage;
  key_storage.reserve(ids.size());
  for (uint64_t id : ids) key_storage.push_back(keys::DefKey(run, kind, id));
  std::vector<rocksdb::Slice> key_slices(key_storage.begin(), key_storage.end());
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(ids.size(), cf(Cf::kStrings));
  std::vector<std::string> values;
  auto statuses = db_->MultiGet(rocksdb::ReadOptions(), cfs, key_slices, &values);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (statuses[i].ok()) {
      out[ids[i]] = std::move(values[i]);
    } else if (!statuses[i].IsNotFound()) {
      NoteReadError(std::string("the definitions (kind '") + kind + "') of run id " + std::to_string(run),
                    statuses[i].ToString());
    }
  }
  return out;
}

std::map<uint64_t, std::string> Store::GetStrings(uint64_t run, const std::vector<uint64_t>& ids) const {
  return GetDefs(run, keys::kStringKind, ids);
}

std::map<uint64_t, SiteDef> Store::GetSites(uint64_t run, const std::vector<uint64_t>& ids) const {
  std::map<uint64_t, SiteDef> out;
  for (const auto& [id, value] : GetDefs(run, keys::kSiteKind, ids)) {
    SiteDef s;
    if (keys::DecodeSiteValue(value, &s.file, &s.line, &s.function)) out[id] = s;
  }
  return out;
}

bool Store::Contains(Cf which, const rocksdb::Slice& key) const {
  rocksdb::PinnableSlice value;
  return db_->Get(rocksdb::ReadOptions(), cf(which), key, &value).ok();
}

std::optional<std::string> Store::GetSource(uint64_t run, uint64_t file) const {
  std::string content;
  auto s = db_->Get(rocksdb::ReadOptions(), cf(Cf::kSources), keys::SourceKey(run, file), &content);
  if (!s.ok()) return std::nullopt;
  return content;
}

std::optional<std::string> Store::GetPlan(std::string_view name) const {
  std::string document;
  auto s = db_->Get(rocksdb::ReadOptions(), cf(Cf::kMeta), keys::MetaPlanKey(name), &document);
  if (!s.ok()) return std::nullopt;
  return document;
}

std::map<std::string, std::string> Store::ListPlans() const {
  std::map<std::string, std::string> plans;
  const std::string upper = keys::KindUpperBound(std::string(1, keys::kMetaPlan));
  rocksdb::Slice upper_slice(upper);
  auto it = NewScan(Cf::kMeta, &upper_slice, /*fill_cache=*/true, /*readahead=*/0);
  for (it->Seek(std::string(1, keys::kMetaPlan)); it->Valid(); it->Next()) {
    plans.emplace(it->key().ToString().substr(1), it->value().ToString());
  }
  return plans;
}

std::unique_ptr<rocksdb::Iterator> Store::NewScan(Cf which, const rocksdb::Slice* upper,
                                                  bool fill_cache, size_t readahead) const {
  rocksdb::ReadOptions options;
  options.iterate_upper_bound = upper;
  options.readahead_size = readahead;
  options.fill_cache = fill_cache;
  return std::unique_ptr<rocksdb::Iterator>(db_->NewIterator(options, cf(which)));
}

uint64_t Store::DiskBytes() const {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    std::error_code fec;
    if (entry.is_regular_file(fec)) total += entry.file_size(fec);
  }
  return total;
}

uint64_t Store::CfSstBytes(Cf c) const {
  uint64_t v = 0;
  if (Has(c)) db_->GetIntProperty(cf(c), "rocksdb.total-sst-files-size", &v);
  return v;
}

uint64_t Store::IntProperty(const std::string& property) const {
  uint64_t total = 0;
  for (auto* h : handles_) {
    uint64_t v = 0;
    if (h && db_->GetIntProperty(h, property, &v)) total += v;
  }
  return total;
}

// ---- StoreBatch -------------------------------------------------------------

namespace {
rocksdb::Slice AsSlice(std::string_view v) { return rocksdb::Slice(v.data(), v.size()); }
}  // namespace

rocksdb::ColumnFamilyHandle* StoreBatch::cf(Cf which) const { return store_->cf(which); }

bool StoreBatch::Put(Cf which, const rocksdb::Slice& key, const rocksdb::Slice& value) {
  const bool fresh = !check_existing_ || !store_->Contains(which, key);
  batch_.Put(cf(which), key, value);
  return fresh;
}

void StoreBatch::PutNextRunId(uint64_t next_id) {
  std::string value;
  keys::PutU64(&value, next_id);
  batch_.Put(cf(Cf::kMeta), keys::MetaNextIdKey(), value);
}

void StoreBatch::PutRunMeta(const RunState& run) {
  batch_.Put(cf(Cf::kMeta), keys::MetaRunKey(run.name), RunMetaToJson(run).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void StoreBatch::PutRank(uint64_t run, uint32_t rank, const RankState& state) {
  batch_.Put(cf(Cf::kMeta), keys::MetaRankKey(run, rank), RankToJson(state).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

bool StoreBatch::PutString(uint64_t run, uint64_t id, std::string_view text) {
  return Put(Cf::kStrings, keys::DefKey(run, keys::kStringKind, id), AsSlice(text));
}

bool StoreBatch::PutSite(uint64_t run, uint64_t id, const SiteDef& site) {
  return Put(Cf::kStrings, keys::DefKey(run, keys::kSiteKind, id),
             keys::SiteValue(site.file, site.line, site.function));
}

bool StoreBatch::PutCommunicator(uint64_t run, uint64_t id, std::string_view def) {
  return Put(Cf::kStrings, keys::DefKey(run, keys::kCommunicatorKind, id), AsSlice(def));
}

bool StoreBatch::PutOpChunk(uint64_t run, uint32_t rank, uint32_t lane, uint64_t last_op,
                            std::string_view chunk) {
  char key[keys::kOpKeySize];
  keys::EncodeOpKey(key, run, rank, lane, last_op);
  return Put(Cf::kOps, rocksdb::Slice(key, sizeof key), AsSlice(chunk));
}

void StoreBatch::PutOpCores(uint64_t run, uint32_t rank, uint32_t lane, uint64_t last_op,
                            std::string_view cores) {
  char key[keys::kOpKeySize];
  keys::EncodeOpKey(key, run, rank, lane, last_op);
  batch_.Put(cf(Cf::kCores), rocksdb::Slice(key, sizeof key), AsSlice(cores));
}

void StoreBatch::PutCoresComplete(uint64_t run, uint32_t rank) {
  batch_.Put(cf(Cf::kCores), keys::CoresCompleteKey(run, rank),
             keys::CoresCompleteValue(aligner::kOpEventCoreVersion));
}

void StoreBatch::DeleteCoresComplete(uint64_t run, uint32_t rank) {
  batch_.Delete(cf(Cf::kCores), keys::CoresCompleteKey(run, rank));
}

bool StoreBatch::PutCollective(uint64_t run, uint32_t rank, uint64_t communicator, uint64_t seq,
                               uint8_t phase, std::string_view record) {
  return Put(Cf::kCollectives, keys::CollectiveKey(run, communicator, seq, rank, phase),
             AsSlice(record));
}

bool StoreBatch::PutStep(uint64_t run, uint32_t rank, uint32_t lane, uint64_t step, uint64_t op_index,
                         uint64_t time_ns) {
  return Put(Cf::kEvents, keys::EventKey(run, rank, keys::kStepKind, lane, step),
             keys::StepValue(op_index, time_ns));
}

bool StoreBatch::PutOpGap(uint64_t run, uint32_t rank, uint32_t lane, uint64_t first_op,
                          std::string_view notice) {
  return Put(Cf::kEvents, keys::EventKey(run, rank, keys::kGapKind, lane, first_op),
             AsSlice(notice));
}

bool StoreBatch::PutCollectiveGap(uint64_t run, uint32_t rank, uint64_t communicator,
                                  uint64_t first_seq, std::string_view notice) {
  return Put(Cf::kEvents, keys::CollectiveGapKey(run, rank, communicator, first_seq),
             AsSlice(notice));
}

bool StoreBatch::PutSource(uint64_t run, uint64_t file, std::string_view content) {
  return Put(Cf::kSources, keys::SourceKey(run, file), AsSlice(content));
}

void StoreBatch::PutPlan(std::string_view name, std::string_view document) {
  batch_.Put(cf(Cf::kMeta), keys::MetaPlanKey(name), AsSlice(document));
}

void StoreBatch::DeletePlan(std::string_view name) { batch_.Delete(cf(Cf::kMeta), keys::MetaPlanKey(name)); }

void StoreBatch::DeleteRun(const RunState& run) {
  const std::string begin = keys::RunBegin(run.id), end = keys::RunBegin(run.id + 1);
  for (Cf c : {Cf::kOps, Cf::kCollectives, Cf::kStrings, Cf::kSources, Cf::kEvents, Cf::kCores}) {
    if (store_->Has(c)) batch_.DeleteRange(cf(c), begin, end);
  }
  batch_.Delete(cf(Cf::kMeta), keys::MetaRunKey(run.name));
  for (const auto& [rank, state] : run.ranks) {
    batch_.Delete(cf(Cf::kMeta), keys::MetaRankKey(run.id, rank));
  }
}

}  // namespace opguard::daemon
