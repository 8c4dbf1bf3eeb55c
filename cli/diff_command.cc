// `opguard diff`, `opguard ranks`, `opguard collectives`: the aligner's
// answers from the daemons. The daemon that receives the query aligns the
// ranks it holds, asks its peers for theirs and merges (docs/daemon.md,
// "Cluster queries"); this file only asks and renders, with the same
// conversions the daemon used (opguard/daemon/report_wire.h).
//
// Exit codes (command.h, README.md): 0 identical / consistent; 1 diverged;
// 2 an error (usage, an unreachable daemon, an error answer); 3 incomplete or
// partial.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/daemon_args.h"
#include "cli/terminal.h"
#include "opguard/aligner/render.h"
#include "opguard/daemon/client.h"
#include "opguard/daemon/report_wire.h"

namespace opguard::cli {
namespace {

struct Args : DaemonArgs {
  int64_t rank = -1;
  std::string plan;  // a preflight plan (opguard preflight)
  std::vector<uint32_t> replicas;
};

// Peers get most of the CLI's own timeout so that a missing peer still leaves
// time for the receiver to merge and answer (as `partial`).
uint32_t PeerTimeoutMs(const Args& a) {
  double ms = a.timeout_s * 1000 * 0.7;
  return static_cast<uint32_t>(std::max(100.0, std::min(ms, 3600000.0)));
}

int ExitCode(aligner::DiffStatus s) {
  switch (s) {
    case aligner::DiffStatus::kIdentical: return kExitOk;
    case aligner::DiffStatus::kDiverged: return kExitDiverged;
    default: return kExitIncomplete;
  }
}

std::string PaintStatus(const char* status) {
  const std::string_view s(status);
  const Colour c = s == "identical" || s == "consistent" ? Colour::kGreen
                   : s == "diverged"                     ? Colour::kRed
                                                         : Colour::kYellow;
  return Paint(s, c);
}

// Sends `request` with a progress line ("opguard diff: aligning on ENDPOINT")
// for a person who waits at a terminal.
Result<daemon::Answer> Ask(const char* command, const Args& args,
                           const flatbuffers::FlatBufferBuilder& request) {
  Progress progress(std::string("opguard ") + command);
  progress.Set("aligning on " + args.endpoint);
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  return client.Call(request);
}

int DiffMain(const Args& args) {
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateDiffRequest(b, b.CreateString(args.positional[0]),
                                                  b.CreateString(args.positional[1]), args.rank,
                                                  false, PeerTimeoutMs(args), 0,
                                                  args.plan.empty() ? 0 : b.CreateString(args.plan)));
  auto answer = Ask("diff", args, b);
  if (!answer.ok()) return Fail("diff", answer.status());
  const auto* a = answer->envelope()->message_as_DiffAnswer();
  if (a == nullptr) return Fail("diff", DataLoss("unexpected answer from " + args.endpoint));
  aligner::DiffReport report = daemon::MergeDiffAnswer(*a);
  if (args.json) {
    auto j = aligner::ToJson(report);
    j["reference_run"] = args.positional[0];
    j["suspect_run"] = args.positional[1];
    j["plan"] = args.plan.empty() ? nlohmann::json(nullptr) : nlohmann::json(args.plan);
    j["nodes"] = daemon::NodesJson(a->nodes());
    PrintJson(j);
  } else {
    std::printf("opguard diff %s %s · %s\n", args.positional[0].c_str(), args.positional[1].c_str(),
                PaintStatus(aligner::DiffStatusName(report.status)).c_str());
    std::fputs(aligner::ToText(report).c_str(), stdout);
  }
  return ExitCode(report.status);
}

int RanksMain(const Args& args) {
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(
      b, wire::CreateRanksRequest(b, b.CreateString(args.positional[0]), false, PeerTimeoutMs(args),
                                  b.CreateVector(args.replicas)));
  auto answer = Ask("ranks", args, b);
  if (!answer.ok()) return Fail("ranks", answer.status());
  const auto* a = answer->envelope()->message_as_RanksAnswer();
  if (a == nullptr) return Fail("ranks", DataLoss("unexpected answer from " + args.endpoint));
  auto j = daemon::RanksJson(*a);
  j["run"] = args.positional[0];
  if (args.json) {
    PrintJson(j);
  } else {
    std::printf("opguard ranks %s · %s\n", args.positional[0].c_str(),
                PaintStatus(j["status"].get<std::string>().c_str()).c_str());
    std::fputs(daemon::RanksText(*a).c_str(), stdout);
  }
  return j["status"] == "identical"  ? kExitOk
         : j["status"] == "diverged" ? kExitDiverged
                                     : kExitIncomplete;
}

int CollectivesMain(const Args& args) {
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateCollectivesRequest(b, b.CreateString(args.positional[0]),
                                                         false, PeerTimeoutMs(args)));
  auto answer = Ask("collectives", args, b);
  if (!answer.ok()) return Fail("collectives", answer.status());
  const auto* a = answer->envelope()->message_as_CollectivesAnswer();
  if (a == nullptr) return Fail("collectives", DataLoss("unexpected answer from " + args.endpoint));
  aligner::CollectivesReport report = daemon::CheckCollectivesAnswer(*a);
  if (args.json) {
    auto j = aligner::ToJson(report);
    j["run"] = args.positional[0];
    j["nodes"] = daemon::NodesJson(a->nodes());
    PrintJson(j);
  } else {
    std::printf("opguard collectives %s · %s%s\n", args.positional[0].c_str(),
                PaintStatus(report.status == aligner::DiffStatus::kIdentical
                                ? "consistent"
                                : aligner::DiffStatusName(report.status))
                    .c_str(),
                report.waiting ? " · waiting" : "");
    std::fputs(aligner::ToText(report).c_str(), stdout);
  }
  return ExitCode(report.status);
}

