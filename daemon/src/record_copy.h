// Deep copies of wire tables into another FlatBufferBuilder. Ingest stores each
// OpRecord / CollectiveRecord as its own root (the stored value format, see
// common.fbs); queries copy stored records into answers. FlatBuffers has no
// cheap generic copy (the reflection one is slow), so these are written out
// field by field. CONTRACT: when a field is appended to one of these tables in
// idl/, add it here too; record_copy_test.cc compares every field.
#pragma once

#include <flatbuffers/flatbuffers.h>

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

}  // namespace opguard::daemon
