// Deep copies of wire tables into another FlatBufferBuilder. Ingest stores each
// OpRecord / CollectiveRecord as its own root (the stored value format, see
// common.fbs); queries copy stored records into answers. FlatBuffers has no
// cheap generic copy (the reflection one is slow), so these are written out
// field by field. CONTRACT: when a field is appended to one of these tables in
// idl/, add it here too; record_copy_test.cc compares every field.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "opguard/idl/envelope_generated.h"

namespace opguard::daemon {

flatbuffers::Offset<wire::TensorSig> CopyTensorSig(flatbuffers::FlatBufferBuilder& b,
                                                   const wire::TensorSig* t);
flatbuffers::Offset<wire::OpRecord> CopyOpRecord(flatbuffers::FlatBufferBuilder& b,
                                                 const wire::OpRecord* op);
flatbuffers::Offset<wire::CollectiveRecord> CopyCollectiveRecord(flatbuffers::FlatBufferBuilder& b,
                                                                 const wire::CollectiveRecord* c);
flatbuffers::Offset<wire::CommunicatorDef> CopyCommunicatorDef(flatbuffers::FlatBufferBuilder& b,
                                                               const wire::CommunicatorDef* c);
flatbuffers::Offset<wire::GapNotice> CopyGapNotice(flatbuffers::FlatBufferBuilder& b,
                                                   const wire::GapNotice* g);

// ---- ops chunks (the value format of the ops column family) ---------------
//
// Consecutive records of one (run, rank, lane) from one batch are stored as ONE
// value, keyed by the op_index of the LAST record in it (docs/storage.md), so
// a forward Seek(op key) lands on the only chunk that can hold that op.
//
//   "OGC1" | count u32 | count x { op_index u64 | offset u32 | size u32 }
//   | records, each an OpRecord FlatBuffers root starting 8-aligned
//
// (integers little-endian; offsets from the start of the value). A value that
// does not start with the magic is a single record (the layout before chunks:
// one OpRecord root per key, the key's op_index); readers accept both.
inline constexpr size_t kOpChunkMaxRecords = 128;
inline constexpr size_t kOpChunkMaxBytes = 64 << 10;

class OpChunkWriter {
 public:
  void Clear();
  bool empty() const { return entries_.empty(); }
  size_t count() const { return entries_.size(); }
  size_t record_bytes() const { return records_.size(); }
  uint64_t last_op() const { return entries_.empty() ? 0 : entries_.back().op_index; }
  // True when a record of `op_index` may join (ascending, chunk not full).
  bool Accepts(uint64_t op_index) const {
    return entries_.empty() ||
           (op_index > entries_.back().op_index && entries_.size() < kOpChunkMaxRecords &&
            records_.size() < kOpChunkMaxBytes);
  }
  void Add(uint64_t op_index, const uint8_t* data, size_t size);
  // The encoded value; valid until the next Clear()/Add().
  std::string_view Finish();

 private:
  struct Entry {
    uint64_t op_index;
    uint32_t offset;  // into records_
    uint32_t size;
  };
  std::vector<Entry> entries_;
  std::string records_;
  std::string out_;
};

// A decoded ops value (chunk or single record). Open() checks the framing
// (bounds, alignment, ascending op indices), not the records themselves:
// readers verify each record they use (wire::OpenStored).
class OpChunkView {
 public:
  // `key_op` is the op_index of the key (used for single-record values).
  // Copies `value` into internal storage when it is misaligned or `copy` is
  // set (otherwise the records alias `value`, which must outlive their use).
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
};

bool IsOpChunk(std::string_view value);

}  // namespace opguard::daemon
