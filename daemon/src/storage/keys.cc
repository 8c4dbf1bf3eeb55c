#include "keys.h"

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
  std::string k;
  k.reserve(24);
  PutU64(&k, run);
  PutU32(&k, rank);
  PutU32(&k, lane);
  PutU64(&k, op_index);
  return k;
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

std::string DefKey(uint64_t run, char kind, uint64_t id) {
  std::string k;
  k.reserve(17);
  PutU64(&k, run);
  k.push_back(kind);
  PutU64(&k, id);
  return k;
}

std::string SourceKey(uint64_t run, uint64_t file) {
  std::string k;
  PutU64(&k, run);
  PutU64(&k, file);
  return k;
}

std::string EventKey(uint64_t run, uint32_t rank, char kind, uint32_t lane, uint64_t index) {
  std::string k;
  k.reserve(25);
  PutU64(&k, run);
  PutU32(&k, rank);
  k.push_back(kind);
  PutU32(&k, lane);
  PutU64(&k, index);
  return k;
}

std::string MetaNextIdKey() { return std::string(1, kMetaNextId); }

std::string MetaRunKey(std::string_view name) {
  std::string k(1, kMetaRun);
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

}  // namespace opguard::daemon::keys
