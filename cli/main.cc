// opguard: the command line for OpGuard. Dispatches to registered subcommands.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/command.h"
#include "opguard/common/spdlog_sink.h"
#include "opguard/daemon/client.h"

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

}  // namespace opguard::cli

int main(int argc, char** argv) {
  using namespace opguard::cli;
  opguard::LogThroughSpdlog("opguard");
  CLI::App app(
      "OpGuard finds the first operation where two training runs (or two ranks\n"
      "of one run) stop agreeing bit for bit.\n",
      "opguard");
  app.footer("Exit codes: 0 success; 2 an error (usage, the daemon unreachable, an error answer).");
  app.get_formatter()->column_width(34);
  DaemonArgs top;  // --daemon and --json given before the command name
  SetDefaults(top);
  AddSharedOptions(app, top, /*json=*/true);
  std::vector<std::pair<CLI::App*, std::function<int()>>> runs;
  for (const auto& command : Commands()) {
    CLI::App* cmd = app.add_subcommand(std::string(command.name), std::string(command.summary));
    runs.emplace_back(cmd, command.add(*cmd, top));
  }
  CLI::App* help = app.add_subcommand("help", "print this text");
  // Commands copied the footer above (or set their own); the top level's:
  app.footer(
      "`opguard COMMAND --help` describes one command. Exit codes: 0 success (identical),\n"
      "1 diverged, 2 an error (usage, the daemon unreachable, an error answer), 3 incomplete\n"
      "or partial (diff, ranks and collectives say which).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);  // the command's, when one was named
    return 0;
  } catch (const CLI::ParseError& e) {
    const auto parsed = app.get_subcommands();
    const std::string name = parsed.empty() ? "opguard" : "opguard " + parsed.front()->get_name();
    std::fprintf(stderr, "%s: %s (see `%s --help`)\n", name.c_str(), e.what(), name.c_str());
    return 2;
  }
  if (help->parsed()) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  for (const auto& [cmd, run] : runs) {
    if (cmd->parsed()) return run();
  }
  std::fputs(app.help().c_str(), stderr);  // no command given
  return 2;
}
