// `opguard status`, `opguard runs`, `opguard rm`: thin faces over the daemon
// query client. Every call is bounded by --timeout; an unreachable daemon is
// one line on stderr and exit code 2 (kExitError).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/daemon_args.h"
#include "cli/terminal.h"
#include "opguard/daemon/client.h"
#include "opguard/daemon/status_json.h"

namespace opguard::cli {
namespace {

std::string FormatTime(uint64_t ns) {
  if (ns == 0) return "-";
  std::time_t t = static_cast<std::time_t>(ns / 1000000000ull);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string FormatBytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

int StatusMain(const DaemonArgs& args) {
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  auto answer = client.Status();
  if (!answer.ok()) return Fail("status", answer.status());
  const auto* s = answer->envelope()->message_as_StatusAnswer();
  if (s == nullptr) return Fail("status", DataLoss("unexpected answer from " + args.endpoint));
  if (args.json) {
    // The daemon's /api/status, plus the endpoint asked.
    nlohmann::json j = daemon::StatusJson(*s);
    j["endpoint"] = args.endpoint;
    PrintJson(j);
    return 0;
  }
  const uint64_t up = s->uptime_s();
  std::printf("opguardd %s on %s, up %lluh%02llum%02llus\n", Str(s->version()).c_str(), Str(s->node()).c_str(),
              static_cast<unsigned long long>(up / 3600), static_cast<unsigned long long>(up / 60 % 60),
              static_cast<unsigned long long>(up % 60));
  std::printf("  data      %s (%s)\n", Str(s->data_dir()).c_str(), FormatBytes(s->disk_bytes()).c_str());
  std::printf("  runs      %llu\n", static_cast<unsigned long long>(s->runs()));
  std::printf("  records   %llu ingested since start, %llu batches rejected\n",
              static_cast<unsigned long long>(s->records_ingested()),
              static_cast<unsigned long long>(s->batches_rejected()));
  std::printf("  ingest    %s\n", Str(s->ingest()).c_str());
  if (s->ingest_paused()) {
    const auto now_s = static_cast<uint64_t>(std::time(nullptr));
    for (const auto* p : *s->ingest_paused()) {
      const uint64_t since_s = p->since_ns() / 1000000000ull;
      std::printf(
          "  paused    %s since %s (%llu s): %s\n",
          Str(p->cause()) == "disk_space" ? "for disk space" : "at the in-flight byte budget",
          FormatTime(p->since_ns()).c_str(),
          static_cast<unsigned long long>(now_s > since_s ? now_s - since_s : 0),
          Str(p->reason()).c_str());
    }
  }
  std::printf("  queries   %s\n", Str(s->listen()).c_str());
  std::printf("  http      %s\n", s->http() && s->http()->size() ? s->http()->c_str() : "off");
  if (s->peers() && s->peers()->size()) {
    std::string peers;
    for (const auto* p : *s->peers()) peers += (peers.empty() ? "" : ", ") + p->str();
    std::printf("  peers     %s\n", peers.c_str());
  }
  return 0;
}

int RunsMain(const DaemonArgs& args) {
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  auto answer = client.ListRuns();
  if (!answer.ok()) return Fail("runs", answer.status());
  const auto* list = answer->envelope()->message_as_ListRunsAnswer();
  if (list == nullptr) return Fail("runs", DataLoss("unexpected answer from " + args.endpoint));
  if (args.json) {  // the daemon's /api/runs
    PrintJson(daemon::RunsJson(*list));
    return 0;
  }
  if (!list->runs() || list->runs()->size() == 0) {
    std::printf("no runs stored on %s\n", args.endpoint.c_str());
    return 0;
  }
  std::printf("%-28s %-10s %6s %12s %7s %8s %-20s %-20s %s\n", "RUN", "OWNER", "RANKS", "OPS", "STEPS", "GAPS",
              "STARTED", "LAST RECORD", "FRAMEWORK");
  for (const auto* run : *list->runs()) {
    uint64_t ops = 0, steps = 0, gaps = 0;
    size_t ranks = 0, ended = 0;
    if (run->ranks()) {
      for (const auto* r : *run->ranks()) {
        ops += r->ops();
        steps = std::max<uint64_t>(steps, r->steps());
        gaps += r->gaps();
        ended += r->ended() ? 1 : 0;
        ++ranks;
      }
    }
    std::string rank_text = std::to_string(ranks);
    if (run->world_size() && run->world_size() != ranks) rank_text += "/" + std::to_string(run->world_size());
    // The owner's name on the daemon's host, else its uid; "-": unknown.
    const std::string owner = run->owner_uid() < 0                     ? "-"
                              : run->owner() && run->owner()->size() != 0 ? Str(run->owner())
                                                                      : std::to_string(run->owner_uid());
    std::printf("%-28s %-10s %6s %12llu %7llu %8llu %-20s %-20s %s%s\n", Str(run->name()).c_str(), owner.c_str(),
                rank_text.c_str(),
                static_cast<unsigned long long>(ops), static_cast<unsigned long long>(steps),
                static_cast<unsigned long long>(gaps), FormatTime(run->start_ns()).c_str(),
                FormatTime(run->end_ns()).c_str(), Str(run->framework()).c_str(),
                ranks && ended == ranks ? " (ended)" : "");
  }
  return 0;
}

// `opguard rm --plan NAME`: a preflight plan instead of a run.
int RmPlan(const DaemonArgs& args, const std::string& plan) {
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateDeletePlanRequest(b, b.CreateString(plan)));
  auto answer = client.Call(b);
  if (!answer.ok()) return Fail("rm", answer.status());
  if (answer->envelope()->message_as_OkAnswer() == nullptr) {
    return Fail("rm", DataLoss("unexpected answer from " + args.endpoint));
  }
  std::printf("removed plan '%s'\n", plan.c_str());
  return 0;
}

int RmMain(const DaemonArgs& args) {
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  Status st = [&] {
    Progress progress("opguard rm");  // a delete waits for a durable write
    progress.Set("deleting '" + args.positional[0] + "' on " + args.endpoint);
    return client.DeleteRun(args.positional[0]);
  }();
  if (!st.ok()) return Fail("rm", st);
  std::printf("removed run '%s'\n", args.positional[0].c_str());
  return 0;
}

std::function<int()> AddStatus(CLI::App& cmd, const DaemonArgs& top) {
  return AddDaemonCommand(cmd, top, &StatusMain, 5, /*json=*/true);
}

std::function<int()> AddRuns(CLI::App& cmd, const DaemonArgs& top) {
  return AddDaemonCommand(cmd, top, &RunsMain, 5, /*json=*/true);
}

std::function<int()> AddRm(CLI::App& cmd, const DaemonArgs& top) {
  // Deleting waits for a durable write: a longer default timeout.
  auto args = std::make_shared<DaemonArgs>();
  args->timeout_s = 60;
  AddDaemonOptions(cmd, *args, top, /*json=*/false);
  auto plan = std::make_shared<std::string>();
  cmd.add_option("--plan", *plan, "delete this preflight plan instead of a run")->option_text("NAME");
  cmd.add_option("RUN", args->positional, "the run to delete")->expected(0, 1);
  return [args, plan] {
    if (!plan->empty()) {
      if (!args->positional.empty()) {
        std::fprintf(stderr, "opguard rm: give a RUN or --plan NAME, not both\n");
        return kExitError;
      }
      return RmPlan(*args, *plan);
    }
    if (args->positional.empty()) {
      std::fprintf(stderr, "opguard rm: RUN is required (or --plan NAME)\n");
      return kExitError;
    }
    return RmMain(*args);
  };
}

}  // namespace

OPGUARD_CLI_COMMAND(status, "status", "show the node daemon's state (endpoints, runs, disk use)",
                    &AddStatus);
OPGUARD_CLI_COMMAND(runs, "runs", "list the runs a daemon stores (ranks, ops, steps, gaps, times)",
                    &AddRuns);
OPGUARD_CLI_COMMAND(rm, "rm", "delete a run's records and metadata (or a preflight plan) from a daemon",
                    &AddRm);

}  // namespace opguard::cli
