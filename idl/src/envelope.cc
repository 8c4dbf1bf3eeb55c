#include "opguard/idl/envelope.h"

#include <cstring>

namespace opguard::wire {

void FinishEnvelope(flatbuffers::FlatBufferBuilder& builder, Message type,
                    flatbuffers::Offset<void> message) {
  Version version(kSchemaMajor, kSchemaMinor);
  auto envelope = CreateEnvelope(builder, &version, type, message);
  builder.Finish(envelope, EnvelopeIdentifier());
}

Result<const Envelope*> OpenEnvelope(const void* data, size_t size, size_t max_bytes) {
  if (size > max_bytes) {
    return InvalidArgument("message of " + std::to_string(size) + " bytes exceeds the limit of " +
                           std::to_string(max_bytes));
  }
  if (size < 8 || !EnvelopeBufferHasIdentifier(data)) {
    return InvalidArgument("not an OpGuard message (missing identifier)");
  }
  const auto* envelope = GetEnvelope(data);
  flatbuffers::Verifier verifier(static_cast<const uint8_t*>(data), size);
  bool verified = VerifyEnvelopeBuffer(verifier);
  const Version* version = verified ? envelope->version() : nullptr;
  if (version != nullptr && version->major() != kSchemaMajor) {
    return InvalidArgument("schema major " + std::to_string(version->major()) +
                           " not supported (this build speaks " + std::to_string(kSchemaMajor) +
                           "." + std::to_string(kSchemaMinor) + ")");
  }
  if (!verified) return InvalidArgument("message fails FlatBuffers verification");
  if (envelope->message_type() == Message::NONE ||
      static_cast<uint8_t>(envelope->message_type()) > static_cast<uint8_t>(Message::MAX)) {
    return InvalidArgument("unknown message type " +
                           std::to_string(static_cast<int>(envelope->message_type())));
  }
  // The Verifier accepts a union whose type is set but whose table is absent;
  // every reader calls message_as_<T>() and dereferences it.
  if (envelope->message() == nullptr) return InvalidArgument("message type set but body missing");
  return envelope;
}

Result<const Envelope*> OpenEnvelope(const void* data, size_t size, AlignedStorage& storage,
                                     size_t max_bytes) {
  // Oversized and too-short input is refused without a copy.
  if (size > max_bytes || size < 8 || reinterpret_cast<uintptr_t>(data) % kBufferAlignment == 0) {
    return OpenEnvelope(data, size, max_bytes);
  }
  storage.resize((size + sizeof(uint64_t) - 1) / sizeof(uint64_t));
  std::memcpy(storage.data(), data, size);
  return OpenEnvelope(storage.data(), size, max_bytes);
}

}  // namespace opguard::wire
