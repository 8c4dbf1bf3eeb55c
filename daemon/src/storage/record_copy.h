// Deep copies of wire tables into another FlatBufferBuilder. Ingest stores each
// OpRecord / CollectiveRecord as its own root (the stored value format, see
// common.fbs); queries copy stored records into answers. FlatBuffers has no
// cheap generic copy (the reflection one is slow), so these are written out
// field by field. CONTRACT: when a field is appended to one of these tables in
// idl/, add it here too; record_copy_test.cc compares every field.
//
// Included by the storage room, ingest (storing a batch's records) and
// query/query.cc (copying stored records into trace pages).
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "opguard/idl/envelope_generated.h"
#include "storage/op_chunk.h"

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

// Appends `op` to `w` as its own root by copying its bytes as they are,
// instead of rebuilding it (CopyOpRecord): the record's tables, vectors and
// vtables are found by walking the schema, the span holding them is copied
// at the same 8-byte phase, and vtables shared with other records of the
// batch (a builder deduplicates them) are copied in front of it. `buffer` is
// the start of the verified buffer of `size` bytes that holds `op`
// (alignment is relative to it). Returns false, adding nothing, when the
// record is not laid out as one compact span (its parts interleaved with
// other records'), has more parts than a record needs, or sets fields this
// build does not know (they could be offsets the walk cannot follow); the
// caller then rebuilds it. Any batch the shim encodes takes this path.
// CONTRACT: like CopyOpRecord, when a table of OpRecord gains a field, add
// its size to the field lists in record_copy.cc (until then such records are
// rebuilt); record_copy_test.cc checks that every field goes through here.
bool AddOpRecordBytes(OpChunkWriter* w, const uint8_t* buffer, size_t size,
                      const wire::OpRecord* op);

}  // namespace opguard::daemon
