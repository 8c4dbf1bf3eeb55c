// Lower-case hexadecimal for fingerprints and keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace opguard {

std::string ToHex(const void* data, size_t size);
// Accepts exactly 2*size hex digits (either case); nullopt otherwise.
bool FromHex(std::string_view hex, void* out, size_t size);

}  // namespace opguard
