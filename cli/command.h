// The `opguard` command line: each subcommand lives in its own *_command.cc
// and registers itself here. Subcommands are thin faces over the libraries
// (fingerprint, daemon client, aligner); they print one-line errors and
// return a process exit code.
#pragma once

#include <string_view>
#include <vector>

namespace opguard::cli {

struct Command {
  std::string_view name;
  std::string_view usage;    // one line: "fingerprint --dtype DTYPE --shape D0,D1 FILE"
  std::string_view summary;  // one line for `opguard --help`
  int (*run)(int argc, char** argv);  // argv[0] is the subcommand name
};

// All registered commands, sorted by name.
const std::vector<Command>& Commands();

struct Registrar {
  explicit Registrar(Command command);
};

}  // namespace opguard::cli

// Registers a subcommand at static-initialisation time.
#define OPGUARD_CLI_COMMAND(ident, ...) \
  static ::opguard::cli::Registrar opguard_cli_registrar_##ident(::opguard::cli::Command{__VA_ARGS__})
