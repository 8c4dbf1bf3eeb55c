#include "opguard/common/utf8.h"

#include <cstdint>
#include <string>

namespace opguard {

namespace {

// Length (1..4) of the well-formed UTF-8 sequence that starts at p[i], or 0
// when none does.
size_t SequenceAt(const uint8_t* p, size_t n, size_t i) {
  const uint8_t c = p[i];
  if (c < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xbf;  // range of the second byte (Table 3-7 of Unicode)
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
  } else {
    return 0;
  }
  if (n - i < len) return 0;
  if (p[i + 1] < lo || p[i + 1] > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if ((p[i + k] & 0xc0) != 0x80) return 0;
  }
  return len;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t len = SequenceAt(p, text.size(), i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string RepairUtf8(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  std::string out;
  out.reserve(text.size() + 16);
  for (size_t i = 0; i < text.size();) {
    const size_t len = SequenceAt(p, text.size(), i);
    if (len != 0) {
      out.append(text.data() + i, len);
      i += len;
    } else {
      out += "\\x";
      out += kHex[p[i] >> 4];
      out += kHex[p[i] & 15];
      ++i;
    }
  }
  return out;
}

std::string_view RepairedUtf8(std::string_view text, std::string* storage) {
  if (IsValidUtf8(text)) return text;
  *storage = RepairUtf8(text);
  return *storage;
}

}  // namespace opguard
