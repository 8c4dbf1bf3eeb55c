// Counters fed with numbers a sender chose (dropped-record counts) stop at
// the top instead of wrapping back to small, plausible-looking values.
#pragma once

#include <cstdint>

namespace opguard {

inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

}  // namespace opguard
