// The value format of the ops column family (docs/storage.md): op chunks.
//
// Included by the storage room and by ingest (which fills OpChunkWriters) and
// query/trace_source (which reads chunks through OpChunkView).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "opguard/aligner/trace.h"

namespace opguard::daemon {

// Consecutive records of one (run, rank, lane) from one batch are stored as ONE
// value, keyed by the op_index of the LAST record in it (docs/storage.md), so
// a forward Seek(op key) lands on the only chunk that can hold that op.
//
//   "OGC1" | count u32 | count x { op_index u64 | offset u32 | size u32 }
//   | records, each an OpRecord FlatBuffers root starting 8-aligned
//
// (integers little-endian; offsets from the start of the value). Ingest stores
// it compressed, wrapped as
//
//   "OGZ1" | codec u32 (1 = LZ4, 2 = ZSTD) | raw size u32 | compressed chunk
//
// so the WAL, the memtable and the blob file all carry the compressed bytes
// and the chunk is compressed exactly once. In front of that, ingest stores
// the records' event cores (aligner::OpEventCore: what a trace scan needs of
// each record, computed once when it arrived):
//
//   "OGE1" | core version u32 | block size u32 | 0 u32
//   | block: codec u32 | count u32 | raw size u32 | stored size u32 | cores
//     (compressed with the chunk's codec, zero-padded to 8 bytes)
//   | the chunk as above ("OGZ1" or "OGC1")
//
// where the raw cores are columns of `count` entries: op_index, step, name,
// site, siteless key, outputs lo, outputs hi, inputs lo, inputs hi (u64
// each), then flags (u8 each). Pivots and pages skip them and read the
// records. That layout (cores in front of the chunk) is what stores written
// before the `cores` column family hold; ingest now stores the cores alone
// ("OGE1" ... block, with nothing behind) under the chunk's key in the
// `cores` column family, so that a trace scan reads no chunk at all.
// A value that starts with none of the magics is a single record (one
// OpRecord root per key, the key's op_index); readers accept all of them.
// For records of typical size (~300 bytes) the byte limit ends a chunk, at
// ~200 records. Larger chunks compress better (real-shim records: 97 -> 89.5
// bytes on disk per record, so ~8% fewer bytes through the WAL, the memtable
// and the blob files, at the same LZ4 CPU per byte; most of it because LZ4
// hashes 5-byte sequences for inputs over 64 KiB, 4-byte ones below). 64 KiB
// bounds what a point lookup decodes; 128 KiB would save only ~4% more.
inline constexpr size_t kOpChunkMaxRecords = 256;
inline constexpr size_t kOpChunkMaxBytes = 64 << 10;

enum class ChunkCodec : uint32_t { kNone = 0, kLz4 = 1, kZstd = 2 };
// "lz4" (also for "snappy"), "zstd", anything else: none.
ChunkCodec ChunkCodecByName(const std::string& name);

class OpChunkWriter {
 public:
  OpChunkWriter();
  ~OpChunkWriter();
  OpChunkWriter(OpChunkWriter&&) noexcept;
  OpChunkWriter& operator=(OpChunkWriter&&) noexcept;
  void Clear();
  bool empty() const { return entries_.empty(); }
  size_t count() const { return entries_.size(); }
  size_t record_bytes() const { return records_.size() - kHeadRoom; }
  uint64_t last_op() const { return entries_.empty() ? 0 : entries_.back().op_index; }
  // True when a record of `op_index` may join (ascending, chunk not full).
  bool Accepts(uint64_t op_index) const {
    return entries_.empty() ||
           (op_index > entries_.back().op_index && entries_.size() < kOpChunkMaxRecords &&
            record_bytes() < kOpChunkMaxBytes);
  }
  void Add(uint64_t op_index, const uint8_t* data, size_t size);
  // The event core of the record just added (Add/Reserve). Finish stores
  // the cores only when every record of the chunk has one.
  void AddCore(const aligner::OpEventCore& core) { cores_.push_back(core); }
  // Appends a record that is written in place: returns `size` bytes of
  // storage (8-aligned within the chunk, zero-filled up to 8-alignment)
  // valid until the next Add/Reserve/Clear/Finish.
  uint8_t* Reserve(uint64_t op_index, size_t size);
  // The encoded value (wrapped and compressed unless `codec` is kNone);
  // valid until the next Clear()/Add(). With a core for every record and no
  // FinishCores before, the cores are in front of the chunk.
  std::string_view Finish(ChunkCodec codec = ChunkCodec::kNone);
  // The cores alone (the `cores` column family's value; OpChunkView::OpenCores
  // reads it), taken out of the chunk Finish then encodes. Empty unless
  // every record has a core. Valid until the next Clear()/Add()/FinishCores().
  std::string_view FinishCores(ChunkCodec codec = ChunkCodec::kNone);

 private:
  // Room for the largest header ("OGC1" | count | kOpChunkMaxRecords entries)
  // at the start of records_: Finish writes the header in front of the
  // records instead of copying them behind it.
  static constexpr size_t kHeadRoom = 8 + 16 * kOpChunkMaxRecords;
  // The cores in front of `chunk` (the layout above), in framed_.
  std::string_view WithCores(ChunkCodec codec, std::string_view chunk);
  struct Entry {
    uint64_t op_index;
    uint32_t offset;  // from the first record (records_ + kHeadRoom)
    uint32_t size;
  };
  std::vector<Entry> entries_;
  std::string records_;  // kHeadRoom bytes, then the records
  std::vector<aligner::OpEventCore> cores_;
  std::string out_;
  std::string packed_;
  std::string cores_raw_;
  std::string framed_;  // cores in front of the chunk
  struct Codecs;  // compression state, reused across chunks
  std::unique_ptr<Codecs> codecs_;
};

// A decoded ops value (chunk, compressed chunk or single record). Open()
// decompresses and checks the framing (bounds, alignment, ascending op
// indices), not the records themselves: readers verify each record they use
// (wire::OpenStored).
class OpChunkView {
 public:
  // The stored event cores of a value (ascending op indices, the last one
  // the key's): kRead fills cores(); kAbsent for a value without them or
  // with cores of another aligner::kOpEventCoreVersion (read the records
  // with Open instead); kDamaged when their framing or compression is.
  enum class Cores { kRead, kAbsent, kDamaged };
  Cores OpenCores(uint64_t key_op, std::string_view value);
  const std::vector<aligner::OpEventCore>& cores() const { return cores_; }

  // `key_op` is the op_index of the key (used for single-record values).
  // Copies `value` into internal storage when it is misaligned or `copy` is
  // set, and always decompresses a compressed chunk into it (otherwise the
  // records alias `value`, which must outlive their use).
  bool Open(uint64_t key_op, std::string_view value, bool copy = false);
  size_t size() const { return ops_.size(); }
  uint64_t op_index(size_t i) const { return ops_[i]; }
  std::string_view record(size_t i) const { return records_[i]; }
  // Index of the first record with op_index >= `op` (size() when none).
  size_t LowerBound(uint64_t op) const;

 private:
  std::vector<uint64_t> storage_;
  std::vector<uint64_t> ops_;
  std::vector<std::string_view> records_;
  std::vector<aligner::OpEventCore> cores_;
};

// True for a chunk, compressed or not (not for a single-record value).
bool IsOpChunk(std::string_view value);

}  // namespace opguard::daemon
