#include "config.h"

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace opguard::shim {
namespace {

constexpr const char* kDisabledSuffix = "; OpGuard is disabled in this process, training continues";

Status Bad(const char* var, const std::string& value, const std::string& expected) {
  return InvalidArgument(std::string(var) + "='" + value + "' is invalid: expected " + expected +
                         kDisabledSuffix);
}

// Strict decimal: digits only, no sign, no spaces, within [lo, hi].
bool ParseUint(const std::string& text, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) return false;
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

template <typename T>
Status ReadUint(const EnvLookup& env, const char* var, uint64_t lo, uint64_t hi, T* out) {
  auto value = env(var);
  if (!value) return Status::Ok();
  uint64_t v = 0;
  if (!ParseUint(*value, lo, hi, &v)) {
    return Bad(var, *value, "an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  *out = static_cast<T>(v);
  return Status::Ok();
}

bool ValidRunName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

bool ValidEndpoint(const std::string& e) {
  for (const char* scheme : {"ipc://", "tcp://", "inproc://"}) {
    std::string s(scheme);
    if (e.size() > s.size() && e.compare(0, s.size(), s) == 0) {
      for (char c : e) {
        if (std::isspace(static_cast<unsigned char>(c))) return false;
      }
      return true;
    }
  }
  return false;
}

struct RankFamily {
  const char* name;
  const char* rank;
  const char* local_rank;
  const char* size;
};

constexpr RankFamily kFamilies[] = {
    {"torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"},
};

constexpr uint64_t kMaxRanks = 1u << 24;

Status ReadRank(const EnvLookup& env, Config* c) {
  for (const auto& f : kFamilies) {
    auto rank = env(f.rank);
    if (!rank) continue;
    uint64_t r = 0, l = 0, s = 0;
    if (!ParseUint(*rank, 0, kMaxRanks - 1, &r)) return Bad(f.rank, *rank, "a rank number");
    auto size = env(f.size);
    if (!size) {
      return InvalidArgument(std::string(f.rank) + " is set but " + f.size + " is not" +
                             kDisabledSuffix);
    }
    if (!ParseUint(*size, 1, kMaxRanks, &s)) return Bad(f.size, *size, "a world size >= 1");
    if (r >= s) {
      return InvalidArgument(std::string(f.rank) + "=" + *rank + " is not below " + f.size + "=" +
                             *size + kDisabledSuffix);
    }
    l = r;
    if (auto local = env(f.local_rank)) {
      if (!ParseUint(*local, 0, s - 1, &l)) {
        return Bad(f.local_rank, *local, "a local rank below " + std::string(f.size) + "=" + *size);
      }
    }
    c->rank = static_cast<uint32_t>(r);
    c->local_rank = static_cast<uint32_t>(l);
    c->world_size = static_cast<uint32_t>(s);
    c->rank_source = f.name;
    return Status::Ok();
  }
  return Status::Ok();
}

std::string Sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  }
  return out;
}

// Field 22 of /proc/<pid>/stat: start time in clock ticks since boot.
std::string ProcessStartTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return "0";
  auto close = line.rfind(')');
  if (close == std::string::npos) return "0";
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  // Fields after "(comm)" start at field 3; field 22 is the 20th of these.
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  return field.empty() ? "0" : field;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::string GenerateRunName(const EnvLookup& env, uint32_t world_size) {
  if (auto job = env("SLURM_JOB_ID"); job && !job->empty()) {
    std::string name = "slurm-" + Sanitize(*job);
    if (auto step = env("SLURM_STEP_ID"); step && !step->empty()) name += "." + Sanitize(*step);
    return name.substr(0, 128);
  }
  if (auto id = env("TORCHELASTIC_RUN_ID"); id && !id->empty() && *id != "none") {
    return ("torchrun-" + Sanitize(*id)).substr(0, 128);
  }
  if (auto id = env("OMPI_MCA_ess_base_jobid"); id && !id->empty()) {
    return ("ompi-" + Sanitize(*id)).substr(0, 128);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "host");
  pid_t launcher = world_size > 1 ? ::getppid() : ::getpid();
  return (Sanitize(host) + "-" + std::to_string(launcher) + "-" + ProcessStartTicks(launcher))
      .substr(0, 128);
}

Result<Config> ParseConfig(const EnvLookup& env, LogLevel* log_level_out) {
  Config c;
  // Disabled means nothing else is read: a bad tuning variable must not even
  // print a warning in a job that does not use OpGuard.
  auto enabled = env("OPGUARD");
  if (!enabled || *enabled == "0" || enabled->empty()) return c;
  if (auto level = env("OPGUARD_LOG_LEVEL")) {
    if (!ParseLogLevel(*level, &c.log_level)) {
      return Bad("OPGUARD_LOG_LEVEL", *level, "debug, info, warn, error or off");
    }
  }
  if (log_level_out != nullptr) *log_level_out = c.log_level;
  if (*enabled != "1") return Bad("OPGUARD", *enabled, "1 (enable) or 0 (disable)");

  OPGUARD_RETURN_IF_ERROR(ReadRank(env, &c));
  if (auto run = env("OPGUARD_RUN")) {
    if (!ValidRunName(*run)) {
      return Bad("OPGUARD_RUN", *run, "1..128 characters from [A-Za-z0-9._-]");
    }
    c.run = *run;
  } else {
    c.run = GenerateRunName(env, c.world_size);
    c.run_generated = true;
  }
  if (auto endpoint = env("OPGUARD_ENDPOINT")) {
    if (!ValidEndpoint(*endpoint)) {
      return Bad("OPGUARD_ENDPOINT", *endpoint, "an ipc://, tcp:// or inproc:// ZeroMQ endpoint");
    }
    c.endpoint = *endpoint;
  }
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_BATCH_RECORDS", 1, 1000000, &c.batch_records));
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_BATCH_INTERVAL_MS", 1, 60000, &c.batch_interval_ms));
  uint64_t buffer_mb = c.buffer_bytes >> 20;
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_BUFFER_MB", 1, 65536, &buffer_mb));
  c.buffer_bytes = buffer_mb << 20;
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_MAX_PENDING_FP", 1, 1000000, &c.max_pending_fp));
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_ACK_TIMEOUT_MS", 10, 600000, &c.ack_timeout_ms));
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_MAX_IN_FLIGHT", 1, 1000, &c.max_in_flight));
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_FLUSH_TIMEOUT_MS", 0, 600000, &c.flush_timeout_ms));
  uint64_t source_kb = c.max_source_bytes >> 10;
  OPGUARD_RETURN_IF_ERROR(ReadUint(env, "OPGUARD_MAX_SOURCE_KB", 0, 65536, &source_kb));
  c.max_source_bytes = static_cast<uint32_t>(source_kb << 10);
  if (auto kernels = env("OPGUARD_KERNELS")) {
    if (*kernels != "0" && *kernels != "1") return Bad("OPGUARD_KERNELS", *kernels, "0 or 1");
    c.kernels = *kernels == "1";
  }
  if (auto lib = env("OPGUARD_CUPTI_LIBRARY")) c.cupti_library = *lib;
  c.enabled = true;
  return c;
}

}  // namespace opguard::shim
