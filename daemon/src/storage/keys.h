// RocksDB key layout (docs/storage.md). Every integer is big-endian so that
// byte order is numeric order: a rank's trace on one lane is one contiguous,
// ordered range, and deleting a run is one DeleteRange per column family over
// the 8-byte run-id prefix. Run ids are assigned by the daemon (monotone, never
// reused), so a run deleted and re-created under the same name cannot meet
// stale records.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace opguard::daemon::keys {

// Column families, in the order Store opens them.
inline constexpr const char* kOps = "ops";
inline constexpr const char* kCollectives = "collectives";
inline constexpr const char* kStrings = "strings";  // strings, sites, communicators
inline constexpr const char* kSources = "sources";
inline constexpr const char* kEvents = "events";    // step marks, gap notices
inline constexpr const char* kMeta = "meta";        // run registry, per-rank state

// Kinds inside the strings column family, after the run id.
inline constexpr char kStringKind = 's';
inline constexpr char kSiteKind = 't';
inline constexpr char kCommunicatorKind = 'c';
// Kinds inside the events column family, after run id and rank.
inline constexpr char kStepKind = 's';
inline constexpr char kGapKind = 'g';
// Collective gaps: run(8) | rank(4) | 'G' | communicator(8) | first_seq(8).
inline constexpr char kCollectiveGapKind = 'G';
// Meta keys: 'I' next run id; 'N' name -> run meta; 'R' run id | rank -> rank state.
inline constexpr char kMetaNextId = 'I';
inline constexpr char kMetaRun = 'N';
inline constexpr char kMetaRank = 'R';

void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
uint32_t GetU32(const char* p);
uint64_t GetU64(const char* p);

// ops: run(8) | rank(4) | lane(4) | op_index(8)
std::string OpKey(uint64_t run, uint32_t rank, uint32_t lane, uint64_t op_index);
// Prefix of every op of (run, rank, lane).
std::string LanePrefix(uint64_t run, uint32_t rank, uint32_t lane);
// collectives: run(8) | communicator(8) | seq(8) | rank(4) | phase(1)
std::string CollectiveKey(uint64_t run, uint64_t communicator, uint64_t seq, uint32_t rank,
                          uint8_t phase);
// strings: run(8) | kind(1) | id(8)
std::string DefKey(uint64_t run, char kind, uint64_t id);
// sources: run(8) | file string id(8)
std::string SourceKey(uint64_t run, uint64_t file);
// events: run(8) | rank(4) | kind(1) | lane(4) | op index or step(8)
std::string EventKey(uint64_t run, uint32_t rank, char kind, uint32_t lane, uint64_t index);
// meta
std::string MetaNextIdKey();
std::string MetaRunKey(std::string_view name);
std::string MetaRankKey(uint64_t run, uint32_t rank);
// [RunBegin(run), RunBegin(run + 1)) covers every key of `run` in every data CF.
std::string RunBegin(uint64_t run);

}  // namespace opguard::daemon::keys
