#include "opguard/daemon/config.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace opguard::daemon {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Keys compare with '-', '.' and '_' treated alike, so `--retention-max-bytes`
// on the command line and `retention.max_bytes` in the file are one key.
std::string Normalize(const std::string& key) {
  std::string out = key;
  for (char& c : out) {
    if (c == '-' || c == '.') c = '_';
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

Result<uint64_t> ParseUint(const std::string& key, const std::string& value, int base = 10) {
  if (value.empty()) return InvalidArgument(key + ": empty value");
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(value.c_str(), &end, base);
  if (errno != 0 || end == value.c_str() || *end != '\0' || value[0] == '-') {
    return InvalidArgument(key + ": '" + value + "' is not a non-negative integer");
  }
  return static_cast<uint64_t>(v);
}

std::vector<std::string> SplitComma(const std::string& value) {
  std::vector<std::string> out;
  std::stringstream ss(value);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = Trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

std::string HelpText() {
  return R"(usage: opguardd [OPTIONS]

The OpGuard node daemon: receives op-boundary records from training ranks over
ZeroMQ, stores them in RocksDB and answers queries (ZeroMQ, HTTP JSON, /metrics).

Every option is also a config-file key (`key = value`, '#' comments): the flag
--retention-max-bytes is the key retention.max_bytes. Flags override the file.

  --config FILE              config file (default /etc/opguard/opguardd.conf if it exists)
  --local DIR                unprivileged local mode: data in DIR/data, ingest socket
                             ipc://DIR/ingest.sock, queries ipc://DIR/query.sock;
                             the default config file is not read
  --data-dir DIR             RocksDB directory (default /var/lib/opguard)
  --ingest ENDPOINT          ZeroMQ endpoint the shims send to
                             (default ipc:///run/opguard/ingest.sock)
  --listen ENDPOINT          ZeroMQ query endpoint for the CLI and peer daemons
                             (default tcp://127.0.0.1:7455)
  --http HOST:PORT           HTTP JSON API and /metrics (default 127.0.0.1:7456;
                             port 0 picks a free port, "off" disables HTTP)
  --peers E1,E2,...          query endpoints of the other nodes' daemons (cluster queries)
  --log-level LEVEL          debug | info | warn | error (default info)

ingest:
  --ingest.max-message-bytes N   largest accepted batch (default 64MiB); larger ones are
                             rejected; beyond twice this ZeroMQ drops the connection
  --ingest.max-group-bytes N     bytes written by one group commit (default 64MiB)
  --ingest.socket-mode OCTAL     permissions of an ipc:// ingest socket (default 0666:
                             any local user's training job may send records)
  --ingest.hwm N             messages queued per sender before backpressure (default 32)

storage:
  --storage.write-buffer-bytes N     memtable size for ops (default 64MiB)
  --storage.memtable-budget-bytes N  all memtables together (default 512MiB)
  --storage.block-cache-bytes N      read cache (default 128MiB)
  --storage.background-jobs N        flush/compaction threads (default 2)
  --storage.compression NAME         lz4 | zstd | snappy | none (default lz4): op
                                     chunks (compressed at ingest) and upper levels
  --storage.bottommost-compression NAME  where the other data settles (default zstd)
  --storage.compaction STYLE         level | universal (default level)

retention (0 = no limit):
  --retention.max-bytes N    remove oldest runs while the store is larger (e.g. 500G)
  --retention.max-age DUR    remove runs whose last record is older (e.g. 30d, 12h)
  --retention.interval DUR   how often to check (default 60s)

queries:
  --query.max-trace-page N   ops per trace answer at most (default 10000)

  --help                     this text

Sizes take K/M/G/T suffixes (powers of 1024, optional "iB"/"B"); durations
s/m/h/d. Signals: SIGTERM/SIGINT finish the in-flight batch and close the store.
)";
}

Result<uint64_t> ParseBytes(const std::string& text) {
  std::string t = Trim(text);
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  if (i == 0) return InvalidArgument("'" + text + "' is not a size");
  uint64_t n = std::stoull(t.substr(0, i));
  std::string unit = Normalize(Trim(t.substr(i)));
  uint64_t mul = 1;
  if (unit.empty() || unit == "b") {
    mul = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mul = 1ull << 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mul = 1ull << 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mul = 1ull << 30;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    mul = 1ull << 40;
  } else {
    return InvalidArgument("'" + text + "' has an unknown size unit");
  }
  return n * mul;
}

Result<std::chrono::seconds> ParseDuration(const std::string& text) {
  std::string t = Trim(text);
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  if (i == 0) return InvalidArgument("'" + text + "' is not a duration");
  uint64_t n = std::stoull(t.substr(0, i));
  std::string unit = Trim(t.substr(i));
  uint64_t mul = 0;
  if (unit.empty() || unit == "s") mul = 1;
  if (unit == "m" || unit == "min") mul = 60;
  if (unit == "h") mul = 3600;
  if (unit == "d") mul = 86400;
  if (mul == 0) return InvalidArgument("'" + text + "' has an unknown duration unit (s, m, h, d)");
  return std::chrono::seconds(n * mul);
}

Status ApplyKey(const std::string& raw_key, const std::string& value, Config* c) {
  const std::string key = Normalize(raw_key);
  auto bytes = [&](uint64_t* out) -> Status {
    auto r = ParseBytes(value);
    if (!r.ok()) return InvalidArgument(raw_key + ": " + r.status().message());
    *out = *r;
    return Status::Ok();
  };
  auto seconds = [&](std::chrono::seconds* out) -> Status {
    auto r = ParseDuration(value);
    if (!r.ok()) return InvalidArgument(raw_key + ": " + r.status().message());
    *out = *r;
    return Status::Ok();
  };
  if (key == "data_dir") {
    if (value.empty()) return InvalidArgument("data_dir: empty");
    c->data_dir = value;
  } else if (key == "ingest") {
    if (value.empty()) return InvalidArgument("ingest: empty endpoint");
    c->ingest = value;
  } else if (key == "listen") {
    if (value.empty()) return InvalidArgument("listen: empty endpoint");
    c->listen = value;
  } else if (key == "http") {
    c->http = (value == "off" || value == "none") ? "" : value;
    if (!c->http.empty() && c->http.rfind(':') == std::string::npos) {
      return InvalidArgument("http: '" + value + "' is not HOST:PORT");
    }
  } else if (key == "peers") {
    c->peers = SplitComma(value);
  } else if (key == "log_level") {
    if (!ParseLogLevel(value, &c->log_level)) {
      return InvalidArgument("log_level: '" + value + "' is not debug|info|warn|error|off");
    }
  } else if (key == "ingest_max_message_bytes") {
    OPGUARD_RETURN_IF_ERROR(bytes(&c->max_message_bytes));
    if (c->max_message_bytes < 1024 || c->max_message_bytes > (1ull << 31)) {
      return InvalidArgument(raw_key + ": must be between 1KiB and 2GiB");
    }
  } else if (key == "ingest_max_group_bytes") {
    OPGUARD_RETURN_IF_ERROR(bytes(&c->max_group_bytes));
    if (c->max_group_bytes < 4096) return InvalidArgument(raw_key + ": must be at least 4KiB");
  } else if (key == "ingest_socket_mode") {
    auto r = ParseUint(raw_key, value, 8);
    if (!r.ok()) return r.status();
    if (*r > 0777) return InvalidArgument(raw_key + ": '" + value + "' is not an octal mode");
    c->ingest_socket_mode = static_cast<uint32_t>(*r);
  } else if (key == "ingest_hwm") {
    auto r = ParseUint(raw_key, value);
    if (!r.ok()) return r.status();
    if (*r == 0 || *r > 1000000) return InvalidArgument(raw_key + ": must be 1..1000000");
    c->ingest_hwm = static_cast<uint32_t>(*r);
  } else if (key == "storage_write_buffer_bytes") {
    OPGUARD_RETURN_IF_ERROR(bytes(&c->write_buffer_bytes));
    if (c->write_buffer_bytes < (1u << 20)) return InvalidArgument(raw_key + ": at least 1MiB");
  } else if (key == "storage_memtable_budget_bytes") {
    OPGUARD_RETURN_IF_ERROR(bytes(&c->memtable_budget_bytes));
  } else if (key == "storage_block_cache_bytes") {
    OPGUARD_RETURN_IF_ERROR(bytes(&c->block_cache_bytes));
  } else if (key == "storage_background_jobs") {
    auto r = ParseUint(raw_key, value);
    if (!r.ok()) return r.status();
    if (*r < 1 || *r > 64) return InvalidArgument(raw_key + ": must be 1..64");
    c->background_jobs = static_cast<int>(*r);
  } else if (key == "storage_compression") {
    if (value != "lz4" && value != "zstd" && value != "snappy" && value != "none") {
      return InvalidArgument(raw_key + ": '" + value + "' is not lz4|zstd|snappy|none");
    }
    c->compression = value;
  } else if (key == "storage_bottommost_compression") {
    if (value != "lz4" && value != "zstd" && value != "snappy" && value != "none") {
      return InvalidArgument(raw_key + ": '" + value + "' is not lz4|zstd|snappy|none");
    }
    c->bottommost_compression = value;
  } else if (key == "storage_compaction") {
    if (value != "level" && value != "universal") {
      return InvalidArgument(raw_key + ": '" + value + "' is not level|universal");
    }
    c->compaction = value;
  } else if (key == "retention_max_bytes") {
    OPGUARD_RETURN_IF_ERROR(bytes(&c->retention_max_bytes));
  } else if (key == "retention_max_age") {
    OPGUARD_RETURN_IF_ERROR(seconds(&c->retention_max_age));
  } else if (key == "retention_interval") {
    OPGUARD_RETURN_IF_ERROR(seconds(&c->retention_interval));
    if (c->retention_interval.count() < 1) return InvalidArgument(raw_key + ": at least 1s");
  } else if (key == "query_max_trace_page") {
    auto r = ParseUint(raw_key, value);
    if (!r.ok()) return r.status();
    if (*r < 1 || *r > 1000000) return InvalidArgument(raw_key + ": must be 1..1000000");
    c->max_trace_page = static_cast<uint32_t>(*r);
  } else {
    return InvalidArgument("unknown option '" + raw_key + "' (see opguardd --help)");
  }
  return Status::Ok();
}

Status ApplyConfigText(const std::string& text, const std::string& origin, Config* config) {
  std::istringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    line = Trim(line);
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument(origin + ":" + std::to_string(number) + ": expected `key = value`");
    }
    Status st = ApplyKey(Trim(line.substr(0, eq)), Trim(line.substr(eq + 1)), config);
    if (!st.ok()) return InvalidArgument(origin + ":" + std::to_string(number) + ": " + st.message());
  }
  return Status::Ok();
}

Status ApplyConfigFile(const std::string& path, Config* config) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read config file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  config->config_path = path;
  return ApplyConfigText(ss.str(), path, config);
}

Result<Config> ParseCommandLine(int argc, const char* const* argv, bool* help) {
  *help = false;
  // Flags as (name, value) pairs; "--name=value" and "--name value" both work.
  std::vector<std::pair<std::string, std::string>> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return Config{};
    }
    if (arg.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '" + arg + "'");
    arg = arg.substr(2);
    auto eq = arg.find('=');
    if (eq != std::string::npos) {
      flags.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
    } else {
      if (i + 1 >= argc) return InvalidArgument("--" + arg + " needs a value");
      flags.emplace_back(arg, argv[++i]);
    }
  }
  Config config;
  std::string config_path, local_dir;
  for (const auto& [name, value] : flags) {
    if (Normalize(name) == "config") config_path = value;
    if (Normalize(name) == "local") local_dir = value;
  }
  if (!local_dir.empty()) {
    while (local_dir.size() > 1 && local_dir.back() == '/') local_dir.pop_back();
    config.data_dir = local_dir + "/data";
    config.ingest = "ipc://" + local_dir + "/ingest.sock";
    config.listen = "ipc://" + local_dir + "/query.sock";
  }
  if (!config_path.empty()) {
    OPGUARD_RETURN_IF_ERROR(ApplyConfigFile(config_path, &config));
  } else if (local_dir.empty()) {
    struct stat st{};
    if (::stat(kDefaultConfigPath, &st) == 0) {
      OPGUARD_RETURN_IF_ERROR(ApplyConfigFile(kDefaultConfigPath, &config));
    }
  }
  for (const auto& [name, value] : flags) {
    const std::string n = Normalize(name);
    if (n == "config" || n == "local") continue;
    Status st = ApplyKey(name, value, &config);
    if (!st.ok()) return InvalidArgument("--" + name + ": " + st.message());
  }
  return config;
}

}  // namespace opguard::daemon
