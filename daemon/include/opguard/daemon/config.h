// opguardd configuration: built-in defaults, then the config file, then the
// command line (each later source overrides the earlier one). Every key is
// documented in HelpText() and docs/daemon.md; the file format is one
// `key = value` per line, `#` starts a comment.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "opguard/common/log.h"
#include "opguard/common/status.h"

namespace opguard::daemon {

inline constexpr char kDefaultConfigPath[] = "/etc/opguard/opguardd.conf";

struct Config {
  std::string config_path;  // empty: none read
  std::string data_dir = "/var/lib/opguard";
  std::string ingest = "ipc:///run/opguard/ingest.sock";
  std::string listen = "tcp://127.0.0.1:7455";
  std::string http = "127.0.0.1:7456";  // empty: HTTP disabled; port 0: any free port
  std::vector<std::string> peers;
  LogLevel log_level = LogLevel::kInfo;

  // Ingest limits.
  uint64_t max_message_bytes = 64u << 20;  // larger batches get a Rejected ack
  uint64_t max_group_bytes = 64u << 20;    // one group commit (and the backlog behind it)
  uint32_t ingest_socket_mode = 0666;      // permissions of an ipc:// ingest socket
  uint32_t ingest_hwm = 32;                // ZeroMQ receive queue per sender, in messages

  // Storage.
  uint64_t write_buffer_bytes = 64u << 20;    // per memtable of the ops column family
  uint64_t memtable_budget_bytes = 512u << 20;  // all memtables together
  uint64_t block_cache_bytes = 128u << 20;
  int background_jobs = 2;
  std::string compression = "lz4";          // lz4 | zstd | snappy | none
  std::string bottommost_compression = "zstd";  // the level where data settles
  std::string compaction = "level";         // level | universal

  // Retention: 0 disables a limit. Oldest runs (by last record) are removed
  // first; the most recently active run is never removed by retention.
  uint64_t retention_max_bytes = 0;
  std::chrono::seconds retention_max_age{0};
  std::chrono::seconds retention_interval{60};

  // Queries.
  uint32_t max_trace_page = 10000;  // ops per ReadTrace answer
};

// The text printed by `opguardd --help`.
std::string HelpText();

// Applies `key = value` lines of a config file to `config`.
Status ApplyConfigText(const std::string& text, const std::string& origin, Config* config);
Status ApplyConfigFile(const std::string& path, Config* config);

// Applies one key (as in the file; flags use the same names with `--` and
// `-` for `_`/`.`), e.g. ApplyKey("retention.max_bytes", "500G").
Status ApplyKey(const std::string& key, const std::string& value, Config* config);

// Parses the command line: reads --config FILE (or the default file when it
// exists and --local is not given) first, then applies the other flags.
// `--local DIR` puts the data dir and sockets under DIR for unprivileged use.
// Sets *help when --help was given.
Result<Config> ParseCommandLine(int argc, const char* const* argv, bool* help);

// "500G", "64MiB", "1048576" -> bytes; "30d", "12h", "90s", "15m" -> seconds.
Result<uint64_t> ParseBytes(const std::string& text);
Result<std::chrono::seconds> ParseDuration(const std::string& text);

}  // namespace opguard::daemon