constexpr char kExitCodes[] =
    "Exit codes: 0 identical (consistent); 1 diverged; 2 error (usage, the daemon unreachable,\n"
    "an error answer such as an unknown run); 3 incomplete (records missing near the answer)\n"
    "or partial (a peer daemon did not answer).";

// The daemon options, the runs (RUN, or REFERENCE and SUSPECT) and the exit codes.
std::shared_ptr<Args> AddCommon(CLI::App& cmd, const DaemonArgs& top, double timeout_s,
                                std::initializer_list<std::pair<const char*, const char*>> runs) {
  auto args = std::make_shared<Args>();
  args->timeout_s = timeout_s;
  AddDaemonOptions(cmd, *args, top, /*json=*/true);
  for (const auto& [name, help] : runs) {
    cmd.add_option_function<std::string>(
           name, [args](const std::string& run) { args->positional.push_back(run); }, help)
        ->required();
  }
  cmd.footer(kExitCodes);
  return args;
}

std::function<int()> AddDiff(CLI::App& cmd, const DaemonArgs& top) {
  auto args = AddCommon(
      cmd, top, 120,
      {{"REFERENCE", "the run taken as correct"}, {"SUSPECT", "the run compared with it"}});
  cmd.add_option("--rank", args->rank, "compare one rank only (default: every rank)")
      ->option_text("R")
      ->check(CLI::Range(int64_t{0}, int64_t{UINT32_MAX}));
  cmd.add_option("--plan", args->plan,
                 "a preflight plan: its nondeterministic ops are skipped, never a pivot\n"
                 "(refused for runs of another world size, torch or determinism settings)")
      ->option_text("NAME");
  return [args] {
    StartUserDaemonIfChosen(*args);
    return DiffMain(*args);
  };
}

std::function<int()> AddRanks(CLI::App& cmd, const DaemonArgs& top) {
  auto args = AddCommon(cmd, top, 120, {{"RUN", "the run whose ranks are compared"}});
  cmd.add_option("--replicas", args->replicas, "ranks that must hold identical replicas")
      ->option_text("R,R,...")
      ->delimiter(',');
  return [args] {
    StartUserDaemonIfChosen(*args);
    return RanksMain(*args);
  };
}

std::function<int()> AddCollectives(CLI::App& cmd, const DaemonArgs& top) {
  auto args = AddCommon(cmd, top, 30, {{"RUN", "the run whose collectives are checked"}});
  return [args] {
    StartUserDaemonIfChosen(*args);
    return CollectivesMain(*args);
  };
}

}  // namespace

OPGUARD_CLI_COMMAND(
    diff, "diff",
    "the first op where two runs stop agreeing bit for bit, and the first diverging rank",
    &AddDiff);
OPGUARD_CLI_COMMAND(ranks, "ranks",
                    "cross-rank checks of one run: collective outputs, desyncs, replicas",
                    &AddRanks);
OPGUARD_CLI_COMMAND(collectives, "collectives",
                    "collective desyncs and mismatches, and who a live or hung run waits for",
                    &AddCollectives);

}  // namespace opguard::cli
