#include "storage/op_chunk.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace opguard::daemon {
namespace {

constexpr char kChunkMagic[4] = {'O', 'G', 'C', '1'};
constexpr char kPackedMagic[4] = {'O', 'G', 'Z', '1'};
constexpr size_t kChunkHeader = 8;    // magic | count
constexpr size_t kChunkEntry = 16;    // op_index | offset | size
constexpr size_t kPackedHeader = 12;  // magic | codec | raw size
// Larger than any chunk ingest writes (at most kOpChunkMaxBytes plus one
// record of at most ingest.max_message_bytes): a bound on what a damaged
// header can make a reader allocate.
constexpr uint32_t kMaxRawChunk = 1u << 30;
// ZSTD level for ChunkCodec::kZstd: the fastest regular level (ingest runs it
// on every chunk, on the daemon's one ingest thread).
constexpr int kZstdLevel = 1;

void PutLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void PutLe64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t GetLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{u[0]} | (uint32_t{u[1]} << 8) | (uint32_t{u[2]} << 16) | (uint32_t{u[3]} << 24);
}
uint64_t GetLe64(const char* p) { return uint64_t{GetLe32(p)} | (uint64_t{GetLe32(p + 4)} << 32); }

constexpr size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }

bool IsPlainChunk(std::string_view value) {
  return value.size() >= kChunkHeader && std::memcmp(value.data(), kChunkMagic, 4) == 0;
}
bool IsPackedChunk(std::string_view value) {
  return value.size() >= kPackedHeader && std::memcmp(value.data(), kPackedMagic, 4) == 0;
}

}  // namespace

bool IsOpChunk(std::string_view value) { return IsPlainChunk(value) || IsPackedChunk(value); }

ChunkCodec ChunkCodecByName(const std::string& name) {
  if (name == "lz4" || name == "snappy") return ChunkCodec::kLz4;
  if (name == "zstd") return ChunkCodec::kZstd;
  return ChunkCodec::kNone;
}

struct OpChunkWriter::Codecs {
  std::vector<uint64_t> lz4_state;  // LZ4_sizeofState() bytes, 8-aligned
  ZSTD_CCtx* zstd = nullptr;
  ~Codecs() { ZSTD_freeCCtx(zstd); }
};

OpChunkWriter::OpChunkWriter() : records_(kHeadRoom, '\0') {
  static_assert(kHeadRoom == Align8(kChunkHeader + kChunkEntry * kOpChunkMaxRecords));
}
OpChunkWriter::~OpChunkWriter() = default;
OpChunkWriter::OpChunkWriter(OpChunkWriter&&) noexcept = default;
OpChunkWriter& OpChunkWriter::operator=(OpChunkWriter&&) noexcept = default;

void OpChunkWriter::Clear() {
  entries_.clear();
  records_.resize(kHeadRoom);
}

void OpChunkWriter::Add(uint64_t op_index, const uint8_t* data, size_t size) {
  uint8_t* p = Reserve(op_index, size);
  if (size != 0) std::memcpy(p, data, size);
}

uint8_t* OpChunkWriter::Reserve(uint64_t op_index, size_t size) {
  const size_t at = records_.size();
  entries_.push_back(
      {op_index, static_cast<uint32_t>(at - kHeadRoom), static_cast<uint32_t>(size)});
  records_.resize(Align8(at + size), '\0');
  return reinterpret_cast<uint8_t*>(records_.data() + at);
}

