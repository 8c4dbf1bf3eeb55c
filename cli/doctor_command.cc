// `opguard doctor [--python PY]`: checks, in the order a recording needs
// them, that a training run under OPGUARD=1 would arrive at the daemon:
//   1. PY imports the opguard package, and its opguard-autoload.pth hook runs
//      at PY's start-up (without it OPGUARD=1 silently records nothing);
//   2. the adapter loads against PY's torch (the torch it was built for);
//   3. a daemon answers on the query endpoint (--daemon), and which one it is
//      and why (the node's, $OPGUARD_DAEMON, or this user's own, started
//      here when it is the one chosen and not running);
//   4. a tiny program run under OPGUARD=1, with the environment as it is
//      (OPGUARD_ENDPOINT...), arrives there as a run; the run is deleted.
// It stops at the first failure and prints one line saying what to do; exit
// code 0 when all four pass, 1 otherwise, 2 on a usage error.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "cli/daemon_args.h"
#include "opguard/daemon/client.h"

extern char** environ;

namespace opguard::cli {
namespace {

struct Finished {
  int exit_code = -1;  // -1: could not start, or killed at the deadline
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

// Runs argv (PATH searched) with `env` added to this process's environment;
// bounded by `timeout`, after which the child is killed.
Finished Run(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             std::chrono::seconds timeout) {
  Finished done;
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    done.output = std::strerror(errno);
    return done;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  if (pid < 0) {
    close(pipe_fds[0]);
    done.output = std::strerror(errno);
    return done;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      done.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(pipe_fds[0], buf, sizeof buf);
    if (n <= 0) break;  // every writer closed: the child is done
    done.output.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!done.timed_out && WIFEXITED(status)) done.exit_code = WEXITSTATUS(status);
  return done;
}

// The line of `output` that starts with `prefix` (without it), or "".
std::string LineAfter(const std::string& output, const std::string& prefix) {
  for (size_t at = output.find(prefix); at != std::string::npos; at = output.find(prefix, at + 1)) {
    if (at != 0 && output[at - 1] != '\n') continue;
    const size_t from = at + prefix.size();
    return output.substr(from, output.find('\n', from) - from);
  }
  return "";
}

// The last non-empty line (a Python traceback's exception), for one-line errors.
std::string LastLine(const std::string& output) {
  const size_t end = output.find_last_not_of("\n ");
  if (end == std::string::npos) return "no output";
  const size_t newline = output.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return output.substr(begin, end - begin + 1);
}

struct Doctor {
  std::string python = "python3";
  DaemonArgs daemon;
  int check = 0;

  // A failed check is a finding, like a divergence (1), not an error of
  // doctor itself (2: usage).
  int Fail(const std::string& what) const {
    std::fprintf(stderr, "opguard doctor: [%d/4] %s\n", check, what.c_str());
    return kExitDiverged;
  }
  void Ok(const std::string& what) const { std::printf("ok [%d/4] %s\n", check, what.c_str()); }

  Finished Python(const char* code, std::vector<std::string> env = {}) const {
    env.push_back("PYTHONUNBUFFERED=1");
    return Run({python, "-c", code}, env, std::chrono::seconds(static_cast<int>(daemon.timeout_s) + 60));
  }

  // 1: the package, and the hook Python runs at start-up with OPGUARD=1
  // (it imports opguard._autoload, which waits for `import torch`).
  int Package() {
    check = 1;
    const auto r = Python(
        "import os, sys, opguard\n"
        "print('package', os.path.dirname(opguard.__file__))\n"
        "print('hook', 'opguard._autoload' in sys.modules)\n",
        {"OPGUARD=1"});
    if (r.exit_code == 127 || r.exit_code < 0)
      return Fail(python + " cannot be run (" + LastLine(r.output) +
                  "): pass --python with the interpreter that runs your training");
    const std::string where = LineAfter(r.output, "package ");
    if (r.exit_code != 0 || where.empty())
      return Fail(python + " cannot import opguard (" + LastLine(r.output) +
                  "): install it into that Python: pip install ./python from an OpGuard checkout in "
                  "its venv, or the opguard-torch .deb for Debian's python3 (docs/install.md)");
    if (LineAfter(r.output, "hook ") != "True")
      return Fail(python + " imports opguard from " + where +
                  " but does not run its opguard-autoload.pth hook, so OPGUARD=1 records nothing: "
                  "install the package into a folder that Python reads .pth files from "
                  "(pip install ./python, docs/install.md)");
    Ok(python + " imports opguard (" + where + ") and runs its autoload hook");
    return 0;
  }

  // 2: the version check the package makes, then both libraries loaded.
  int Adapter() {
    check = 2;
    const auto r = Python(
        "import torch\n"
        "print('torch', torch.__version__)\n"
        "from opguard import _native\n"
        "_native.check_torch(torch.__version__)\n"
        "_native.load()\n"
        "print('adapter loaded')\n");
    const std::string torch = LineAfter(r.output, "torch ");
    if (torch.empty())
      return Fail(python + " cannot import torch (" + LastLine(r.output) +
                  "): pass --python with the interpreter that has your torch");
    if (r.exit_code != 0 || LineAfter(r.output, "adapter ") != "loaded") {
      std::string why = LastLine(r.output);
      if (const auto at = why.find("TorchMismatch: "); at != std::string::npos) why = why.substr(at + 15);
      return Fail("the adapter does not load against torch " + torch + ": " + why);
    }
    Ok("the adapter loads against torch " + torch);
    return 0;
  }

