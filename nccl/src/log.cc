#include "log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace opguard::nccl {

void Log(const char* format, ...) {
  static const bool quiet = [] {
    const char* level = std::getenv("OPGUARD_LOG_LEVEL");
    return level != nullptr && (std::strcmp(level, "error") == 0 || std::strcmp(level, "off") == 0);
  }();
  if (quiet) return;
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  std::fprintf(stderr, "opguard-nccl: %s\n", line);
}

}  // namespace opguard::nccl
