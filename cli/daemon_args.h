// The options every command that talks to a daemon takes: --daemon ENDPOINT
// (default $OPGUARD_DAEMON, else the local query endpoint), --timeout S,
// --json where the command has a JSON form, --help, and positional words.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace opguard::cli {

struct DaemonArgs {
  std::string endpoint;
  double timeout_s = 5;  // callers set their own default before parsing
  bool json = false;
  std::vector<std::string> positional;

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  }
};

// A command's own options: called with each unrecognised "--" word and a
// function that takes the option's value (nullptr, after a one-line error,
// when there is none). Returns 1 if it consumed the option, 0 if the option
// is not the command's, -1 after printing a one-line error.
using ExtraOptions =
    std::function<int(const std::string& option, const std::function<const char*()>& value)>;

// Parses argv (argv[0] is the command name). Returns false after printing a
// one-line error; `--help` prints `usage` and exits 0.
bool ParseDaemonArgs(int argc, char** argv, const char* usage, bool allow_json, DaemonArgs* out,
                     const ExtraOptions& extra = nullptr);

// Prints the --json form of an answer (indented, one trailing newline).
// Bytes that are not UTF-8 (a run stored before the daemon refused them)
// are printed as U+FFFD instead of aborting the command.
void PrintJson(const nlohmann::json& j);

}  // namespace opguard::cli
