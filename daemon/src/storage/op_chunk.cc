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
constexpr char kCoresMagic[4] = {'O', 'G', 'E', '1'};
constexpr size_t kChunkHeader = 8;    // magic | count
constexpr size_t kChunkEntry = 16;    // op_index | offset | size
constexpr size_t kPackedHeader = 12;  // magic | codec | raw size
constexpr size_t kCoresHeader = 16;   // magic | core version | block size | 0
constexpr size_t kCoresBlockHeader = 16;  // codec | count | raw size | stored size
constexpr size_t kCoreU64Columns = 9;     // op_index ... inputs hi
constexpr size_t kCoreBytes = 8 * kCoreU64Columns + 1;  // + flags
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
bool HasCores(std::string_view value) {
  return value.size() >= kCoresHeader && std::memcmp(value.data(), kCoresMagic, 4) == 0;
}
// The chunk behind the cores; false when the framing is damaged.
bool SkipCores(std::string_view* value) {
  const uint32_t block = GetLe32(value->data() + 8);
  if (block % 8 != 0 || block > value->size() - kCoresHeader) return false;
  value->remove_prefix(kCoresHeader + block);
  return true;
}

}  // namespace

bool IsOpChunk(std::string_view value) {
  return IsPlainChunk(value) || IsPackedChunk(value) || HasCores(value);
}

ChunkCodec ChunkCodecByName(const std::string& name) {
  if (name == "lz4" || name == "snappy") return ChunkCodec::kLz4;
  if (name == "zstd") return ChunkCodec::kZstd;
  return ChunkCodec::kNone;
}

struct OpChunkWriter::Codecs {
  std::vector<uint64_t> lz4_state;  // LZ4_sizeofState() bytes, 8-aligned
  ZSTD_CCtx* zstd = nullptr;
  ~Codecs() { ZSTD_freeCCtx(zstd); }

  static size_t Bound(ChunkCodec codec, size_t raw) {
    return codec == ChunkCodec::kLz4 ? static_cast<size_t>(LZ4_compressBound(static_cast<int>(raw)))
                                     : ZSTD_compressBound(raw);
  }
  // Compresses `raw` into `dst` (Bound bytes); 0 on failure.
  size_t Compress(ChunkCodec codec, std::string_view raw, char* dst, size_t bound) {
    if (codec == ChunkCodec::kLz4) {
      if (lz4_state.empty()) lz4_state.resize((static_cast<size_t>(LZ4_sizeofState()) + 7) / 8);
      const int n = LZ4_compress_fast_extState(lz4_state.data(), raw.data(), dst,
                                               static_cast<int>(raw.size()), static_cast<int>(bound), 1);
      return n > 0 ? static_cast<size_t>(n) : 0;
    }
    if (zstd == nullptr) zstd = ZSTD_createCCtx();
    const size_t n = zstd == nullptr ? 0 : ZSTD_compressCCtx(zstd, dst, bound, raw.data(), raw.size(), kZstdLevel);
    return ZSTD_isError(n) ? 0 : n;
  }
};

OpChunkWriter::OpChunkWriter() : records_(kHeadRoom, '\0') {
  static_assert(kHeadRoom == Align8(kChunkHeader + kChunkEntry * kOpChunkMaxRecords));
}
OpChunkWriter::~OpChunkWriter() = default;
OpChunkWriter::OpChunkWriter(OpChunkWriter&&) noexcept = default;
OpChunkWriter& OpChunkWriter::operator=(OpChunkWriter&&) noexcept = default;

void OpChunkWriter::Clear() {
  entries_.clear();
  cores_.clear();
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
  std::string_view chunk = raw;
  if (codec != ChunkCodec::kNone && raw.size() <= kMaxRawChunk) {
    if (!codecs_) codecs_ = std::make_unique<Codecs>();
    const size_t bound = Codecs::Bound(codec, raw.size());
    packed_.resize(kPackedHeader + bound);
    char* q = packed_.data();
    std::memcpy(q, kPackedMagic, 4);
    PutLe32(q + 4, static_cast<uint32_t>(codec));
    PutLe32(q + 8, static_cast<uint32_t>(raw.size()));
    // 0 cannot happen with a bound-sized buffer; the chunk is then stored plain.
    if (const size_t packed = codecs_->Compress(codec, raw, q + kPackedHeader, bound); packed != 0) {
      packed_.resize(kPackedHeader + packed);
      chunk = packed_;
    }
  }
  return cores_.size() == entries_.size() ? WithCores(codec, chunk) : chunk;
}

