// opguard-loadgen: drives the real shim C API (libopguard_shim.so) from N
// simulated ranks, each a forked process with its own RANK/LOCAL_RANK/
// WORLD_SIZE, recording a synthetic training trace (synthetic_trace.h).
// The parent never calls the shim; it collects each rank's report over a
// pipe and prints what was sent. Flags: docs/shim.md.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "opguard/shim.h"
#include "synthetic_trace.h"

namespace {

using opguard::loadgen::SyntheticTrace;
using opguard::loadgen::TraceOptions;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string run;
  std::string endpoint;  // empty: the shim's default / OPGUARD_ENDPOINT
  double rate = 0;       // ops per second per rank; 0 = as fast as possible
  bool json = false;
  uint32_t flush_timeout_ms = 30000;
  // This invocation records ranks first_rank .. first_rank + local_ranks - 1
  // of a world_size-rank run (one loadgen per node in a multi-daemon test).
  uint32_t first_rank = 0;
  uint32_t local_ranks = 0;
  std::optional<uint32_t> world_size;
  // --hang RANK:M: RANK stops before collective M; every other rank enters M
  // and stops there (a hung job as Flight Recorder would see it).
  std::optional<uint32_t> hang_rank;
  uint64_t hang_collective = 0;
  // --desync RANK:M: RANK's collective M has a different element count.
  std::optional<uint32_t> desync_rank;
  uint64_t desync_collective = 0;
  TraceOptions trace;
};

const char* kUsage =
    "usage: opguard-loadgen --run NAME --ranks N --ops N [--rate R] [--seed S] [--endpoint E]\n"
    "         [--diverge-at RANK:OP] [--insert N] [--reorder N] [--drop-batches N]\n"
    "         [--drop-size N] [--collective-every K] [--flush-timeout-ms T] [--json]\n"
    "         [--first-rank R --world-size W] [--hang RANK:M] [--desync RANK:M]\n"
    "Records a synthetic training trace through libopguard_shim.so from N forked ranks\n"
    "and prints what each rank sent. See docs/shim.md.\n";

bool ParseU64(const char* s, uint64_t* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || s[0] == '-') return false;
  *out = v;
  return true;
}

bool ParseRankColon(const char* s, uint64_t* rank, uint64_t* n) {
  std::string spec = s != nullptr ? s : "";
  auto colon = spec.find(':');
  return colon != std::string::npos && ParseU64(spec.substr(0, colon).c_str(), rank) &&
         ParseU64(spec.substr(colon + 1).c_str(), n);
}

