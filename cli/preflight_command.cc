// `opguard preflight` and `opguard plans`: two self-replays of one job
// compared op for op, stored by the daemon as a named plan that later diffs
// use (`opguard diff --plan NAME`); docs/report-format.md, "opguard preflight".
//
//   opguard preflight RUN_A RUN_B --name NAME     two recorded runs
//   opguard preflight --name NAME [--steps N] -- COMMAND...
//       runs COMMAND twice, one run after the other, with OPGUARD=1 and
//       OPGUARD_RUN=NAME-a, NAME-b (everything else as given), and stops each
//       once every rank has finished N steps: the daemon's step marks say so,
//       the job's own code is not changed. Then as above, steps 0..N-1.
//
// The plan is built and stored by the daemon; this file asks, runs the job
// and renders the plan's JSON document as text.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "cli/daemon_args.h"
#include "cli/terminal.h"
#include "opguard/daemon/client.h"

namespace opguard::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Args : DaemonArgs {
  std::string name;
  uint64_t steps = 5;
  bool replace = false;
  bool steps_given = false;
  double job_timeout_s = 3600;
  std::vector<std::string> words;  // RUN_A RUN_B, or COMMAND...
};

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

// ---- text -------------------------------------------------------------------

std::string SiteText(const json& site) {
  if (site.is_null() || site.value("file", std::string()).empty()) return "unknown site";
  std::string file = site["file"].get<std::string>();
  if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
  std::string text = file + ":" + std::to_string(site.value("line", 0));
  if (!site.value("function", std::string()).empty())
    text += " in " + site["function"].get<std::string>();
  return text;
}

std::string U(const json& j, const char* key) { return std::to_string(j.value(key, uint64_t{0})); }

std::string ConfigText(const json& c) {
  std::string text =
      "world size " + U(c, "world_size") + " · torch " +
      (c.value("torch", std::string()).empty() ? "(unknown)" : c["torch"].get<std::string>());
  std::string settings;
  for (const auto& [k, v] : c["determinism"].items()) {
    settings += (settings.empty() ? "" : ", ") + k + "=" + v.get<std::string>();
  }
  return text + " · determinism " + (settings.empty() ? "(none recorded)" : settings);
}

// The first nondeterministic op, as a pivot is shown: where, what, kernels.
void FirstText(std::ostringstream& o, const json& f) {
  const json& a = f["reference"];
  const json& b = f["suspect"];
  o << "first nondeterministic op · rank " << f["rank"] << " · step " << f["step"] << " · "
    << f["op"].get<std::string>() << "  (" << SiteText(f["site"]["suspect"]) << ")\n";
  o << "  op #" << a["op_index"] << " in run A, #" << b["op_index"]
    << " in run B · inputs identical, "
    << "outputs differ → the op itself does not compute the same bits twice\n";
  if (!f["forward_site"].is_null()) {
    o << "  in the backward of the forward at " << SiteText(f["forward_site"]["suspect"]) << "\n";
  }
  for (const auto& k : f["differing_outputs"]) {
    const size_t i = k.get<size_t>();
    if (i < a["outputs"].size() && i < b["outputs"].size()) {
      o << "  output " << i << ": A "
        << a["outputs"][i]["fingerprint"].get<std::string>().substr(0, 12) << "… B "
        << b["outputs"][i]["fingerprint"].get<std::string>().substr(0, 12) << "…\n";
    }
  }
  if (!a["kernels"].empty() || !b["kernels"].empty()) {
    auto list = [](const json& v) {
      std::string s;
      for (const auto& k : v) s += (s.empty() ? "" : ", ") + k.get<std::string>();
      return s.empty() ? std::string("(none recorded)") : s;
    };
    o << "  kernels: A " << list(a["kernels"]) << " · B " << list(b["kernels"]) << "\n";
  }
}

