#include "storage/keys.h"

namespace opguard::daemon::keys {

void PutU32(std::string* out, uint32_t v) {
  char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
               static_cast<char>(v)};
  out->append(b, 4);
}

void PutU64(std::string* out, uint64_t v) {
  PutU32(out, static_cast<uint32_t>(v >> 32));
  PutU32(out, static_cast<uint32_t>(v));
}

uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

uint64_t GetU64(const char* p) { return (uint64_t{GetU32(p)} << 32) | GetU32(p + 4); }

std::string OpKey(uint64_t run, uint32_t rank, uint32_t lane, uint64_t op_index) {
  char k[kOpKeySize];
  EncodeOpKey(k, run, rank, lane, op_index);
  return std::string(k, sizeof k);
}

void EncodeOpKey(char (&out)[kOpKeySize], uint64_t run, uint32_t rank, uint32_t lane,
                 uint64_t op_index) {
  auto put32 = [](char* p, uint32_t v) {
    p[0] = static_cast<char>(v >> 24);
    p[1] = static_cast<char>(v >> 16);
    p[2] = static_cast<char>(v >> 8);
    p[3] = static_cast<char>(v);
  };
  put32(out, static_cast<uint32_t>(run >> 32));
  put32(out + 4, static_cast<uint32_t>(run));
  put32(out + 8, rank);
  put32(out + 12, lane);
  put32(out + 16, static_cast<uint32_t>(op_index >> 32));
  put32(out + 20, static_cast<uint32_t>(op_index));
}

uint32_t OpKeyLane(std::string_view key) { return GetU32(key.data() + 12); }
uint64_t OpKeyIndex(std::string_view key) { return GetU64(key.data() + 16); }

std::string CoresCompleteKey(uint64_t run, uint32_t rank) {
  std::string k = RunBegin(run);
  PutU32(&k, rank);
  return k;
}

std::string CoresCompleteValue(uint32_t version) {
  std::string v(4, '\0');
  for (int i = 0; i < 4; ++i) v[i] = static_cast<char>(version >> (8 * i));  // little-endian
  return v;
}

std::string LanePrefix(uint64_t run, uint32_t rank, uint32_t lane) {
  std::string k;
  k.reserve(16);
  PutU64(&k, run);
  PutU32(&k, rank);
  PutU32(&k, lane);
  return k;
}

std::string CollectiveKey(uint64_t run, uint64_t communicator, uint64_t seq, uint32_t rank,
                          uint8_t phase) {
  std::string k;
  k.reserve(29);
  PutU64(&k, run);
  PutU64(&k, communicator);
  PutU64(&k, seq);
  PutU32(&k, rank);
  k.push_back(static_cast<char>(phase));
  return k;
}

uint32_t CollectiveKeyRank(std::string_view key) { return GetU32(key.data() + 24); }

std::string DefKey(uint64_t run, char kind, uint64_t id) {
  std::string k = DefKindPrefix(run, kind);
  PutU64(&k, id);
  return k;
}

std::string DefKindPrefix(uint64_t run, char kind) {
  std::string k = RunBegin(run);
  k.push_back(kind);
  return k;
}

std::string SourceKey(uint64_t run, uint64_t file) {
  std::string k = RunBegin(run);
  PutU64(&k, file);
  return k;
}

std::string EventKey(uint64_t run, uint32_t rank, char kind, uint32_t lane, uint64_t index) {
  std::string k = EventKindPrefix(run, rank, kind);
  PutU32(&k, lane);
  PutU64(&k, index);
  return k;
}

std::string CollectiveGapKey(uint64_t run, uint32_t rank, uint64_t communicator, uint64_t first_seq) {
  std::string k = EventKindPrefix(run, rank, kCollectiveGapKind);
  PutU64(&k, communicator);
  PutU64(&k, first_seq);
  return k;
}

std::string EventKindPrefix(uint64_t run, uint32_t rank, char kind) {
  std::string k = RunBegin(run);
  PutU32(&k, rank);
  k.push_back(kind);
  return k;
}

std::string MetaNextIdKey() { return std::string(1, kMetaNextId); }

std::string MetaRunKey(std::string_view name) {
  std::string k(1, kMetaRun);
  k.append(name);
  return k;
}

std::string MetaPlanKey(std::string_view name) {
  std::string k(1, kMetaPlan);
  k.append(name);
  return k;
}

std::string MetaRankKey(uint64_t run, uint32_t rank) {
  std::string k(1, kMetaRank);
  PutU64(&k, run);
  PutU32(&k, rank);
  return k;
}

std::string RunBegin(uint64_t run) {
  std::string k;
  PutU64(&k, run);
  return k;
}

std::string KindUpperBound(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

std::string SiteValue(uint64_t file, uint32_t line, uint64_t function) {
  std::string v;
  PutU64(&v, file);
  PutU32(&v, line);
  PutU64(&v, function);
  return v;
}

bool DecodeSiteValue(std::string_view value, uint64_t* file, uint32_t* line, uint64_t* function) {
  if (value.size() != 20) return false;
  *file = GetU64(value.data());
  *line = GetU32(value.data() + 8);
  *function = GetU64(value.data() + 12);
  return true;
}

std::string StepValue(uint64_t op_index, uint64_t time_ns) {
  std::string v;
  PutU64(&v, op_index);
  PutU64(&v, time_ns);
  return v;
}

}  // namespace opguard::daemon::keys
