#include "opguard/common/spdlog_sink.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "opguard/common/log.h"

#ifdef OPGUARD_HAVE_SYSTEMD
#include <spdlog/sinks/systemd_sink.h>
#endif

namespace opguard {
namespace {

spdlog::logger* g_logger = nullptr;  // never destroyed: threads may log during exit

#ifdef OPGUARD_HAVE_SYSTEMD
// systemd.exec(5): JOURNAL_STREAM is "DEVICE:INODE" of the stream the service
// manager connected stderr to; it only counts while stderr is still that
// stream (not when a child's stderr was redirected). spdlog leaves this check
// to the program.
bool StderrIsTheJournal() {
  const char* env = std::getenv("JOURNAL_STREAM");
  unsigned long long dev = 0, ino = 0;
  struct stat st {};
  return env != nullptr && std::sscanf(env, "%llu:%llu", &dev, &ino) == 2 &&
         ::fstat(STDERR_FILENO, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}
#endif

void ToSpdlog(LogLevel level, std::string_view message) {
  static constexpr spdlog::level::level_enum kLevels[] = {spdlog::level::debug, spdlog::level::info,
                                                          spdlog::level::warn, spdlog::level::err,
                                                          spdlog::level::off};
  g_logger->log(kLevels[static_cast<int>(level)], message);
}

}  // namespace

void LogThroughSpdlog(const std::string& component) {
  spdlog::sink_ptr sink;
#ifdef OPGUARD_HAVE_SYSTEMD
  // The journal stamps time and priority itself: the sink sends the bare message.
  if (StderrIsTheJournal()) sink = std::make_shared<spdlog::sinks::systemd_sink_mt>(component);
#endif
  if (!sink) {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    sink->set_pattern("%Y-%m-%dT%H:%M:%S.%e %n %l: %v");
  }
  g_logger = new spdlog::logger(component, std::move(sink));
  g_logger->set_level(spdlog::level::trace);  // GetLogLevel() already filtered
  g_logger->flush_on(spdlog::level::trace);
  SetLogComponent(component);
  SetLogSink(&ToSpdlog);
}

}  // namespace opguard