std::string PlanText(const json& p) {
  std::ostringstream o;
  const uint64_t max_steps = p.value("max_steps", uint64_t{0});
  o << "plan '" << p["name"].get<std::string>() << "' · runs "
    << p["runs"][0]["name"].get<std::string>() << " and " << p["runs"][1]["name"].get<std::string>()
    << " · "
    << (max_steps ? "steps 0.." + std::to_string(max_steps - 1) : std::string("every step"))
    << "\n";
  o << "  " << ConfigText(p["config"]) << "\n";
  o << "stable boundaries " << U(p, "stable") << " (" << U(p, "equal")
    << " bitwise equal) · nondeterministic " << U(p, "nondeterministic") << " pair(s) at "
    << p["boundaries"].size() << " boundary(ies) · downstream " << U(p, "downstream") << "\n";
  if (!p["first_nondeterministic"].is_null()) FirstText(o, p["first_nondeterministic"]);
  if (!p["boundaries"].empty())
    o << "marked nondeterministic (skipped by `opguard diff --plan`):\n";
  for (const auto& b : p["boundaries"]) {
    o << "  " << b["op"].get<std::string>() << "  " << SiteText(b["site"]) << " · " << U(b, "pairs")
      << " pair(s), first at rank " << b["rank"] << " step " << b["step"] << "\n";
  }
  if (p["boundaries"].empty())
    o << "bitwise reproducible: no op computed other bits from the same inputs\n";
  for (const auto& n : p["notes"]) o << "note: " << n.get<std::string>() << "\n";
  return o.str();
}

// ---- daemon calls --------------------------------------------------------------

