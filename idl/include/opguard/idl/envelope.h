// Framing for every OpGuard message: build an Envelope around one message,
// and open a received buffer safely (verified, size-limited, version-checked)
// before anything reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "opguard/common/status.h"
#include "opguard/idl/envelope_generated.h"
#include "opguard/idl/version.h"

namespace opguard::wire {

// Hard upper bound for one message on any socket (also the ZMQ_MAXMSGSIZE the
// daemon sets). Larger messages are rejected before parsing.
inline constexpr size_t kMaxMessageBytes = 64u << 20;

// Finishes `builder` with an Envelope holding `message` of type `type`,
// stamped with this build's schema version and file identifier.
void FinishEnvelope(flatbuffers::FlatBufferBuilder& builder, Message type,
                    flatbuffers::Offset<void> message);

template <typename T>
void FinishEnvelope(flatbuffers::FlatBufferBuilder& builder, flatbuffers::Offset<T> message) {
  FinishEnvelope(builder, MessageTraits<T>::enum_value, message.Union());
}

// Verifies `data` as an Envelope: size within `max_bytes`, file identifier,
// FlatBuffers Verifier, same schema major, a known message type. The returned
// pointer aliases `data`. Errors are one line, e.g.
// "schema major 2 not supported (this build speaks 1.0)".
Result<const Envelope*> OpenEnvelope(const void* data, size_t size,
                                     size_t max_bytes = kMaxMessageBytes);

// Verifies a stored value (a bare OpRecord / CollectiveRecord buffer).
template <typename T>
Result<const T*> OpenStored(const void* data, size_t size) {
  flatbuffers::Verifier verifier(static_cast<const uint8_t*>(data), size);
  if (!verifier.VerifyBuffer<T>(nullptr)) return DataLoss("stored record fails verification");
  return flatbuffers::GetRoot<T>(data);
}

}  // namespace opguard::wire