  // 3: the daemon's status; keeps its ingest endpoint for check 4's hint.
  int Daemon(std::string& ingest) {
    check = 3;
    StartUserDaemonIfChosen(daemon);
    daemon::DaemonClient client(daemon.endpoint, daemon.timeout(), daemon.curve);
    auto answer = client.Status();
    const auto* s = answer.ok() ? answer->envelope()->message_as_StatusAnswer() : nullptr;
    if (s == nullptr)
      return Fail("no daemon answers on " + daemon.endpoint + ", " + daemon.why + " (" +
                  (answer.ok() ? std::string("unexpected answer") : answer.status().message()) +
                  "): start it (sudo systemctl enable --now opguardd, or opguardd --local DIR), "
                  "or pass --daemon with its query endpoint");
    ingest = s->ingest() ? s->ingest()->str() : "";
    Ok("opguardd " + (s->version() ? s->version()->str() : std::string("?")) + " answers on " +
       daemon.endpoint + " (records in on " + ingest + "): " + daemon.why);
    return 0;
  }

  // 4: a tiny recorded run under a name no one else uses, then deleted.
  int RecordedRun(const std::string& ingest) {
    check = 4;
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    const std::string run = "opguard-doctor-" + std::string(host) + "-" + std::to_string(getpid()) + "-" +
                            std::to_string(std::time(nullptr));
    const auto r = Python(
        "import torch\n"
        "x = torch.arange(16, dtype=torch.float32).reshape(4, 4)\n"
        "y = (x @ x).relu().sum()\n"
        "import opguard\n"
        "print('recording', opguard.enabled())\n",
        // One rank of one: recording starts at `import torch`.
        {"OPGUARD=1", "OPGUARD_RUN=" + run, "RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=1"});
    const char* env_endpoint = std::getenv("OPGUARD_ENDPOINT");
    std::string sent_to = env_endpoint && *env_endpoint ? env_endpoint : daemon::kDefaultIngestEndpoint;
    if (daemon.user_daemon && !(env_endpoint && *env_endpoint)) sent_to = ingest;  // it picks the same one
    if (LineAfter(r.output, "recording ") != "True") {
      std::string why = LineAfter(r.output, "opguard-torch warning: ");
      if (why.empty()) why = LineAfter(r.output, "opguard-shim ");
      if (why.empty()) why = LastLine(r.output);
      return Fail("a tiny program under OPGUARD=1 did not record (" + why + ")");
    }
    daemon::DaemonClient client(daemon.endpoint, daemon.timeout(), daemon.curve);
    // The shim flushes at exit, so the run is complete once the program has
    // ended; a second look covers an acknowledgement still in the daemon's
    // write path.
    bool found = false;
    for (int attempt = 0; attempt < 2 && !found; ++attempt) {
      if (attempt) std::this_thread::sleep_for(std::chrono::seconds(1));
      auto answer = client.ListRuns();
      const auto* list = answer.ok() ? answer->envelope()->message_as_ListRunsAnswer() : nullptr;
      if (list == nullptr || !list->runs()) continue;
      for (const auto* stored : *list->runs())
        found = found || (stored->name() && stored->name()->str() == run);
    }
    if (!found) {
      std::string what = "a tiny program under OPGUARD=1 recorded, but run " + run + " did not arrive at " +
                         daemon.endpoint + ": the program sends records to " + sent_to;
      if (!ingest.empty() && ingest != sent_to)
        what += " and the daemon reads them on " + ingest + ": set OPGUARD_ENDPOINT=" + ingest;
      else
        what += ": check that this user may write to it, and the daemon's log";
      return Fail(what);
    }
    const Status removed = client.DeleteRun(run);
    Ok("a tiny program under OPGUARD=1 arrived as run " + run +
       (removed.ok() ? " (deleted)" : " (not deleted: " + removed.message() + ")"));
    return 0;
  }

  int Main() {
    std::string ingest;
    if (Package() || Adapter() || Daemon(ingest) || RecordedRun(ingest)) return kExitDiverged;
    std::printf("OPGUARD=1 records with %s\n", python.c_str());
    return 0;
  }
};

std::function<int()> AddDoctor(CLI::App& cmd, const DaemonArgs& top) {
  auto doctor = std::make_shared<Doctor>();
  doctor->daemon.timeout_s = 10;
  // The venv's `opguard` command (python/opguard/_commands.py) names its Python.
  if (const char* python = std::getenv("OPGUARD_PYTHON"); python && *python) doctor->python = python;
  AddDaemonOptions(cmd, doctor->daemon, top, /*json=*/false);
  cmd.footer("Exit codes: 0 every check passed; 1 a check failed (its line says what to do);\n"
             "2 usage error.");
  cmd.add_option("--python", doctor->python,
                 "the Python interpreter that runs training (default:\n"
                 "$OPGUARD_PYTHON, which the venv's opguard command\n"
                 "sets to its Python, else python3 on PATH)")
      ->option_text("PY");
  return [doctor] { return doctor->Main(); };
}

}  // namespace

OPGUARD_CLI_COMMAND(doctor, "doctor",
                    "check that OPGUARD=1 records: Python package, adapter, daemon, a tiny run",
                    &AddDoctor);

}  // namespace opguard::cli
