// Minimal leveled logging to stderr, one line per message, prefixed with the
// component ("opguardd", "opguard-shim") so lines are attributable inside a
// training job's interleaved output. Thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace opguard {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Parses "debug|info|warn|error|off"; false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* out);
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogComponent(std::string component);

// Writes "<component> <level>: <message>\n" to stderr if level >= current.
void Log(LogLevel level, std::string_view message);

}  // namespace opguard

#define OPGUARD_LOG(level, msg)                                        \
  do {                                                                 \
    if (static_cast<int>(level) >= static_cast<int>(::opguard::GetLogLevel())) \
      ::opguard::Log(level, (msg));                                    \
  } while (0)