std::string_view OpChunkWriter::FinishCores(ChunkCodec codec) {
  if (cores_.empty() || cores_.size() != entries_.size()) return {};
  const std::string_view cores = WithCores(codec, {});
  cores_.clear();
  return cores;
}

std::string_view OpChunkWriter::WithCores(ChunkCodec codec, std::string_view chunk) {
  // Columns, so that the compressor finds the repeats (steps, names, sites,
  // keys; op indices differ in their low byte only); the digests are random.
  const size_t n = cores_.size();
  cores_raw_.resize(n * kCoreBytes);
  char* col = cores_raw_.data();
  auto column = [&](auto&& field) {
    for (const aligner::OpEventCore& c : cores_) {
      PutLe64(col, field(c));
      col += 8;
    }
  };
  column([](const aligner::OpEventCore& c) { return c.op_index; });
  column([](const aligner::OpEventCore& c) { return c.step; });
  column([](const aligner::OpEventCore& c) { return c.name; });
  column([](const aligner::OpEventCore& c) { return c.site; });
  column([](const aligner::OpEventCore& c) { return c.siteless_key; });
  column([](const aligner::OpEventCore& c) { return c.outputs.lo; });
  column([](const aligner::OpEventCore& c) { return c.outputs.hi; });
  column([](const aligner::OpEventCore& c) { return c.inputs.lo; });
  column([](const aligner::OpEventCore& c) { return c.inputs.hi; });
  for (const aligner::OpEventCore& c : cores_) *col++ = static_cast<char>(c.flags);

  const size_t bound = codec == ChunkCodec::kNone ? n * kCoreBytes : Codecs::Bound(codec, n * kCoreBytes);
  framed_.resize(kCoresHeader + kCoresBlockHeader + Align8(bound) + chunk.size());
  char* f = framed_.data();
  char* data = f + kCoresHeader + kCoresBlockHeader;
  size_t stored = 0;
  if (codec != ChunkCodec::kNone) {
    if (!codecs_) codecs_ = std::make_unique<Codecs>();
    stored = codecs_->Compress(codec, cores_raw_, data, bound);
  }
  ChunkCodec used = codec;
  if (stored == 0) {  // no codec (or a failed one): the columns as they are
    used = ChunkCodec::kNone;
    stored = n * kCoreBytes;
    std::memcpy(data, cores_raw_.data(), stored);
  }
  const size_t block = kCoresBlockHeader + Align8(stored);
  std::memset(data + stored, 0, Align8(stored) - stored);
  std::memcpy(f, kCoresMagic, 4);
  PutLe32(f + 4, aligner::kOpEventCoreVersion);
  PutLe32(f + 8, static_cast<uint32_t>(block));
  PutLe32(f + 12, 0);
  PutLe32(f + 16, static_cast<uint32_t>(used));
  PutLe32(f + 20, static_cast<uint32_t>(n));
  PutLe32(f + 24, static_cast<uint32_t>(n * kCoreBytes));
  PutLe32(f + 28, static_cast<uint32_t>(stored));
  if (!chunk.empty()) std::memcpy(f + kCoresHeader + block, chunk.data(), chunk.size());
  framed_.resize(kCoresHeader + block + chunk.size());
  return framed_;
}

