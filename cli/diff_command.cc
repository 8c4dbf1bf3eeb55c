// `opguard diff`, `opguard ranks`, `opguard collectives`: the aligner's
// answers from the daemons. The daemon that receives the query aligns the
// ranks it holds, asks its peers for theirs and merges (docs/daemon.md,
// "Cluster queries"); this file only asks and renders, with the same
// conversions the daemon used (opguard/daemon/report_wire.h).
//
// Exit codes (docs/report-format.md): 0 identical / consistent; 1 diverged,
// incomplete or partial (and an unreachable daemon or a daemon-side error);
// 2 usage errors.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/daemon_args.h"
#include "opguard/aligner/render.h"
#include "opguard/daemon/client.h"
#include "opguard/daemon/report_wire.h"

namespace opguard::cli {
namespace {

struct Args : DaemonArgs {
  Args() { timeout_s = 120; }
  int64_t rank = -1;
  std::vector<uint32_t> replicas;
};

bool ParseRank(const std::string& text, uint32_t* out) {
  if (text.empty() || text.size() > 10) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (v > UINT32_MAX) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// The daemon options (cli/daemon_args.h), --json, and per command --rank R /
// --replicas R,R,...; returns false after a one-line error.
bool Parse(int argc, char** argv, const char* usage, bool allow_rank, bool allow_replicas,
           Args* out) {
  const std::string cmd = argv[0];
  auto extra = [&](const std::string& option, const std::function<const char*()>& value) -> int {
    if (allow_rank && option == "--rank") {
      const char* v = value();
      uint32_t r = 0;
      if (!v || !ParseRank(v, &r)) {
        std::fprintf(stderr, "opguard %s: --rank wants a rank number\n", cmd.c_str());
        return -1;
      }
      out->rank = r;
      return 1;
    }
    if (allow_replicas && option == "--replicas") {
      const char* v = value();
      if (!v) return -1;
      std::string list = v;
      size_t p = 0;
      while (p <= list.size()) {
        size_t q = list.find(',', p);
        if (q == std::string::npos) q = list.size();
        uint32_t r = 0;
        if (!ParseRank(list.substr(p, q - p), &r)) {
          std::fprintf(stderr,
                       "opguard %s: --replicas wants ranks separated by commas, e.g. 0,1,2,3\n",
                       cmd.c_str());
          return -1;
        }
        out->replicas.push_back(r);
        p = q + 1;
      }
      return 1;
    }
    return 0;
  };
  return ParseDaemonArgs(argc, argv, usage, /*allow_json=*/true, out, extra);
}

// Peers get most of the CLI's own timeout so that a missing peer still leaves
// time for the receiver to merge and answer (as `partial`).
uint32_t PeerTimeoutMs(const Args& a) {
  double ms = a.timeout_s * 1000 * 0.7;
  return static_cast<uint32_t>(std::max(100.0, std::min(ms, 3600000.0)));
}

int Fail(const char* command, const Status& st) {
  std::fprintf(stderr, "opguard %s: %s\n", command, st.message().c_str());
  return 1;
}

int ExitCode(aligner::DiffStatus s) { return s == aligner::DiffStatus::kIdentical ? 0 : 1; }

int DiffMain(int argc, char** argv) {
  static const char* kUsage =
      "diff REFERENCE SUSPECT [--rank R] [--json] [--daemon ENDPOINT] [--timeout S]";
  Args args;
  if (!Parse(argc, argv, kUsage, true, false, &args)) return 2;
  if (args.positional.size() != 2) {
    std::fprintf(stderr, "opguard diff: give a reference and a suspect run (usage: opguard %s)\n",
                 kUsage);
    return 2;
  }
  daemon::DaemonClient client(args.endpoint, args.timeout());
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateDiffRequest(b, b.CreateString(args.positional[0]),
                                                  b.CreateString(args.positional[1]), args.rank,
                                                  false, PeerTimeoutMs(args), 0));
  auto answer = client.Call(b);
  if (!answer.ok()) return Fail("diff", answer.status());
  const auto* a = answer->envelope()->message_as_DiffAnswer();
  if (a == nullptr) return Fail("diff", DataLoss("unexpected answer from " + args.endpoint));
  aligner::DiffReport report = daemon::MergeDiffAnswer(*a);
  if (args.json) {
    auto j = aligner::ToJson(report);
    j["reference_run"] = args.positional[0];
    j["suspect_run"] = args.positional[1];
    j["nodes"] = daemon::NodesJson(a->nodes());
    PrintJson(j);
  } else {
    std::printf("opguard diff %s %s · %s\n", args.positional[0].c_str(), args.positional[1].c_str(),
                aligner::DiffStatusName(report.status));
    std::fputs(aligner::ToText(report).c_str(), stdout);
  }
  return ExitCode(report.status);
}

int RanksMain(int argc, char** argv) {
  static const char* kUsage =
      "ranks RUN [--replicas R,R,...] [--json] [--daemon ENDPOINT] [--timeout S]";
  Args args;
  if (!Parse(argc, argv, kUsage, false, true, &args)) return 2;
  if (args.positional.size() != 1) {
    std::fprintf(stderr, "opguard ranks: give exactly one run (usage: opguard %s)\n", kUsage);
    return 2;
  }
  daemon::DaemonClient client(args.endpoint, args.timeout());
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(
      b, wire::CreateRanksRequest(b, b.CreateString(args.positional[0]), false, PeerTimeoutMs(args),
                                  b.CreateVector(args.replicas)));
  auto answer = client.Call(b);
  if (!answer.ok()) return Fail("ranks", answer.status());
  const auto* a = answer->envelope()->message_as_RanksAnswer();
  if (a == nullptr) return Fail("ranks", DataLoss("unexpected answer from " + args.endpoint));
  auto j = daemon::RanksJson(*a);
  j["run"] = args.positional[0];
  if (args.json) {
    PrintJson(j);
  } else {
    std::printf("opguard ranks %s · %s\n", args.positional[0].c_str(),
                j["status"].get<std::string>().c_str());
    std::fputs(daemon::RanksText(*a).c_str(), stdout);
  }
  return j["status"] == "identical" ? 0 : 1;
}

int CollectivesMain(int argc, char** argv) {
  static const char* kUsage = "collectives RUN [--json] [--daemon ENDPOINT] [--timeout S]";
  Args args;
  args.timeout_s = 30;
  if (!Parse(argc, argv, kUsage, false, false, &args)) return 2;
  if (args.positional.size() != 1) {
    std::fprintf(stderr, "opguard collectives: give exactly one run (usage: opguard %s)\n", kUsage);
    return 2;
  }
  daemon::DaemonClient client(args.endpoint, args.timeout());
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateCollectivesRequest(b, b.CreateString(args.positional[0]),
                                                         false, PeerTimeoutMs(args)));
  auto answer = client.Call(b);
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
                report.status == aligner::DiffStatus::kIdentical
                    ? "consistent"
                    : aligner::DiffStatusName(report.status),
                report.waiting ? " · waiting" : "");
    std::fputs(aligner::ToText(report).c_str(), stdout);
  }
  return ExitCode(report.status);
}

}  // namespace

OPGUARD_CLI_COMMAND(
    diff, "diff", "diff REFERENCE SUSPECT [--rank R] [--json] [--daemon ENDPOINT] [--timeout S]",
    "the first op where two runs stop agreeing bit for bit, and the first diverging rank",
    &DiffMain);
OPGUARD_CLI_COMMAND(ranks, "ranks",
                    "ranks RUN [--replicas R,R,...] [--json] [--daemon ENDPOINT] [--timeout S]",
                    "cross-rank checks of one run: collective outputs, desyncs, replicas",
                    &RanksMain);
OPGUARD_CLI_COMMAND(collectives, "collectives",
                    "collectives RUN [--json] [--daemon ENDPOINT] [--timeout S]",
                    "collective desyncs and mismatches, and who a live or hung run waits for",
                    &CollectivesMain);

}  // namespace opguard::cli
