// `opguard export RUN [--vs REF] --perfetto FILE`: a run (and the run it is
// compared with) as Chrome/Perfetto trace-event JSON (the "JSON Object
// Format": traceEvents, displayTimeUnit), for ui.perfetto.dev or
// chrome://tracing. docs/export.md describes the layout:
//
//   process per run ("REF · reference", "RUN · suspect"), thread per rank and
//   lane; one complete event ("X") per op with its arguments; with --vs a
//   flow ("s" -> "f") from each reference op to the suspect op it is aligned
//   with, and a process-scoped instant ("i") at the first divergence in each.
//
// The ops come from the daemon's paged trace query, one (rank, lane) of each
// run at a time, and events are streamed to FILE as they are made, so memory
// holds one lane of each run. The pivot is the daemon's own `opguard diff`
// answer; the flows come from aligning each lane here with the aligner's
// AlignLane (the daemon sends pivots, not pairs), keyed on line numbers
// instead of source text (RunReader::Boundary).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/daemon_args.h"
#include "cli/run_reader.h"
#include "cli/terminal.h"
#include "opguard/aligner/align.h"
#include "opguard/aligner/render.h"
#include "opguard/daemon/client.h"
#include "opguard/daemon/report_wire.h"

namespace opguard::cli {
namespace {

using json = nlohmann::json;

struct Args : DaemonArgs {
  std::string vs;
  std::string out;
  std::string time = "auto";
  int64_t rank = -1;
};

// Streams the trace-event JSON object: one event per line, so a 10-million-op
// export never sits in memory as one document.
class TraceEventWriter {
 public:
  explicit TraceEventWriter(std::FILE* out) : out_(out) {
    std::fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[", out_);
  }
  void Event(const json& e) {
    std::fputs(first_ ? "\n" : ",\n", out_);
    first_ = false;
    std::fputs(e.dump(-1, ' ', false, json::error_handler_t::replace).c_str(), out_);
  }
  void Finish(const json& other_data) {
    std::fprintf(out_, "\n],\"otherData\":%s}\n",
                 other_data.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }

 private:
  std::FILE* out_;
  bool first_ = true;
};

// Where each op of one track sits on the time axis, in microseconds (the
// format's unit). By op index: op i is [i, i + 1), the same place in both runs
// for ops that did not move. By wall clock: the recorded start and duration
// from the run's first op, with an op that would end after the op enclosing it
// cut at that op's end (trace viewers need slices on one track to nest).
struct Span {
  double ts = 0;
  double dur = 0;
  double Anchor() const { return ts + std::min(dur, 1.0) / 2; }  // where flows bind: inside the op
};

std::vector<Span> Layout(const std::vector<aligner::OpDetail>& ops, bool wall, uint64_t origin_ns) {
  std::vector<Span> spans(ops.size());
  if (!wall) {
    for (size_t i = 0; i < ops.size(); ++i) spans[i] = {static_cast<double>(ops[i].op_index), 1.0};
    return spans;
  }
  // Ops are numbered when they end (an enclosing op after the ops it called),
  // so nesting is decided in start order, outer op first.
  std::vector<size_t> order(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (ops[a].start_ns != ops[b].start_ns) return ops[a].start_ns < ops[b].start_ns;
    return ops[a].duration_ns > ops[b].duration_ns;
  });
  std::vector<double> open;  // ends of the enclosing ops
  for (size_t i : order) {
    const auto& op = ops[i];
    const double ts =
        op.start_ns > origin_ns ? static_cast<double>(op.start_ns - origin_ns) / 1000 : 0;
    double end = ts + static_cast<double>(op.duration_ns) / 1000;
    while (!open.empty() && open.back() <= ts) open.pop_back();
    if (!open.empty()) end = std::min(end, open.back());
    open.push_back(end);
    spans[i] = {ts, end - ts};
  }
  return spans;
}

int64_t Tid(uint32_t rank, uint32_t lane) {
  // Distinct from the pids (1, 2); lanes are < 4096 (docs/torch.md).
  return 16 + int64_t{rank} * 4096 + lane;
}

json TensorArgs(const aligner::TensorInfo& t) {
  return {{"fingerprint", aligner::FpHex(t.fingerprint)},
          {"dtype", aligner::DTypeName(t.dtype)},
          {"shape", t.shape}};
}

json OpArgs(const aligner::OpDetail& op, const RunReader& reader) {
  json outputs = json::array(), inputs = json::array(), kernels = json::array();
  for (const auto& t : op.outputs) outputs.push_back(TensorArgs(t));
  for (const auto& in : op.inputs) {
    switch (in.kind) {
      case aligner::ValueKind::kTensor:
        inputs.push_back(TensorArgs(in.tensor));
        break;
      case aligner::ValueKind::kScalar:
        inputs.push_back(
            {{"scalar_bits", in.scalar_bits}, {"dtype", aligner::DTypeName(in.scalar_dtype)}});
        break;
      case aligner::ValueKind::kTensorList: {
        json list = json::array();
        for (const auto& t : in.tensors) list.push_back(TensorArgs(t));
        inputs.push_back({{"tensors", list}});
        break;
      }
      default:
        inputs.push_back(nullptr);
    }
  }
  for (uint64_t k : op.kernels) kernels.push_back(reader.String(k));
  json args = {{"op_index", op.op_index}, {"step", op.step},  {"backward", op.backward},
               {"outputs", outputs},      {"inputs", inputs}, {"kernels", kernels}};
  if (const auto* site = reader.SiteOf(op.site)) {
    args["site"] = site->file + ":" + std::to_string(site->line);
    args["function"] = site->function;
  }
  if (op.seq_nr >= 0) args["seq_nr"] = op.seq_nr;
  if (op.nondeterministic) args["nondeterministic"] = true;
  if (op.trusted) args["trusted"] = true;
  return args;
}

// One run's side of the export.
struct Side {
  Side(daemon::DaemonClient* client, std::string run, int pid, std::string role)
      : reader(client, std::move(run)), pid(pid), role(std::move(role)) {}
  RunReader reader;
  int pid;
  std::string role;  // "reference" | "suspect" | "" (a run alone)
  std::map<uint32_t, std::vector<RunReader::LaneStart>> lanes;  // by rank
  uint64_t origin_ns = UINT64_MAX;
  uint64_t ops = 0;
};

// The ranks of `run` (every one, or --rank), from the daemon's run list.
Result<std::vector<uint32_t>> RanksOf(const wire::ListRunsAnswer& list, const std::string& run,
                                      int64_t only, const std::string& endpoint) {
  if (list.runs()) {
    for (const auto* r : *list.runs()) {
      if (!r->name() || r->name()->str() != run) continue;
      std::vector<uint32_t> ranks;
      if (r->ranks()) {
        for (const auto* s : *r->ranks()) {
          if (only < 0 || s->rank() == only) ranks.push_back(s->rank());
        }
      }
      if (only >= 0 && ranks.empty()) {
        return NotFound("run '" + run + "' has no rank " + std::to_string(only) +
                        " (`opguard runs` lists its ranks)");
      }
      return ranks;
    }
  }
  return NotFound("no run named '" + run + "' on " + endpoint + " (`opguard runs` lists them)");
}

int ExportMain(const Args& args) {
  Progress progress("opguard export");
  // The progress line goes before anything else is printed on stderr.
  auto fail = [&progress](const Status& st) {
    progress.Stop();
    return Fail("export", st);
  };
  daemon::DaemonClient client(args.endpoint, args.timeout(), args.curve);
  progress.Set("listing runs on " + args.endpoint);
  auto runs = client.ListRuns();
  if (!runs.ok()) return fail(runs.status());
  const auto* list = runs->envelope()->message_as_ListRunsAnswer();
  if (list == nullptr) return fail(DataLoss("unexpected answer from " + args.endpoint));

  const bool vs = !args.vs.empty();
  std::vector<std::unique_ptr<Side>> sides;  // the reference first: drawn on top
  if (vs) sides.push_back(std::make_unique<Side>(&client, args.vs, 1, "reference"));
  sides.push_back(
      std::make_unique<Side>(&client, args.positional[0], vs ? 2 : 1, vs ? "suspect" : ""));
  std::set<uint32_t> ranks;
  for (auto& side : sides) {
    auto r = RanksOf(*list, side->reader.run(), args.rank, args.endpoint);
    if (!r.ok()) return fail(r.status());
    for (uint32_t rank : *r) {
      progress.Set("finding lanes of " + side->reader.run() + " rank " + std::to_string(rank));
      auto lanes = side->reader.Lanes(rank);
      if (!lanes.ok()) return fail(lanes.status());
      for (const auto& l : *lanes) side->origin_ns = std::min(side->origin_ns, l.start_ns);
      side->lanes[rank] = std::move(*lanes);
      ranks.insert(rank);
    }
  }
  // Wall time only means something where the recorder measured each op (the
  // PyTorch adapter does); a time the shim stamped has no duration.
  bool wall = args.time == "wall";
  if (args.time == "auto") {
    wall = true;
    for (const auto& side : sides) {
      for (const auto& [rank, lanes] : side->lanes) {
        for (const auto& l : lanes) wall = wall && l.duration_ns > 0;
      }
    }
  }

  std::optional<aligner::DiffReport> report;
  if (vs) {
    progress.Set("diff " + args.vs + " " + args.positional[0] + " on " + args.endpoint);
    flatbuffers::FlatBufferBuilder b;
    wire::FinishEnvelope(
        b, wire::CreateDiffRequest(b, b.CreateString(args.vs), b.CreateString(args.positional[0]),
                                   args.rank, false, 0, 0));
    auto answer = client.Call(b);
    if (!answer.ok()) return fail(answer.status());
    const auto* a = answer->envelope()->message_as_DiffAnswer();
    if (a == nullptr) return fail(DataLoss("unexpected answer from " + args.endpoint));
    report = daemon::MergeDiffAnswer(*a);
  }
  const aligner::FirstDivergence* pivot =
      report && report->first_divergence ? &*report->first_divergence : nullptr;

  std::FILE* out = args.out == "-" ? stdout : std::fopen(args.out.c_str(), "w");
  if (out == nullptr) {
    return fail(InvalidArgument("cannot write '" + args.out + "': " + std::strerror(errno)));
  }
  TraceEventWriter w(out);
  for (const auto& side : sides) {
    const std::string label =
        side->role.empty() ? side->reader.run() : side->reader.run() + " · " + side->role;
    w.Event(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", side->pid}, {"args", {{"name", label}}}});
    w.Event({{"ph", "M"},
             {"name", "process_sort_index"},
             {"pid", side->pid},
             {"args", {{"sort_index", side->pid}}}});
    for (const auto& [rank, lanes] : side->lanes) {
      for (const auto& l : lanes) {
        const int64_t tid = Tid(rank, l.lane);
        w.Event(
            {{"ph", "M"},
             {"name", "thread_name"},
             {"pid", side->pid},
             {"tid", tid},
             {"args",
              {{"name", "rank " + std::to_string(rank) + " · lane " + std::to_string(l.lane)}}}});
        w.Event({{"ph", "M"},
                 {"name", "thread_sort_index"},
                 {"pid", side->pid},
                 {"tid", tid},
                 {"args", {{"sort_index", tid}}}});
      }
    }
  }

  uint64_t flow_id = 0, flows = 0;
  for (uint32_t rank : ranks) {
    std::set<uint32_t> lanes;
    for (const auto& side : sides) {
      for (const auto& l : side->lanes[rank]) lanes.insert(l.lane);
    }
    for (uint32_t lane : lanes) {
      std::vector<std::vector<aligner::OpDetail>> ops(sides.size());
      std::vector<std::vector<Span>> spans(sides.size());
      for (size_t s = 0; s < sides.size(); ++s) {
        Side& side = *sides[s];
        const auto& have = side.lanes[rank];
        if (std::none_of(have.begin(), have.end(), [&](const auto& l) { return l.lane == lane; }))
          continue;
        auto read = side.reader.ReadLane(rank, lane, [&](size_t n) {
          progress.Set("reading " + side.reader.run() + " rank " + std::to_string(rank) + " lane " +
                       std::to_string(lane) + " · " + std::to_string(n) + " ops");
        });
        if (!read.ok()) return fail(read.status());
        ops[s] = std::move(*read);
        spans[s] = Layout(ops[s], wall, side.origin_ns);
      }
      // With --vs: the pairs (reference position -> suspect position).
      std::vector<int64_t> partner[2];
      std::vector<aligner::Pair> pairs;
      if (vs) {
        std::vector<aligner::OpEvent> events[2];
        for (size_t s = 0; s < 2; ++s) {
          for (const auto& d : ops[s])
            events[s].push_back(aligner::MakeOpEvent(d, sides[s]->reader.Boundary(d.site)));
          partner[s].assign(ops[s].size(), -1);
        }
        pairs = aligner::AlignLane(events[0], events[1]).pairs;
        for (const auto& p : pairs) {
          partner[0][p.ref] = static_cast<int64_t>(ops[1][p.sus].op_index);
          partner[1][p.sus] = static_cast<int64_t>(ops[0][p.ref].op_index);
        }
      }
      const int64_t tid = Tid(rank, lane);
      for (size_t s = 0; s < sides.size(); ++s) {
        const Side& side = *sides[s];
        for (size_t i = 0; i < ops[s].size(); ++i) {
          const auto& op = ops[s][i];
          json a = OpArgs(op, side.reader);
          if (vs) {
            if (partner[s][i] >= 0) {
              a["aligned_with"] = partner[s][i];
            } else {
              a["unaligned"] = true;
            }
          }
          w.Event({{"ph", "X"},
                   {"name", side.reader.String(op.name)},
                   {"cat", op.backward ? "op,backward" : "op"},
                   {"pid", side.pid},
                   {"tid", tid},
                   {"ts", spans[s][i].ts},
                   {"dur", spans[s][i].dur},
                   {"args", std::move(a)}});
        }
        sides[s]->ops += ops[s].size();
      }
      for (const auto& p : pairs) {
        // Trusted ops (recorded without fingerprints) are not compared.
        const bool same = ops[0][p.ref].trusted || ops[1][p.sus].trusted ||
                          aligner::OutputDigest(ops[0][p.ref].outputs) ==
                              aligner::OutputDigest(ops[1][p.sus].outputs);
        const char* name = same ? "aligned" : "aligned, outputs differ";
        ++flow_id;
        // From the reference op to the suspect op; "f" binds to the op it lands in.
        for (size_t s = 0; s < 2; ++s) {
          json e = {{"ph", s == 0 ? "s" : "f"},
                    {"id", flow_id},
                    {"name", name},
                    {"cat", "alignment"},
                    {"pid", sides[s]->pid},
                    {"tid", tid},
                    {"ts", spans[s][s == 0 ? p.ref : p.sus].Anchor()}};
          if (s == 1) e["bp"] = "e";
          w.Event(e);
        }
        ++flows;
      }
      if (pivot != nullptr && pivot->rank == rank && pivot->lane == lane) {
        const uint64_t at[2] = {pivot->reference.op_index, pivot->suspect.op_index};
        for (size_t s = 0; s < 2; ++s) {
          auto it = std::lower_bound(
              ops[s].begin(), ops[s].end(), at[s],
              [](const aligner::OpDetail& d, uint64_t i) { return d.op_index < i; });
          if (it == ops[s].end() || it->op_index != at[s]) continue;
          const Span& span = spans[s][static_cast<size_t>(it - ops[s].begin())];
          w.Event({{"ph", "i"},
                   {"s", "p"},
                   {"name", "first divergence · " + pivot->op},
                   {"cat", "pivot"},
                   {"pid", sides[s]->pid},
                   {"tid", tid},
                   {"ts", span.ts},
                   {"args",
                    {{"rank", rank},
                     {"lane", lane},
                     {"step", pivot->step},
                     {"op", pivot->op},
                     {"op_index", at[s]},
                     {"inputs_equal", pivot->inputs_equal}}}});
        }
      }
    }
  }
  json other = {{"exporter", "opguard export"},
                {"daemon", args.endpoint},
                {"time", wall ? "wall" : "op_index"},
                {"runs", json::array()}};
  for (const auto& side : sides) {
    other["runs"].push_back({{"run", side->reader.run()},
                             {"role", side->role},
                             {"pid", side->pid},
                             {"ops", side->ops}});
  }
  if (report) {
    other["status"] = aligner::DiffStatusName(report->status);
    other["flows"] = flows;
  }
  w.Finish(other);
  const bool failed = std::ferror(out) != 0;
  if (out != stdout ? std::fclose(out) != 0 || failed : std::fflush(out) != 0 || failed) {
    return fail(Internal("writing '" + args.out + "' failed"));
  }
  progress.Stop();
  if (out != stdout) {
    std::fprintf(stderr, "opguard export: wrote %s (%llu ops%s; open it in ui.perfetto.dev)\n",
                 args.out.c_str(),
                 static_cast<unsigned long long>(sides.back()->ops + (vs ? sides[0]->ops : 0)),
                 vs ? (", " + std::to_string(flows) + " aligned pairs").c_str() : "");
  }
  return kExitOk;
}

std::function<int()> Add(CLI::App& cmd, const DaemonArgs& top) {
  auto args = std::make_shared<Args>();
  args->timeout_s = 300;
  AddDaemonOptions(cmd, *args, top, /*json=*/false);
  cmd.add_option_function<std::string>(
         "RUN", [args](const std::string& run) { args->positional.push_back(run); },
         "the run to export (the suspect, with --vs)")
      ->required();
  cmd.add_option("--vs", args->vs, "a reference run: aligned ops linked by flows, the pivot marked")
      ->option_text("REF");
  cmd.add_option("--perfetto", args->out, "the trace-event JSON file to write (- for stdout)")
      ->option_text("FILE")
      ->required();
  cmd.add_option("--rank", args->rank, "export one rank only (default: every rank)")
      ->option_text("R")
      ->check(CLI::Range(int64_t{0}, int64_t{UINT32_MAX}));
  cmd.add_option("--time", args->time,
                 "time axis: wall (recorded start and duration), index (op i at i us), auto: wall\n"
                 "when every lane's ops carry durations, else index")
      ->option_text("auto|wall|index")
      ->check(CLI::IsMember({"auto", "wall", "index"}));
  cmd.footer("Exit codes: 0 written; 2 an error (usage, the daemon unreachable, an unknown run).");
  return [args] {
    StartUserDaemonIfChosen(*args);
    return ExportMain(*args);
  };
}

}  // namespace

OPGUARD_CLI_COMMAND(export_trace, "export",
                    "write a run (and a reference run) as Perfetto / Chrome trace-event JSON",
                    &Add);

}  // namespace opguard::cli
