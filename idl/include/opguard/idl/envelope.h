// Framing for every OpGuard message: build an Envelope around one message,
// and open a received buffer safely (verified, size-limited, version-checked)
// before anything reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// FlatBuffers reads scalars in place, so a buffer must start at an address
// aligned for its widest scalar (8 bytes). A FlatBufferBuilder's output is; a
// received ZeroMQ frame is not necessarily (it may point into the socket's
// receive buffer at any offset), and reading it in place would be misaligned
// loads: undefined behaviour, and a fault on some CPUs.
inline constexpr size_t kBufferAlignment = 8;

// Holds a received message's bytes when they had to be copied to be aligned.
using AlignedStorage = std::vector<uint64_t>;

// Verifies `data` as an Envelope: size within `max_bytes`, file identifier,
// FlatBuffers Verifier, same schema major, a known message type with its body
// present (so message_as_<type>() is non-null). The returned pointer aliases
// `data`, which must be kBufferAlignment-aligned (for received frames use the
// overload below). Errors are one line, e.g.
// "schema major 2 not supported (this build speaks 1.0)".
Result<const Envelope*> OpenEnvelope(const void* data, size_t size,
                                     size_t max_bytes = kMaxMessageBytes);

// The same for bytes at any address, e.g. zmq::message_t::data(): misaligned
// bytes are first copied into `storage` (only after the size check), and the
// returned pointer then aliases `storage` instead of `data`.
Result<const Envelope*> OpenEnvelope(const void* data, size_t size, AlignedStorage& storage,
                                     size_t max_bytes = kMaxMessageBytes);

// Verifies a stored value (a bare OpRecord / CollectiveRecord buffer).
// `data` must be kBufferAlignment-aligned, as for OpenEnvelope.
template <typename T>
Result<const T*> OpenStored(const void* data, size_t size) {
  flatbuffers::Verifier verifier(static_cast<const uint8_t*>(data), size);
  if (!verifier.VerifyBuffer<T>(nullptr)) return DataLoss("stored record fails verification");
  return flatbuffers::GetRoot<T>(data);
}

}  // namespace opguard::wire
