// Leveled logging, one line per message. By default a line goes to stderr as
// "<component> <level>: <message>" in one write(2): that is what the shim uses,
// since it runs inside someone else's process and must bring no extra shared
// libraries or global loggers there. Executables (opguardd, opguard) send the
// lines to spdlog instead (opguard/common/spdlog_sink.h). Thread-safe.
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

// Passes the message to the sink if level >= current.
void Log(LogLevel level, std::string_view message);

// Replaces where lines go (nullptr: back to stderr). Called once at startup,
// before other threads log.
using LogSink = void (*)(LogLevel level, std::string_view message);
void SetLogSink(LogSink sink);

}  // namespace opguard

#define OPGUARD_LOG(level, msg)                                        \
  do {                                                                 \
    if (static_cast<int>(level) >= static_cast<int>(::opguard::GetLogLevel())) \
      ::opguard::Log(level, (msg));                                    \
  } while (0)
