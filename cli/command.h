// The `opguard` command line: each subcommand lives in its own *_command.cc
// and registers itself here. Subcommands are thin faces over the libraries
// (fingerprint, daemon client, aligner); CLI11 parses their options, and they
// print one-line errors and return a process exit code.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "cli/daemon_args.h"

namespace CLI {
class App;
}

namespace opguard::cli {

// Exit codes of every command (README.md, "Exit codes"). Only the queries
// that compare (diff, ranks, collectives) return kDiverged and kIncomplete.
inline constexpr int kExitOk = 0;          // identical / consistent / done
inline constexpr int kExitDiverged = 1;    // a divergence, desync or mismatch found
inline constexpr int kExitError = 2;       // usage, an unreachable daemon, an error answer
inline constexpr int kExitIncomplete = 3;  // records missing near the answer, or a peer silent

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `opguard --help`
  // Declares the command's options and positionals on `cmd` and returns what
  // runs it once the command line is parsed. `top` holds the options given
  // before the command name (--daemon, --json), the defaults of its own.
  std::function<int()> (*add)(CLI::App& cmd, const DaemonArgs& top);
};

// All registered commands, sorted by name.
const std::vector<Command>& Commands();

struct Registrar {
  explicit Registrar(Command command);
};

}  // namespace opguard::cli

// Registers a subcommand at static-initialisation time.
#define OPGUARD_CLI_COMMAND(ident, ...)                           \
  static ::opguard::cli::Registrar opguard_cli_registrar_##ident( \
      ::opguard::cli::Command{__VA_ARGS__})
