// The options every command that talks to a daemon takes: --daemon ENDPOINT
// (default $OPGUARD_DAEMON, else the node's daemon's unix query socket when it
// exists, else this user's daemon (opguard/daemon/user_daemon.h), started
// when the command needs it, unless $OPGUARD_ENDPOINT sends records
// elsewhere: then tcp://127.0.0.1:7455), --key FILE and --server-key KEY for a
// daemon that requires CURVE on TCP (default $OPGUARD_KEY and
// $OPGUARD_SERVER_KEY, else ~/.config/opguard/client.key and server.pub when
// they exist), --timeout S, --json where the command has a JSON form. These
// may also come before the command name (`opguard --daemon tcp://node7:7455 runs`).
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "opguard/common/status.h"
#include "opguard/daemon/curve_keys.h"

namespace CLI {
class App;
}

namespace opguard::cli {

struct DaemonArgs {
  std::string endpoint;
  std::string why;           // why this endpoint (`opguard doctor` says it)
  bool user_daemon = false;  // the endpoint is this user's daemon, started on demand
  daemon::CurveClientConfig curve;  // used on tcp:// endpoints
  double timeout_s = 5;  // callers set their own default before AddDaemonOptions
  bool json = false;
  std::vector<std::string> positional;

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  }
};

// Adds --daemon, --key, --server-key and, with `json`, --json to `app`,
// bound to `args`; main.cc adds them to the top level with the defaults
// (SetDefaults).
void AddSharedOptions(CLI::App& app, DaemonArgs& args, bool json);
// The defaults described above, from the environment and the files present.
void SetDefaults(DaemonArgs& args);

// Adds the shared options and --timeout to command `cmd`, bound to `args`,
// which starts from `top` (the options given before the command name).
void AddDaemonOptions(CLI::App& cmd, DaemonArgs& args, const DaemonArgs& top, bool json);

// A command with only those options and, given `run_help`, one RUN argument
// (positional[0]); returns what calls `main` once the line is parsed.
std::function<int()> AddDaemonCommand(CLI::App& cmd, const DaemonArgs& top,
                                      int (*main)(const DaemonArgs&), double timeout_s, bool json,
                                      const char* run_help = nullptr);

// Starts this user's daemon when `args` chose it and it does not answer:
// the opguardd beside this program's binary (the wheel's opguard/bin, a
// prefix's sbin) starts it. Says so on stderr when it cannot; the command
// then reports the daemon as unreachable.
void StartUserDaemonIfChosen(const DaemonArgs& args);

// Prints "opguard COMMAND: what went wrong" on one line, with what to do
// about it when the daemon did not answer, and returns kExitError.
int Fail(std::string_view command, const Status& st);

// Prints the --json form of an answer (indented, one trailing newline).
// Bytes that are not UTF-8 (a run stored before the daemon refused them)
// are printed as U+FFFD instead of aborting the command.
void PrintJson(const nlohmann::json& j);

}  // namespace opguard::cli
