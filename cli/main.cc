// opguard: the command line for OpGuard. Dispatches to registered subcommands.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/command.h"

namespace opguard::cli {

static std::vector<Command>& MutableCommands() {
  static auto* commands = new std::vector<Command>();
  return *commands;
}

const std::vector<Command>& Commands() { return MutableCommands(); }

Registrar::Registrar(Command command) {
  auto& commands = MutableCommands();
  commands.push_back(command);
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
}

static void PrintHelp(FILE* out) {
  std::fprintf(out,
               "usage: opguard COMMAND [ARGS...]\n\n"
               "OpGuard finds the first operation where two training runs (or two ranks\n"
               "of one run) stop agreeing bit for bit.\n\ncommands:\n");
  for (const auto& command : Commands()) {
    std::fprintf(out, "  %-14.*s %.*s\n", static_cast<int>(command.name.size()),
                 command.name.data(), static_cast<int>(command.summary.size()),
                 command.summary.data());
  }
  std::fprintf(out, "\n`opguard COMMAND --help` describes one command.\n");
}

}  // namespace opguard::cli

int main(int argc, char** argv) {
  using namespace opguard::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    PrintHelp(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& command : Commands()) {
    if (command.name == argv[1]) return command.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "opguard: unknown command '%s' (see `opguard --help`)\n", argv[1]);
  return 2;
}
