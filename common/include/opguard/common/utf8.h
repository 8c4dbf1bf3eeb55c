// UTF-8 validation for text that crosses a boundary (the wire, the C API):
// everything the daemon stores as text ends up in JSON, which must be UTF-8.
#pragma once

#include <cstddef>
#include <string_view>

namespace opguard {

// True when `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF). NUL bytes are valid code points.
bool IsValidUtf8(std::string_view text);

}  // namespace opguard
