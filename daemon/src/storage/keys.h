// RocksDB key layout (docs/storage.md). Every integer is big-endian so that
// byte order is numeric order: a rank's trace on one lane is one contiguous,
// ordered range, and deleting a run is one DeleteRange per column family over
// the 8-byte run-id prefix. Run ids are assigned by the daemon (monotone, never
// reused), so a run deleted and re-created under the same name cannot meet
// stale records.
//
// Every key (and the small fixed-size values: sites, steps) is built and
// taken apart here and nowhere else. Included by the storage room and by
// query/trace_source for its range scans; everyone else goes through Store.
#pragma once

#include <cstddef>
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
inline constexpr const char* kCores = "cores";      // the ops' event cores, per chunk

// Kinds inside the strings column family, after the run id.
inline constexpr char kStringKind = 's';
inline constexpr char kSiteKind = 't';
inline constexpr char kCommunicatorKind = 'c';
// Kinds inside the events column family, after run id and rank.
inline constexpr char kStepKind = 's';
inline constexpr char kGapKind = 'g';
inline constexpr char kCollectiveGapKind = 'G';  // see CollectiveGapKey
// Meta keys: 'I' next run id; 'N' name -> run meta; 'R' run id | rank -> rank state.
inline constexpr char kMetaNextId = 'I';
inline constexpr char kMetaRun = 'N';
inline constexpr char kMetaRank = 'R';
// 'P' name -> a preflight plan (query/plans.h); sorts between runs and ranks,
// which LoadRegistry's scan passes over.
inline constexpr char kMetaPlan = 'P';

void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
uint32_t GetU32(const char* p);
uint64_t GetU64(const char* p);

// ops: run(8) | rank(4) | lane(4) | op_index(8)
inline constexpr size_t kOpKeySize = 24;
std::string OpKey(uint64_t run, uint32_t rank, uint32_t lane, uint64_t op_index);
// The same key without a heap allocation (ingest writes one per chunk).
void EncodeOpKey(char (&out)[kOpKeySize], uint64_t run, uint32_t rank, uint32_t lane,
                 uint64_t op_index);
// Fields of an op key of kOpKeySize bytes.
uint32_t OpKeyLane(std::string_view key);
uint64_t OpKeyIndex(std::string_view key);
// Prefix of every op of (run, rank, lane).
std::string LanePrefix(uint64_t run, uint32_t rank, uint32_t lane);
// cores: the op key of the chunk whose cores the value holds; and, in front
// of a rank's cores, run(8) | rank(4): the marker that every chunk of the
// rank has its cores there (value: the core version, u32 little-endian).
std::string CoresCompleteKey(uint64_t run, uint32_t rank);
// The marker's value for cores of `version` (aligner::kOpEventCoreVersion).
std::string CoresCompleteValue(uint32_t version);
// collectives: run(8) | communicator(8) | seq(8) | rank(4) | phase(1)
inline constexpr size_t kCollectiveKeySize = 29;
std::string CollectiveKey(uint64_t run, uint64_t communicator, uint64_t seq, uint32_t rank,
                          uint8_t phase);
uint32_t CollectiveKeyRank(std::string_view key);  // of a kCollectiveKeySize key
// strings: run(8) | kind(1) | id(8)
std::string DefKey(uint64_t run, char kind, uint64_t id);
// Prefix of every definition of one kind of `run`.
std::string DefKindPrefix(uint64_t run, char kind);
// sources: run(8) | file string id(8)
std::string SourceKey(uint64_t run, uint64_t file);
// events: run(8) | rank(4) | kind(1) | lane(4) | op index or step(8)
std::string EventKey(uint64_t run, uint32_t rank, char kind, uint32_t lane, uint64_t index);
// events, collective gaps: run(8) | rank(4) | 'G' | communicator(8) | first_seq(8)
std::string CollectiveGapKey(uint64_t run, uint32_t rank, uint64_t communicator, uint64_t first_seq);
// Prefix of every event of one kind of (run, rank).
std::string EventKindPrefix(uint64_t run, uint32_t rank, char kind);
// meta
std::string MetaNextIdKey();
std::string MetaRunKey(std::string_view name);
std::string MetaRankKey(uint64_t run, uint32_t rank);
std::string MetaPlanKey(std::string_view name);
// [RunBegin(run), RunBegin(run + 1)) covers every key of `run` in every data CF.
std::string RunBegin(uint64_t run);
// The first key after every key that starts with `prefix`, whose last byte
// is a kind below 0xff: the upper bound of a scan over one kind.
std::string KindUpperBound(std::string prefix);

// Values of the strings CF kind 't' (site): file(8) | line(4) | function(8).
std::string SiteValue(uint64_t file, uint32_t line, uint64_t function);
bool DecodeSiteValue(std::string_view value, uint64_t* file, uint32_t* line, uint64_t* function);
// Values of the events CF kind 's' (step mark): op_index(8) | time_ns(8).
std::string StepValue(uint64_t op_index, uint64_t time_ns);

}  // namespace opguard::daemon::keys
