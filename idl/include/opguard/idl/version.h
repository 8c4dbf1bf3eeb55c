// Wire schema version. Every Envelope carries {kSchemaMajor, kSchemaMinor}.
// A receiver refuses a message whose major differs from its own; minors are
// backward compatible (fields and union members are only appended).
#pragma once

#include <cstdint>

namespace opguard::wire {

inline constexpr uint16_t kSchemaMajor = 1;
inline constexpr uint16_t kSchemaMinor = 8;  // 1: aligner queries; 2: OpRecord.replicated;
                                             // 3: CollectivesAnswer.groups;
                                             // 4: full run and status summaries;
                                             // 5: the JSON API across nodes;
                                             // 6: AckCode.Retry;
                                             // 7: StatusAnswer.ingest_paused;
                                             // 8: preflight plans, DiffRequest.plan

}  // namespace opguard::wire