namespace {

// Decompresses `src` of `codec` into exactly `raw` bytes at `dst`.
bool Decompress(uint32_t codec, std::string_view src, char* dst, uint32_t raw) {
  if (codec == static_cast<uint32_t>(ChunkCodec::kLz4)) {
    if (src.size() > static_cast<size_t>(INT32_MAX) || raw > static_cast<uint32_t>(INT32_MAX)) return false;
    const int n = LZ4_decompress_safe(src.data(), dst, static_cast<int>(src.size()), static_cast<int>(raw));
    return n >= 0 && static_cast<uint32_t>(n) == raw;
  }
  if (codec == static_cast<uint32_t>(ChunkCodec::kZstd)) {
    thread_local std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx(ZSTD_createDCtx(),
                                                                         ZSTD_freeDCtx);
    if (!dctx) return false;
    const size_t n = ZSTD_decompressDCtx(dctx.get(), dst, raw, src.data(), src.size());
    return !ZSTD_isError(n) && n == raw;
  }
  return false;
}

// Decompresses a packed chunk into `storage` (8-aligned); false if damaged.
bool Unpack(std::string_view value, std::vector<uint64_t>* storage, size_t* raw_size) {
  const uint32_t codec = GetLe32(value.data() + 4);
  const uint32_t raw = GetLe32(value.data() + 8);
  if (raw < kChunkHeader || raw > kMaxRawChunk) return false;
  storage->resize((raw + 7) / 8);
  if (!Decompress(codec, value.substr(kPackedHeader), reinterpret_cast<char*>(storage->data()), raw)) {
    return false;
  }
  *raw_size = raw;
  return true;
}

}  // namespace

bool OpChunkView::Open(uint64_t key_op, std::string_view value, bool copy) {
  ops_.clear();
  records_.clear();
  if (HasCores(value) && !SkipCores(&value)) return false;
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

OpChunkView::Cores OpChunkView::OpenCores(uint64_t key_op, std::string_view value) {
  cores_.clear();
  if (!HasCores(value)) return Cores::kAbsent;
  if (GetLe32(value.data() + 4) != aligner::kOpEventCoreVersion) return Cores::kAbsent;
  std::string_view chunk = value;
  if (!SkipCores(&chunk)) return Cores::kDamaged;
  const std::string_view block = value.substr(kCoresHeader, value.size() - kCoresHeader - chunk.size());
  if (block.size() < kCoresBlockHeader) return Cores::kDamaged;
  const uint32_t codec = GetLe32(block.data()), count = GetLe32(block.data() + 4);
  const uint32_t raw = GetLe32(block.data() + 8), stored = GetLe32(block.data() + 12);
  if (count == 0 || count > kMaxRawChunk / kCoreBytes || raw != count * kCoreBytes ||
      stored > block.size() - kCoresBlockHeader ||
      kCoresBlockHeader + Align8(stored) != block.size()) {
    return Cores::kDamaged;
  }
  const std::string_view data = block.substr(kCoresBlockHeader, stored);
  const char* col = data.data();
  if (codec != static_cast<uint32_t>(ChunkCodec::kNone)) {
    storage_.resize((raw + 7) / 8);
    if (!Decompress(codec, data, reinterpret_cast<char*>(storage_.data()), raw)) return Cores::kDamaged;
    col = reinterpret_cast<const char*>(storage_.data());
  } else if (stored != raw) {
    return Cores::kDamaged;
  }
  cores_.resize(count);
  auto column = [&](auto&& field) {
    for (aligner::OpEventCore& c : cores_) {
      field(c) = GetLe64(col);
      col += 8;
    }
  };
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.op_index; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.step; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.name; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.site; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.siteless_key; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.outputs.lo; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.outputs.hi; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.inputs.lo; });
  column([](aligner::OpEventCore& c) -> uint64_t& { return c.inputs.hi; });
  for (aligner::OpEventCore& c : cores_) c.flags = static_cast<uint8_t>(*col++);
  // Like the records: strictly ascending, the key's op last.
  for (size_t i = 1; i < cores_.size(); ++i) {
    if (cores_[i].op_index <= cores_[i - 1].op_index) return Cores::kDamaged;
  }
  return cores_.back().op_index == key_op ? Cores::kRead : Cores::kDamaged;
}

size_t OpChunkView::LowerBound(uint64_t op) const {
  return static_cast<size_t>(std::lower_bound(ops_.begin(), ops_.end(), op) - ops_.begin());
}

}  // namespace opguard::daemon