std::string_view OpChunkWriter::Finish(ChunkCodec codec) {
  const size_t head = Align8(kChunkHeader + kChunkEntry * entries_.size());
  const size_t body = record_bytes();
  char* p = nullptr;
  if (head <= kHeadRoom) {
    p = records_.data() + (kHeadRoom - head);  // both multiples of 8: records keep their phase
  } else {  // more entries than Accepts() lets in: copy behind a header
    out_.resize(head + body);
    p = out_.data();
    std::memcpy(p + head, records_.data() + kHeadRoom, body);
  }
  std::memcpy(p, kChunkMagic, 4);
  PutLe32(p + 4, static_cast<uint32_t>(entries_.size()));
  char* e = p + kChunkHeader;
  for (const Entry& entry : entries_) {
    PutLe64(e, entry.op_index);
    PutLe32(e + 8, static_cast<uint32_t>(head + entry.offset));
    PutLe32(e + 12, entry.size);
    e += kChunkEntry;
  }
  std::memset(e, 0, static_cast<size_t>(p + head - e));
  const std::string_view raw(p, head + body);
  if (codec == ChunkCodec::kNone || raw.size() > kMaxRawChunk) return raw;

  if (!codecs_) codecs_ = std::make_unique<Codecs>();
  size_t bound = 0;
  if (codec == ChunkCodec::kLz4) {
    bound = static_cast<size_t>(LZ4_compressBound(static_cast<int>(raw.size())));
  } else {
    bound = ZSTD_compressBound(raw.size());
  }
  packed_.resize(kPackedHeader + bound);
  char* q = packed_.data();
  std::memcpy(q, kPackedMagic, 4);
  PutLe32(q + 4, static_cast<uint32_t>(codec));
  PutLe32(q + 8, static_cast<uint32_t>(raw.size()));
  size_t packed = 0;
  if (codec == ChunkCodec::kLz4) {
    if (codecs_->lz4_state.empty()) {
      codecs_->lz4_state.resize((static_cast<size_t>(LZ4_sizeofState()) + 7) / 8);
    }
    const int n =
        LZ4_compress_fast_extState(codecs_->lz4_state.data(), raw.data(), q + kPackedHeader,
                                   static_cast<int>(raw.size()), static_cast<int>(bound), 1);
    packed = n > 0 ? static_cast<size_t>(n) : 0;
  } else {
    if (codecs_->zstd == nullptr) codecs_->zstd = ZSTD_createCCtx();
    const size_t n = codecs_->zstd == nullptr
                         ? 0
                         : ZSTD_compressCCtx(codecs_->zstd, q + kPackedHeader, bound, raw.data(),
                                             raw.size(), kZstdLevel);
    packed = ZSTD_isError(n) ? 0 : n;
  }
  if (packed == 0) return raw;  // cannot happen with a bound-sized buffer; store it plain
  packed_.resize(kPackedHeader + packed);
  return packed_;
}

namespace {

// Decompresses a packed chunk into `storage` (8-aligned); false if damaged.
bool Unpack(std::string_view value, std::vector<uint64_t>* storage, size_t* raw_size) {
  const uint32_t codec = GetLe32(value.data() + 4);
  const uint32_t raw = GetLe32(value.data() + 8);
  if (raw < kChunkHeader || raw > kMaxRawChunk) return false;
  storage->resize((raw + 7) / 8);
  char* dst = reinterpret_cast<char*>(storage->data());
  const char* src = value.data() + kPackedHeader;
  const size_t src_size = value.size() - kPackedHeader;
  if (codec == static_cast<uint32_t>(ChunkCodec::kLz4)) {
    if (src_size > static_cast<size_t>(INT32_MAX)) return false;
    const int n = LZ4_decompress_safe(src, dst, static_cast<int>(src_size), static_cast<int>(raw));
    if (n < 0 || static_cast<uint32_t>(n) != raw) return false;
  } else if (codec == static_cast<uint32_t>(ChunkCodec::kZstd)) {
    thread_local std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(),
                                                                         ZSTD_freeDCtx);
    if (!dctx) return false;
    const size_t n = ZSTD_decompressDCtx(dctx.get(), dst, raw, src, src_size);
    if (ZSTD_isError(n) || n != raw) return false;
  } else {
    return false;
  }
  *raw_size = raw;
  return true;
}

}  // namespace

bool OpChunkView::Open(uint64_t key_op, std::string_view value, bool copy) {
  ops_.clear();
  records_.clear();
  const char* data = value.data();
  if (IsPackedChunk(value)) {
    size_t raw = 0;
    if (!Unpack(value, &storage_, &raw)) return false;
    data = reinterpret_cast<const char*>(storage_.data());
    value = std::string_view(data, raw);
    if (!IsPlainChunk(value)) return false;
  } else if (copy || reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    storage_.resize((value.size() + 7) / 8);
    if (!value.empty()) std::memcpy(storage_.data(), value.data(), value.size());
    data = reinterpret_cast<const char*>(storage_.data());
  }
  if (!IsPlainChunk(value)) {
    ops_.push_back(key_op);
    records_.emplace_back(data, value.size());
    return true;
  }
  const uint32_t count = GetLe32(data + 4);
  if (count == 0 || count > (value.size() - kChunkHeader) / kChunkEntry) return false;
  ops_.reserve(count);
  records_.reserve(count);
  const char* e = data + kChunkHeader;
  for (uint32_t i = 0; i < count; ++i, e += kChunkEntry) {
    const uint64_t op = GetLe64(e);
    const uint32_t offset = GetLe32(e + 8), size = GetLe32(e + 12);
    if (offset % 8 != 0 || offset > value.size() || size > value.size() - offset) return false;
    if (!ops_.empty() && op <= ops_.back()) return false;
    ops_.push_back(op);
    records_.emplace_back(data + offset, size);
  }
  // The key is the last op of the chunk; anything else is not a chunk we wrote.
  return ops_.back() == key_op;
}

size_t OpChunkView::LowerBound(uint64_t op) const {
  return static_cast<size_t>(std::lower_bound(ops_.begin(), ops_.end(), op) - ops_.begin());
}

}  // namespace opguard::daemon
