#include "opguard/common/log.h"

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>

namespace opguard {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<LogSink> g_sink{nullptr};
std::mutex g_mu;
std::string& Component() {
  static std::string* component = new std::string("opguard");  // never destroyed: used at exit
  return *component;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

}  // namespace

bool ParseLogLevel(std::string_view text, LogLevel* out) {
  static constexpr std::pair<std::string_view, LogLevel> kNames[] = {
      {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},   {"warn", LogLevel::kWarn},
      {"warning", LogLevel::kWarn}, {"error", LogLevel::kError}, {"off", LogLevel::kOff}};
  for (const auto& [name, level] : kNames) {
    if (text == name) {
      *out = level;
      return true;
    }
  }
  return false;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

void SetLogComponent(std::string component) {
  std::lock_guard<std::mutex> lock(g_mu);
  Component() = std::move(component);
}

void SetLogSink(LogSink sink) { g_sink.store(sink); }

void Log(LogLevel level, std::string_view message) {
  if (static_cast<int>(level) < g_level.load()) return;
  if (LogSink sink = g_sink.load()) return sink(level, message);
  std::string line;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    line = Component();
  }
  line += ' ';
  line += LevelName(level);
  line += ": ";
  line += message;
  line += '\n';
  // One write(2) per line so concurrent processes do not interleave mid-line.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

}  // namespace opguard
