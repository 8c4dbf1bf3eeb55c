// `opguard exec [--run NAME] [--] CMD ARGS...`: runs CMD recorded, NCCL calls
// included. It only sets the environment and replaces itself with CMD:
//   OPGUARD=1, OPGUARD_RUN=NAME (with --run), and libopguard_nccl.so first in
//   LD_PRELOAD (found next to this opguard: installed, or in the build tree).
// Everything CMD starts inherits that (torchrun's ranks, mpirun's, srun's).
#include <limits.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"

namespace opguard::cli {
namespace {

namespace fs = std::filesystem;

struct Exec {
  std::string run;
  std::vector<std::string> command;
};

// Where libopguard_nccl.so lies relative to the folder of the opguard
// binary: installed (bin -> lib), then the build tree (cli -> nccl).
std::vector<fs::path> Candidates(const fs::path& bin_dir) {
  return {bin_dir / OPGUARD_LIBDIR_FROM_BINDIR / "libopguard_nccl.so",
          bin_dir / ".." / "nccl" / "libopguard_nccl.so"};
}

bool ValidRunName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

int Main(const Exec& e) {
  if (!e.run.empty() && !ValidRunName(e.run)) {
    std::fprintf(stderr,
                 "opguard exec: --run '%s' is invalid: 1-128 characters of A-Z a-z 0-9 . _ -\n",
                 e.run.c_str());
    return kExitError;
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::string library;
  std::string looked;
  for (const fs::path& p : Candidates(self.parent_path())) {
    fs::path canonical = fs::weakly_canonical(p, ec);
    if (!ec && fs::is_regular_file(canonical, ec)) {
      library = canonical.string();
      break;
    }
    looked += (looked.empty() ? "" : ", ") + p.lexically_normal().string();
  }
  if (library.empty()) {
    std::fprintf(stderr,
                 "opguard exec: libopguard_nccl.so not found (looked in %s); reinstall the opguard "
                 "package\n",
                 looked.c_str());
    return kExitError;
  }
  std::string preload = library;
  if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') {
    // Already first (a nested opguard exec): keep the list as it is.
    preload = std::string(old).rfind(library, 0) == 0 ? old : library + ":" + old;
  }
  if (::setenv("LD_PRELOAD", preload.c_str(), 1) != 0 || ::setenv("OPGUARD", "1", 1) != 0 ||
      (!e.run.empty() && ::setenv("OPGUARD_RUN", e.run.c_str(), 1) != 0)) {
    std::fprintf(stderr, "opguard exec: cannot set the environment: %s\n", std::strerror(errno));
    return kExitError;
  }
  std::vector<char*> argv;
  for (const std::string& a : e.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execvp(argv[0], argv.data());
  // As env(1) and shells do: 127 not found, 126 found but not runnable.
  const int error = errno;
  std::fprintf(stderr, "opguard exec: cannot run %s: %s\n", argv[0], std::strerror(error));
  return error == ENOENT ? 127 : 126;
}

std::function<int()> AddExec(CLI::App& cmd, const DaemonArgs&) {
  auto e = std::make_shared<Exec>();
  // Everything from the first word of COMMAND on is COMMAND's, options too
  // (`opguard exec python train.py --run x` passes --run to train.py).
  cmd.positionals_at_end();
  cmd.add_option("--run", e->run, "the run's name (OPGUARD_RUN; default: the shim's)")
      ->option_text("NAME");
  cmd.add_option("COMMAND", e->command, "the program and its arguments (after --, or from its first word on)")
      ->required()
      ->expected(1, INT_MAX);
  cmd.footer(
      "Runs COMMAND with OPGUARD=1 and libopguard_nccl.so in LD_PRELOAD, so that every process it\n"
      "starts records its ops (PyTorch) and NCCL calls to the node's daemon, e.g.\n"
      "  opguard exec --run ddp-1 -- torchrun --nproc-per-node 8 train.py\n"
      "Exit codes: COMMAND's own; 2 an error before it started (usage, library not found);\n"
      "126 COMMAND could not be run, 127 COMMAND not found.");
  return [e] { return Main(*e); };
}

}  // namespace

OPGUARD_CLI_COMMAND(exec, "exec",
                    "run a command recorded: OPGUARD=1 and the NCCL interposer preloaded",
                    &AddExec);

}  // namespace opguard::cli
