// Routes opguard/common/log.h through spdlog, for executables (opguardd,
// opguard): timestamped, leveled lines on stderr, or, when stderr is the
// systemd journal (JOURNAL_STREAM), journal entries with their priority.
// The shim never links this (see log.h).
#pragma once

#include <string>

namespace opguard {

// Sets the component name and sends every later OPGUARD_LOG line to spdlog.
// Call once at the top of main(), before other threads start.
void LogThroughSpdlog(const std::string& component);

}  // namespace opguard