Result<std::vector<json>> PlansOf(const Result<daemon::Answer>& answer,
                                  const std::string& endpoint) {
  if (!answer.ok()) return answer.status();
  const auto* a = answer->envelope()->message_as_PlansAnswer();
  if (a == nullptr) return DataLoss("unexpected answer from " + endpoint);
  std::vector<json> out;
  if (a->plans()) {
    for (const auto* s : *a->plans()) {
      json j = json::parse(s->str(), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return DataLoss("a plan document from " + endpoint + " is not JSON");
      out.push_back(std::move(j));
    }
  }
  return out;
}

int PrintPlan(const Args& args, const json& plan) {
  if (args.json) {
    PrintJson(plan);
  } else {
    std::fputs(PlanText(plan).c_str(), stdout);
  }
  return kExitOk;
}

int Compare(const Args& args, const std::string& a, const std::string& b, uint64_t max_steps) {
  flatbuffers::FlatBufferBuilder fb;
  wire::FinishEnvelope(
      fb, wire::CreatePreflightRequest(fb, fb.CreateString(a), fb.CreateString(b),
                                       fb.CreateString(args.name), max_steps, args.replace));
  auto answer = [&] {
    Progress progress("opguard preflight");
    progress.Set("comparing " + a + " and " + b + " on " + args.endpoint);
    daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
    return client.Call(fb);
  }();
  auto plans = PlansOf(answer, args.endpoint);
  if (!plans.ok()) return Fail("preflight", plans.status());
  if (plans->size() != 1)
    return Fail("preflight", DataLoss("no plan in the answer of " + args.endpoint));
  return PrintPlan(args, plans->front());
}

// ---- running the job -----------------------------------------------------------

std::atomic<int> g_stop_signal{0};

void OnStopSignal(int sig) { g_stop_signal.store(sig); }

struct RunProgress {
  bool found = false;
  uint32_t world = 0;
  uint32_t ranks = 0;
  uint64_t min_steps = 0;  // step marks of the rank with the fewest
};

Result<RunProgress> ReadProgress(const Args& args, const std::string& run) {
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  auto answer = client.ListRuns();
  if (!answer.ok()) return answer.status();
  const auto* list = answer->envelope()->message_as_ListRunsAnswer();
  RunProgress p;
  if (list == nullptr || list->runs() == nullptr) return p;
  for (const auto* r : *list->runs()) {
    if (Str(r->name()) != run) continue;
    p.found = true;
    p.world = r->world_size();
    p.min_steps = UINT64_MAX;
    if (r->ranks()) {
      for (const auto* rank : *r->ranks()) {
        ++p.ranks;
        p.min_steps = std::min<uint64_t>(p.min_steps, rank->steps());
      }
    }
    if (p.ranks == 0) p.min_steps = 0;
  }
  return p;
}

void StopGroup(pid_t group) {
  ::kill(-group, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  int status = 0;
  while (::waitpid(group, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(-group, SIGKILL);
      ::waitpid(group, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(-group, SIGKILL);  // ranks the launcher left behind
}

// Runs the job once as `run` and stops it after args.steps steps.
Status RunJob(const Args& args, const std::string& run, const std::string& ingest) {
  if (auto p = ReadProgress(args, run); !p.ok()) {
    return p.status();
  } else if (p->found) {
    return InvalidArgument("run '" + run + "' exists: remove it (`opguard rm " + run +
                           "`) or choose another --name");
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The job and everything it starts are one process group: stopped as one.
    ::setpgid(0, 0);
    // Its output goes to stderr: stdout is the plan's (--json).
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
    ::setenv("OPGUARD", "1", 1);
    ::setenv("OPGUARD_RUN", run.c_str(), 1);
    if (!ingest.empty()) ::setenv("OPGUARD_ENDPOINT", ingest.c_str(), 0);
    std::vector<char*> argv;
    for (const std::string& w : args.words) argv.push_back(const_cast<char*>(w.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "opguard preflight: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with the child's own call
  Progress progress("opguard preflight");
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(args.job_timeout_s * 1000));
  uint64_t steps_seen = 0;
  for (int tick = 0;; ++tick) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      // It ended on its own: fine when it succeeded (a job shorter than
      // --steps is compared as far as it went).
      ::kill(-pid, SIGKILL);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
      return InvalidArgument("run '" + run + "': the job " +
                             (WIFEXITED(status)
                                  ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                  : "was killed by signal " + std::to_string(WTERMSIG(status))) +
                             " after " + std::to_string(steps_seen) + " step(s)");
    }
    if (g_stop_signal.load() != 0) {
      StopGroup(pid);
      return InvalidArgument("interrupted: run '" + run + "' stopped");
    }
    if (Clock::now() > deadline) {
      StopGroup(pid);
      return Unavailable(
          "run '" + run + "' did not finish " + std::to_string(args.steps) + " step(s) within " +
          std::to_string(static_cast<int64_t>(args.job_timeout_s)) + " s (--job-timeout)");
    }
    if (tick % 2 == 0) {  // the daemon every 100 ms
      auto p = ReadProgress(args, run);
      if (p.ok() && p->found) {
        steps_seen = p->min_steps;
        progress.Set("run '" + run + "': " + std::to_string(p->ranks) + "/" +
                     std::to_string(p->world) + " rank(s), step " +
                     std::to_string(std::min(steps_seen, args.steps)) + "/" +
                     std::to_string(args.steps));
        // A rank's k-th step mark starts step k: N + 1 marks on every rank
        // mean steps 0..N-1 are recorded, and step N too, as a margin for
        // records still on their way when the mark was written.
        if (p->world > 0 && p->ranks >= p->world && p->min_steps >= args.steps + 1) {
          StopGroup(pid);
          return Status::Ok();
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The ingest endpoint jobs send to: OPGUARD_ENDPOINT when set (the job's
// own), else the one the daemon reports.
Result<std::string> IngestEndpoint(const Args& args) {
  if (const char* e = std::getenv("OPGUARD_ENDPOINT"); e && *e) return std::string(e);
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  auto answer = client.Status();
  if (!answer.ok()) return answer.status();
  const auto* s = answer->envelope()->message_as_StatusAnswer();
  if (s == nullptr) return DataLoss("unexpected answer from " + args.endpoint);
  return Str(s->ingest());
}

// Whether the command line had "--" after the command name: the words that
// follow it are a command, not runs. CLI11 consumes the separator itself.
bool HasSeparator() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string word;
  bool after_command = false;
  while (std::getline(in, word, '\0')) {
    if (word == "preflight") after_command = true;
    if (after_command && word == "--") return true;
  }
  return false;
}

int PreflightMain(Args& args) {
  if (args.name.empty()) {
    std::fprintf(stderr, "opguard preflight: --name NAME is required (the plan's name)\n");
    return kExitError;
  }
  if (!HasSeparator()) {
    if (args.words.size() != 2) {
      std::fprintf(
          stderr,
          "opguard preflight: give two runs (RUN_A RUN_B) or a command after -- (see --help)\n");
      return kExitError;
    }
    return Compare(args, args.words[0], args.words[1], args.steps_given ? args.steps : 0);
  }
  if (args.words.empty()) {
    std::fprintf(stderr, "opguard preflight: no command after --\n");
    return kExitError;
  }
  if (args.steps == 0) {
    std::fprintf(stderr, "opguard preflight: --steps must be at least 1\n");
    return kExitError;
  }
  auto ingest = IngestEndpoint(args);
  if (!ingest.ok()) return Fail("preflight", ingest.status());
  ::signal(SIGINT, OnStopSignal);
  ::signal(SIGTERM, OnStopSignal);
  const std::string runs[2] = {args.name + "-a", args.name + "-b"};
  for (const std::string& run : runs) {
    Status st = RunJob(args, run, *ingest);
    if (!st.ok()) return Fail("preflight", st);
  }
  return Compare(args, runs[0], runs[1], args.steps);
}

std::function<int()> AddPreflight(CLI::App& cmd, const DaemonArgs& top) {
  auto args = std::make_shared<Args>();
  args->timeout_s = 300;
  AddDaemonOptions(cmd, *args, top, /*json=*/true);
  cmd.add_option("--name", args->name, "the plan's name (runs of a command: NAME-a, NAME-b)")
      ->option_text("NAME");
  cmd.add_option("--steps", args->steps,
                 "with a command: run and compare N steps (default 5); with two runs:\n"
                 "compare steps 0..N-1 only (default: every step)")
      ->option_text("N")
      ->each([args](const std::string&) { args->steps_given = true; });
  cmd.add_flag("--replace", args->replace, "overwrite a plan of that name");
  cmd.add_option("--job-timeout", args->job_timeout_s,
                 "bound on each run of the command, in seconds")
      ->option_text("S (default 3600)");
  cmd.add_option("RUNS", args->words, "RUN_A RUN_B, or after -- the command to run twice")
      ->expected(1, INT_MAX);
  cmd.footer(
      "Two self-replays of one job (same code, data and settings), compared op for op: ops that\n"
      "read the same bytes and wrote other bytes are bitwise nondeterministic. The daemon stores\n"
      "them as plan NAME; `opguard diff --plan NAME REF SUSPECT` then skips them. E.g.\n"
      "  opguard preflight --name gpt --steps 5 -- torchrun --nproc-per-node 8 train.py\n"
      "Exit codes: 0 the plan is stored; 2 an error (usage, a failed job, the daemon).");
  return [args] { return PreflightMain(*args); };
}

int PlansMain(const Args& args) {
  flatbuffers::FlatBufferBuilder fb;
  const std::string name = args.words.empty() ? std::string() : args.words[0];
  wire::FinishEnvelope(fb, wire::CreatePlansRequest(fb, fb.CreateString(name)));
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  auto plans = PlansOf(client.Call(fb), args.endpoint);
  if (!plans.ok()) return Fail("plans", plans.status());
  if (!name.empty() && plans->size() == 1) return PrintPlan(args, plans->front());
  if (args.json) {
    PrintJson(json(*plans));
    return kExitOk;
  }
  if (plans->empty()) {
    std::printf("no plans stored on %s\n", args.endpoint.c_str());
    return kExitOk;
  }
  std::printf("%-28s %-40s %8s %10s %s\n", "PLAN", "RUNS", "STEPS", "NONDET", "CONFIGURATION");
  for (const json& p : *plans) {
    const uint64_t steps = p.value("max_steps", uint64_t{0});
    std::printf(
        "%-28s %-40s %8s %10zu %s\n", p.value("name", std::string()).c_str(),
        (p["runs"][0]["name"].get<std::string>() + " " + p["runs"][1]["name"].get<std::string>())
            .c_str(),
        steps ? std::to_string(steps).c_str() : "all", p["boundaries"].size(),
        ConfigText(p["config"]).c_str());
  }
  return kExitOk;
}

std::function<int()> AddPlans(CLI::App& cmd, const DaemonArgs& top) {
  auto args = std::make_shared<Args>();
  args->timeout_s = 5;
  AddDaemonOptions(cmd, *args, top, /*json=*/true);
  cmd.add_option("PLAN", args->words, "show one plan (default: list them)")->expected(0, 1);
  return [args] { return PlansMain(*args); };
}

}  // namespace

OPGUARD_CLI_COMMAND(
    preflight, "preflight",
    "two self-replays compared: store the ops that are bitwise nondeterministic as a plan",
    &AddPreflight);
OPGUARD_CLI_COMMAND(plans, "plans", "list the preflight plans a daemon stores, or show one",
                    &AddPlans);

}  // namespace opguard::cli
