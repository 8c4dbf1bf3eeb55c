// The aligner's inputs read from this daemon's RocksDB (docs/alignment.md,
// "Input model"; key layout in keys.h).
//
//  * LoadRankTrace streams each (rank, lane) range of the ops column family
//    into compact OpEvents, so memory is ~80 bytes per op whatever the
//    record sizes: from the event cores ingest stored with each chunk
//    (op_chunk.h; only the site's share of the structural key is added),
//    or, for a value without them, one verified OpRecord at a time turned
//    into an OpDetail scratch value and reduced by aligner::MakeOpEventCore.
//  * Gaps come from the events column family ('g' op gaps; 'G' collective
//    gaps are returned separately because the aligner's Gap is per lane).
//  * Collectives come from the collectives column family, which is ordered by
//    (communicator, seq, rank): one scan per run serves every rank.
//  * StoreDetails / StoreStrings implement DetailSource / StringResolver with
//    point lookups, for pivots and report rendering only.
//
// Everything here is a read of a consistent RocksDB view at call time; a run
// still being written is read as far as it is durable. Called from the
// aligner worker threads; objects are used by one thread at a time.
//
// Private to the query room (cluster.cc; tests).
#pragma once

#include <rocksdb/iterator.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "opguard/aligner/trace.h"
#include "opguard/common/cancel.h"
#include "opguard/common/status.h"
#include "opguard/idl/envelope.h"
#include "storage/op_chunk.h"
#include "storage/store.h"

namespace opguard::daemon {

// Ops, op gaps and (when `with_collectives`) this rank's collectives.
// `cancel`, when set, is checked at every stored chunk (at most 256
// records): a cancelled scan stops with the token's error.
Result<aligner::RankTrace> LoadRankTrace(const Store& store, uint64_t run, uint32_t rank,
                                         bool with_collectives,
                                         const CancelToken* cancel = nullptr);

struct CollectiveGapRange {
  uint32_t rank = 0;
  uint64_t communicator = 0;
  uint64_t first_seq = 0;
  uint64_t last_seq = 0;
};

// Every collective record of `run`, by rank (both phases, as stored).
Result<std::map<uint32_t, std::vector<aligner::CollectiveEvent>>> LoadCollectives(
    const Store& store, uint64_t run);
// Collective-gap notices of `ranks` of `run`.
Result<std::vector<CollectiveGapRange>> LoadCollectiveGaps(const Store& store, uint64_t run,
                                                           const std::vector<uint32_t>& ranks);
// Communicator definitions of `run` (the strings column family, kind 'c').
Result<std::vector<aligner::Communicator>> LoadCommunicators(const Store& store, uint64_t run);

class StoreStrings;

// Site id -> aligner::BoundaryId (file base name, function, text of the
// source line), from the run's site and string definitions and the source
// files it sent; cached per site and per file. 0 for site 0 or a site the run
// never defined (the structural key then uses the site id itself).
class SiteBoundaries {
 public:
  SiteBoundaries(const Store* store, uint64_t run);
  ~SiteBoundaries();
  uint64_t Of(uint64_t site);

 private:
  const std::vector<std::string>* Lines(uint64_t file);

  const Store* store_;
  uint64_t run_;
  std::unique_ptr<StoreStrings> strings_;
  std::unordered_map<uint64_t, uint64_t> by_site_;
  std::unordered_map<uint64_t, std::optional<std::vector<std::string>>> files_;
};

// One consistent view of a run's ops: the traces LoadRank returns and the
// full records Find returns come from the same RocksDB iterator, so a run
// still being written cannot change between the scan and the pivot lookup.
// It also matters for speed: the ops memtable is a vector that RocksDB sorts
// (a copy) for every new iterator and every Get, so one iterator per run
// replaces a sort per lookup.
class StoreDetails final : public aligner::DetailSource {
 public:
  StoreDetails(const Store* store, uint64_t run);
  ~StoreDetails() override;

  // Ops and op gaps of one rank (collectives are attached by the caller).
  // `expected_ops` (the registry's count, 0: unknown) sizes the lanes once.
  Result<aligner::RankTrace> LoadRank(uint32_t rank, const CancelToken* cancel = nullptr,
                                      uint64_t expected_ops = 0);
  std::optional<aligner::OpDetail> Find(uint32_t rank, uint32_t lane,
                                        uint64_t op_index) const override;

 private:
  class TraceBuilder;
  Result<bool> LoadCores(uint32_t rank, const CancelToken* cancel, uint64_t expected_ops,
                         aligner::RankTrace* trace);
  Status LoadChunks(uint32_t rank, const CancelToken* cancel, uint64_t expected_ops,
                    aligner::RankTrace* trace);
  const Store* store_;
  uint64_t run_;
  SiteBoundaries boundaries_;
  std::string upper_;
  rocksdb::Slice upper_slice_;
  mutable std::mutex mu_;
  std::unique_ptr<rocksdb::Iterator> it_;
  std::unique_ptr<rocksdb::Iterator> cores_it_;  // LoadCores', made on first use
  // Find's last decoded chunk (its key), under mu_.
  mutable std::string cached_key_;
  mutable bool cached_valid_ = false;
  mutable OpChunkView chunk_;
};

// Strings and sites of one run, cached (a report resolves the same few ids
// many times).
class StoreStrings final : public aligner::StringResolver {
 public:
  StoreStrings(const Store* store, uint64_t run) : store_(store), run_(run) {}
  std::optional<std::string> String(uint64_t id) const override;
  std::optional<Site> SiteOf(uint64_t site_id) const override;

 private:
  const Store* store_;
  uint64_t run_;
  mutable std::mutex mu_;
  mutable std::unordered_map<uint64_t, std::optional<std::string>> strings_;
  mutable std::unordered_map<uint64_t, std::optional<Site>> sites_;
};

}  // namespace opguard::daemon