bool ParseArgs(int argc, char** argv, Options* o, std::string* error) {
  bool have_run = false, have_ranks = false, have_ops = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    uint64_t v = 0;
    auto number = [&](uint64_t lo, uint64_t hi) {
      const char* s = value();
      if (!ParseU64(s, &v) || v < lo || v > hi) {
        *error = a + " needs an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
        return false;
      }
      return true;
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--run") {
      const char* s = value();
      if (s == nullptr || *s == '\0') return *error = "--run needs a name", false;
      o->run = s;
      have_run = true;
    } else if (a == "--endpoint") {
      const char* s = value();
      if (s == nullptr) return *error = "--endpoint needs an endpoint", false;
      o->endpoint = s;
    } else if (a == "--ranks") {
      if (!number(1, 1024)) return false;
      o->trace.ranks = static_cast<uint32_t>(v);
      have_ranks = true;
    } else if (a == "--ops") {
      if (!number(1, uint64_t{1} << 32)) return false;
      o->trace.ops = v;
      have_ops = true;
    } else if (a == "--rate") {
      if (!number(0, 100000000)) return false;
      o->rate = static_cast<double>(v);
    } else if (a == "--seed") {
      if (!number(0, UINT64_MAX)) return false;
      o->trace.seed = v;
    } else if (a == "--insert") {
      if (!number(0, 1000000)) return false;
      o->trace.inserts = static_cast<uint32_t>(v);
    } else if (a == "--reorder") {
      if (!number(0, 1000000)) return false;
      o->trace.reorders = static_cast<uint32_t>(v);
    } else if (a == "--drop-batches") {
      if (!number(0, 1000000)) return false;
      o->trace.drop_batches = static_cast<uint32_t>(v);
    } else if (a == "--drop-size") {
      if (!number(1, 1000000)) return false;
      o->trace.drop_size = static_cast<uint32_t>(v);
    } else if (a == "--collective-every") {
      if (!number(0, uint64_t{1} << 32)) return false;
      o->trace.collective_every = v;
    } else if (a == "--flush-timeout-ms") {
      if (!number(0, 600000)) return false;
      o->flush_timeout_ms = static_cast<uint32_t>(v);
    } else if (a == "--diverge-at") {
      const char* s = value();
      std::string spec = s != nullptr ? s : "";
      auto colon = spec.find(':');
      uint64_t r = 0, op = 0;
      if (colon == std::string::npos || !ParseU64(spec.substr(0, colon).c_str(), &r) ||
          !ParseU64(spec.substr(colon + 1).c_str(), &op)) {
        return *error = "--diverge-at needs RANK:OP", false;
      }
      o->trace.diverge_rank = static_cast<uint32_t>(r);
      o->trace.diverge_op = op;
    } else if (a == "--first-rank") {
      if (!number(0, 1u << 20)) return false;
      o->first_rank = static_cast<uint32_t>(v);
    } else if (a == "--world-size") {
      if (!number(1, 1u << 20)) return false;
      o->world_size = static_cast<uint32_t>(v);
    } else if (a == "--hang" || a == "--desync") {
      uint64_t r = 0, m = 0;
      if (!ParseRankColon(value(), &r, &m) || r > UINT32_MAX) return *error = a + " needs RANK:COLLECTIVE", false;
      if (a == "--hang") {
        o->hang_rank = static_cast<uint32_t>(r);
        o->hang_collective = m;
      } else {
        o->desync_rank = static_cast<uint32_t>(r);
        o->desync_collective = m;
      }
    } else if (a == "--json") {
      o->json = true;
    } else {
      *error = "unknown argument " + a;
      return false;
    }
  }
  if (!have_run || !have_ranks || !have_ops) return *error = "--run, --ranks and --ops are required", false;
  // The trace is a function of the whole world (a divergence reaches every
  // rank through the all-reduces); this invocation records a slice of it.
  o->local_ranks = o->trace.ranks;
  o->trace.ranks = o->world_size.value_or(o->first_rank + o->local_ranks);
  if (o->first_rank + o->local_ranks > o->trace.ranks) {
    return *error = "--first-rank + --ranks exceeds --world-size", false;
  }
  if (o->trace.diverge_rank && *o->trace.diverge_rank >= o->trace.ranks) {
    return *error = "--diverge-at: rank is not below the world size", false;
  }
  if ((o->hang_rank || o->desync_rank) && o->trace.collective_every == 0) {
    return *error = "--hang and --desync need --collective-every", false;
  }
  return true;
}

