// UTF-8 validation for text that crosses a boundary (the wire, the C API):
// everything the daemon stores as text ends up in JSON, which must be UTF-8.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace opguard {

// True when `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF). NUL bytes are valid code points.
bool IsValidUtf8(std::string_view text);

// `text` made valid UTF-8: every byte that does not belong to a well-formed
// sequence is written as the four characters \xNN (lowercase hex), so a
// Latin-1 path stays readable and two different paths stay different.
std::string RepairUtf8(std::string_view text);
// `text` itself when it is valid UTF-8 (no copy), else its repair, kept in
// *storage.
std::string_view RepairedUtf8(std::string_view text, std::string* storage);

}  // namespace opguard
