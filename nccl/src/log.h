// One-line messages on stderr, prefixed "opguard-nccl", silenced by
// OPGUARD_LOG_LEVEL=error or off like the shim's own.
#pragma once

namespace opguard::nccl {

void Log(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace opguard::nccl
