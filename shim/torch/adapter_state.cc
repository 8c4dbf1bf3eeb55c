#include "adapter_state.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace opguard::torch_adapter {

void DisableOnce(const char* what) {
  if (g_adapter.recording.exchange(false)) {
    std::fprintf(stderr, "opguard-torch warning: %s; recording stopped, training continues\n", what);
  }
}

void WarnOnce(std::atomic<bool>& warned, const char* what) {
  if (!warned.exchange(true)) std::fprintf(stderr, "opguard-torch warning: %s\n", what);
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

uint64_t EnvByteCount(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || value[0] == '-') {
    std::fprintf(stderr, "opguard-torch warning: %s='%s' is not a byte count; using %llu\n", name,
                 value, static_cast<unsigned long long>(fallback));
    return fallback;
  }
  return static_cast<uint64_t>(parsed);
}

}  // namespace opguard::torch_adapter