// A plausible source file whose line numbers match the template's sites, so
// the viewer has code to show.
std::string SourceText(const SyntheticTrace& trace, const std::string& file) {
  std::vector<std::string> lines(160, "");
  for (const auto& t : trace.step_template()) {
    if (t.file != file || t.line == 0 || t.line > lines.size()) continue;
    lines[t.line - 1] = "    x = " + t.name.substr(t.name.find("::") + 2) + "(x)  # " + t.function;
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

json RankMain(const Options& o, const SyntheticTrace& trace, uint32_t rank) {
  const auto& tmpl = trace.step_template();
  opguard_init();
  json report = {{"rank", rank}};
  if (!opguard_enabled()) {
    report["error"] = "the shim did not enable itself (see its warning above)";
    return report;
  }
  opguard_set_run_info(OPGUARD_INFO_FRAMEWORK, nullptr, "loadgen");
  opguard_set_run_info(OPGUARD_INFO_VERSION, "opguard-loadgen", "1");
  std::string seed_text = std::to_string(o.trace.seed);
  opguard_set_run_info(OPGUARD_INFO_ENVIRONMENT, "LOADGEN_SEED", seed_text.c_str());
  std::vector<uint64_t> name_id(tmpl.size()), site_id(tmpl.size());
  // What the second input of each template op is, decided once here rather
  // than by comparing names on every op (the harness's cost counts in the
  // loadgen CPU figures, next to the shim's).
  enum class Extra : uint8_t { kNone, kWeight, kAlpha, kDim };
  std::vector<Extra> extra(tmpl.size(), Extra::kNone);
  for (size_t i = 0; i < tmpl.size(); ++i) {
    name_id[i] = opguard_intern(tmpl[i].name.data(), tmpl[i].name.size());
    site_id[i] = opguard_site(tmpl[i].file.c_str(), tmpl[i].line, tmpl[i].function.c_str());
    if (tmpl[i].name == "aten::linear") extra[i] = Extra::kWeight;
    if (tmpl[i].name == "aten::add") extra[i] = Extra::kAlpha;
    if (tmpl[i].name == "aten::softmax") extra[i] = Extra::kDim;
  }
  for (const char* file : {"model.py", "train.py"}) {
    std::string text = SourceText(trace, file);
    opguard_source_file(file, text.data(), text.size());
  }
  const std::string insert_name = "aten::clone";
  uint64_t insert_name_id = opguard_intern(insert_name.data(), insert_name.size());
  uint64_t insert_site = opguard_site("train.py", 150, "log_metrics");
  std::vector<uint32_t> members(o.trace.ranks);
  for (uint32_t i = 0; i < o.trace.ranks; ++i) members[i] = i;
  opguard_communicator comm = {};
  comm.struct_size = sizeof(comm);
  comm.size = o.trace.ranks;
  comm.name = "world";
  comm.ranks = members.data();
  uint64_t comm_id = o.trace.collective_every != 0 ? opguard_communicator_define(&comm) : 0;
  uint64_t allreduce_site = opguard_site("train.py", 125, "train_step");

  const auto& plan = trace.plan(rank);
  const auto& drops = trace.dropped_at(rank);
  size_t next_drop = 0;
  uint64_t ops_recorded = 0, collectives = 0, errors = 0;
  json gaps = json::array();
  uint64_t last_step = UINT64_MAX;
  auto start = Clock::now();
  int64_t hidden_shape[1] = {static_cast<int64_t>(tmpl.back().shape.empty() ? 1 : tmpl.back().shape[0])};
  for (uint64_t pos = 0; pos < plan.size(); ++pos) {
    if (o.rate > 0 && pos % 64 == 0) {
      auto due = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(pos / o.rate));
      std::this_thread::sleep_until(due);
    }
    const auto& e = plan[pos];
    if (e.base >= 0 && trace.step_of(e.base) != last_step) {
      last_step = trace.step_of(e.base);
      opguard_mark_step(0, last_step);
    }
    bool dropped = next_drop < drops.size() && pos >= drops[next_drop] &&
                   pos < drops[next_drop] + o.trace.drop_size;
    if (dropped && pos == drops[next_drop]) {
      uint64_t first = 0;
      if (opguard_report_gap(0, o.trace.drop_size, "loadgen --drop-batches", &first) != OPGUARD_OK) ++errors;
      gaps.push_back({{"lane", 0}, {"first_op", first}, {"last_op", first + o.trace.drop_size - 1}});
    }
    if (!dropped) {
      opguard_value in[3] = {};
      opguard_tensor out = {};
      opguard_op op = {};
      op.struct_size = sizeof(op);
      op.op_index = OPGUARD_AUTO;
      op.outputs = &out;
      op.num_outputs = 1;
      op.inputs = in;
      if (e.base < 0) {
        static const int64_t shape[1] = {16};
        out.fp_lo = std::hash<uint64_t>()(o.trace.seed ^ (uint64_t{rank} << 40) ^ e.inserted) | 1;
        out.fp_hi = out.fp_lo * 31;
        out.shape = shape;
        out.ndim = 1;
        out.dtype = OPGUARD_DTYPE_FLOAT32;
        in[0].kind = OPGUARD_VALUE_TENSOR;
        in[0].tensor = out;
        op.num_inputs = 1;
        op.name = insert_name_id;
        op.site = insert_site;
      } else {
        size_t t = static_cast<size_t>(e.base) % tmpl.size();
        const auto& ot = tmpl[t];
        uint64_t step_base = trace.step_of(e.base) * tmpl.size();
        uint64_t fp = trace.OutputFp(rank, e.base);
        out.fp_lo = fp;
        out.fp_hi = fp * 0x9E3779B97F4A7C15ull;
        out.shape = ot.shape.data();
        out.ndim = static_cast<uint32_t>(ot.shape.size());
        out.dtype = OPGUARD_DTYPE_BFLOAT16;
        out.has_stats = 1;
        out.stats.min = -static_cast<double>(fp % 97) / 10;
        out.stats.max = static_cast<double>(fp % 89) / 10;
        out.stats.sum = static_cast<double>(fp % 1000) - 500;
        out.stats.l2 = static_cast<double>(fp % 5000) / 7;
        in[0].kind = OPGUARD_VALUE_TENSOR;
        in[0].tensor = out;
        in[0].tensor.fp_lo = trace.InputFp(rank, e.base);
        in[0].tensor.fp_hi = in[0].tensor.fp_lo * 0x9E3779B97F4A7C15ull;
        in[0].tensor.has_stats = 0;
        op.num_inputs = 1;
        if (extra[t] == Extra::kWeight) {  // a weight: identical on every rank
          in[1].kind = OPGUARD_VALUE_TENSOR;
          in[1].tensor.fp_lo = std::hash<uint64_t>()(o.trace.seed * 1000003 + t * 7 + trace.step_of(e.base)) | 1;
          in[1].tensor.shape = hidden_shape;
          in[1].tensor.ndim = 1;
          in[1].tensor.dtype = OPGUARD_DTYPE_BFLOAT16;
          op.num_inputs = 2;
        } else if (extra[t] != Extra::kNone) {
          const bool alpha = extra[t] == Extra::kAlpha;
          in[1].kind = OPGUARD_VALUE_SCALAR;
          in[1].scalar_dtype = alpha ? OPGUARD_DTYPE_FLOAT32 : OPGUARD_DTYPE_INT64;
          in[1].scalar_bits = alpha ? 0x3F800000u : uint64_t(-1);  // alpha=1.0, dim=-1
          op.num_inputs = 2;
        }
        int fwd = ot.backward ? ot.forward_of : static_cast<int>(t);
        op.name = name_id[t];
        op.site = site_id[fwd];  // backward ops carry their forward op's site
        op.seq_nr = static_cast<int64_t>(step_base) + fwd;
        op.flags = static_cast<uint32_t>(OPGUARD_OP_HAS_SEQ_NR) |
                   (ot.backward ? static_cast<uint32_t>(OPGUARD_OP_BACKWARD) : 0u);
      }
      int rc = opguard_record_op(&op, nullptr);
      if (rc == OPGUARD_OK) {
        ++ops_recorded;
      } else {
        ++errors;
      }
    }
    if (dropped && pos + 1 == drops[next_drop] + o.trace.drop_size) ++next_drop;
    if (e.base >= 0 && trace.collective_after(e.base)) {
      uint64_t m = (static_cast<uint64_t>(e.base) + 1) / o.trace.collective_every - 1;
      const bool hang_here = o.hang_rank && m == o.hang_collective;
      if (hang_here && rank == *o.hang_rank) {
        report["hung_before_collective"] = m;
        break;
      }
      int64_t cshape[1] = {1 << 20};
      if (o.desync_rank && rank == *o.desync_rank && m == o.desync_collective) cshape[0] += 1;
      opguard_tensor cin = {}, cout = {};
      cin.fp_lo = trace.CollectiveInputFp(rank, m);
      cin.shape = cshape;
      cin.ndim = 1;
      cin.dtype = OPGUARD_DTYPE_FLOAT32;
      cout = cin;
      cout.fp_lo = trace.CollectiveOutputFp(m);
      opguard_collective c = {};
      c.struct_size = sizeof(c);
      c.phase = OPGUARD_PHASE_ENTERED;
      c.kind = OPGUARD_COLL_ALL_REDUCE;
      c.dtype = OPGUARD_DTYPE_FLOAT32;
      c.communicator = comm_id;
      c.seq = OPGUARD_AUTO;
      c.count = cshape[0];
      c.root = -1;
      c.op_index = OPGUARD_AUTO;
      c.step = OPGUARD_AUTO;
      c.site = allreduce_site;
      c.num_inputs = 1;
      c.inputs = &cin;
      uint64_t seq = 0;
      errors += opguard_record_collective(&c, &seq) != OPGUARD_OK;
      if (hang_here) {
        report["hung_in_collective"] = m;
        break;
      }
      c.phase = OPGUARD_PHASE_COMPLETED;
      c.seq = seq;
      c.num_outputs = 1;
      c.outputs = &cout;
      errors += opguard_record_collective(&c, nullptr) != OPGUARD_OK;
      ++collectives;
    }
  }
  double record_s = std::chrono::duration<double>(Clock::now() - start).count();
  int flush_rc = opguard_flush(o.flush_timeout_ms);
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  opguard_get_counters(&c);
  int shutdown_rc = opguard_shutdown(o.flush_timeout_ms);
  double total_s = std::chrono::duration<double>(Clock::now() - start).count();

  json inserts = json::array(), reorders = json::array();
  for (uint64_t p : trace.inserted_at(rank)) inserts.push_back(p);
  for (uint64_t p : trace.swapped_at(rank)) reorders.push_back(p);
  report["ops"] = ops_recorded;
  report["op_indices"] = plan.size();
  report["collectives"] = collectives;
  report["collective_records"] = collectives * 2;
  report["gaps"] = gaps;
  report["inserted_at"] = inserts;
  report["reordered_at"] = reorders;
  if (o.trace.diverge_rank) {
    // The first op index on this rank whose output differs from the clean trace.
    json d = nullptr;
    for (uint64_t p = 0; p < plan.size(); ++p) {
      if (plan[p].base >= 0 && trace.Tainted(rank, plan[p].base)) {
        d = {{"op", p}, {"step", trace.step_of(plan[p].base)},
             {"via_collective", rank != *o.trace.diverge_rank}};
        break;
      }
    }
    report["divergence"] = d;
  }
  report["errors"] = errors;
  report["records_enqueued"] = c.records_enqueued;
  report["records_acked"] = c.records_acked;
  report["records_dropped"] = c.records_dropped;
  report["records_rejected"] = c.records_rejected;
  report["batches_sent"] = c.batches_sent;
  report["batches_resent"] = c.batches_resent;
  report["bytes_sent"] = c.bytes_sent;
  report["record_seconds"] = record_s;
  report["seconds"] = total_s;
  report["flushed"] = flush_rc == OPGUARD_OK && shutdown_rc == OPGUARD_OK;
  return report;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string error;
  if (!ParseArgs(argc, argv, &o, &error)) {
    std::fprintf(stderr, "opguard-loadgen: %s\n%s", error.c_str(), kUsage);
    return 2;
  }
  SyntheticTrace trace(o.trace);
  struct Child {
    pid_t pid;
    int fd;
  };
  std::vector<Child> children;
  auto start = Clock::now();
  for (uint32_t r = o.first_rank; r < o.first_rank + o.local_ranks; ++r) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("opguard-loadgen: pipe");
      return 2;
    }
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("opguard-loadgen: fork");
      return 2;
    }
    if (pid == 0) {
      // Each rank is its own process with the environment a launcher would
      // give it; the shim reads it on the first call.
      close(fds[0]);
      setenv("OPGUARD", "1", 1);
      setenv("OPGUARD_RUN", o.run.c_str(), 1);
      if (!o.endpoint.empty()) setenv("OPGUARD_ENDPOINT", o.endpoint.c_str(), 1);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r - o.first_rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(o.trace.ranks).c_str(), 1);
      std::string out = RankMain(o, trace, r).dump() + "\n";
      ssize_t unused = write(fds[1], out.data(), out.size());
      (void)unused;
      close(fds[1]);
      _exit(0);  // the shim was shut down explicitly above
    }
    close(fds[1]);
    children.push_back({pid, fds[0]});
  }
  json ranks = json::array();
  bool ok = true;
  for (auto& c : children) {
    std::string text;
    char buf[65536];
    ssize_t n;
    while ((n = read(c.fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
    close(c.fd);
    int status = 0;
    waitpid(c.pid, &status, 0);
    json report = json::parse(text, nullptr, false);
    if (report.is_discarded() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      report = {{"error", "rank process failed"}};
      ok = false;
    }
    if (report.contains("error")) ok = false;
    ranks.push_back(report);
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t records = 0, acked = 0, dropped = 0;
  for (const auto& r : ranks) {
    records += r.value("records_enqueued", uint64_t{0});
    acked += r.value("records_acked", uint64_t{0});
    dropped += r.value("records_dropped", uint64_t{0});
    ok = ok && r.value("flushed", false) && r.value("errors", uint64_t{1}) == 0;
  }
  ok = ok && acked == records;
  if (o.json) {
    json doc = {{"run", o.run},
                {"ranks", o.local_ranks},
                {"first_rank", o.first_rank},
                {"world_size", o.trace.ranks},
                {"ops", o.trace.ops},
                {"seed", o.trace.seed},
                {"collective_every", o.trace.collective_every},
                {"records", records},
                {"records_acked", acked},
                {"records_dropped", dropped},
                {"seconds", seconds},
                {"records_per_second", seconds > 0 ? records / seconds : 0.0},
                {"all_acknowledged", ok},
                {"per_rank", ranks}};
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::printf("opguard-loadgen: run %s, %u rank(s) x %llu ops, seed %llu%s\n", o.run.c_str(),
                o.local_ranks, static_cast<unsigned long long>(o.trace.ops),
                static_cast<unsigned long long>(o.trace.seed),
                o.endpoint.empty() ? "" : (", endpoint " + o.endpoint).c_str());
    for (const auto& r : ranks) {
      if (r.contains("error")) {
        std::printf("rank %s: ERROR %s\n", r.contains("rank") ? r["rank"].dump().c_str() : "?",
                    r["error"].get<std::string>().c_str());
        continue;
      }
      std::string gaps;
      for (const auto& g : r["gaps"]) gaps += " " + g["first_op"].dump() + ".." + g["last_op"].dump();
      std::printf("rank %s: ops %s, collectives %s, gaps %zu%s%s\n", r["rank"].dump().c_str(),
                  r["ops"].dump().c_str(), r["collectives"].dump().c_str(), r["gaps"].size(),
                  gaps.empty() ? "" : " (ops", gaps.empty() ? "" : (gaps + ")").c_str());
      if (!r["inserted_at"].empty()) std::printf("  inserted at ops %s\n", r["inserted_at"].dump().c_str());
      if (!r["reordered_at"].empty()) std::printf("  reordered at ops %s\n", r["reordered_at"].dump().c_str());
      if (r.contains("divergence")) {
        const auto& d = r["divergence"];
        if (d.is_null()) {
          std::printf("  no divergence\n");
        } else {
          std::printf("  diverges at op %s (step %s)%s\n", d["op"].dump().c_str(), d["step"].dump().c_str(),
                      d["via_collective"].get<bool>() ? " through an all-reduce" : " (injected here)");
        }
      }
      std::printf("  acked %s/%s records, dropped %s, %.3f s\n", r["records_acked"].dump().c_str(),
                  r["records_enqueued"].dump().c_str(), r["records_dropped"].dump().c_str(),
                  r["seconds"].get<double>());
    }
    std::printf("total: %llu records in %.3f s (%.0f records/s); all acknowledged: %s\n",
                static_cast<unsigned long long>(records), seconds, seconds > 0 ? records / seconds : 0.0,
                ok ? "yes" : "no");
  }
  return ok ? 0 : 1;
}
