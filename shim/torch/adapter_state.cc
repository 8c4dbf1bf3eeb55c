#include "adapter_state.h"

#include <chrono>
#include <cstdio>

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

}  // namespace opguard::torch_adapter
