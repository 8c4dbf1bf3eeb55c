// opguardd configuration: built-in defaults, then the config file, then the
// command line (each later source overrides the earlier one). Every key is
// documented in HelpText() and docs/daemon.md; the file format is one
// `key = value` per line, `#` starts a comment, and a key is its flag's name
// with '_' for '-' (retention.max_bytes <-> --retention.max-bytes).
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
  // --local DIR (empty: not local mode): checked and locked before the store
  // opens (local/local_dir.h).
  std::string local_dir;
  // Exit (status 0) after this long without a batch received or a query
  // answered; 0: never. The per-user daemon the opguard package starts sets
  // it (docs/install.md); a service manager's daemon needs none.
  std::chrono::seconds idle_exit{0};
  // --user: start this user's daemon (opguard/daemon/user_daemon.h) and exit.
  bool user_daemon = false;
  std::string data_dir = "/var/lib/opguard";
  std::string ingest = "ipc:///run/opguard/ingest.sock";
  std::string listen = "tcp://127.0.0.1:7455";  // empty: off
  // The unix query socket: every query, and the only endpoint for admin
  // requests (opguard rm). Empty: off. Bound once when equal to `listen`.
  std::string query_socket = "ipc:///run/opguard/query.sock";
  std::string http = "127.0.0.1:7456";  // empty: HTTP disabled; port 0: any free port
  uint32_t http_max_connections = 64;   // at most a quarter of the file descriptor limit
  // A file holding the token HTTP clients off loopback must present
  // (Authorization: Bearer, the opguard_token cookie or ?token=); empty: none.
  std::string http_token_file;
  // Host header values the HTTP server answers besides IP addresses,
  // localhost and this node's host name (DNS rebinding: other names get 421).
  std::vector<std::string> http_host_names;

  // Who may do what (docs/daemon.md, "Access").
  std::string socket_group = "opguard";      // group of the runtime dir and unix sockets; "" : the daemon's
  uint32_t query_socket_mode = 0660;         // permissions of an ipc:// query socket
  std::string admin_group = "opguard-admin"; // may remove any run (with root and the daemon's user)
  // CURVE on TCP query endpoints and toward peers: this daemon's keypair
  // (`opguard keygen`) and the client public keys it accepts, one per line.
  std::string curve_key_file;
  std::string curve_authorized_keys;
  std::vector<std::string> peers;
  // The web viewer's files; empty: found next to the binary
  // (../share/opguard/web) or in the source tree (query/web_files.h).
  std::string web_root;
  LogLevel log_level = LogLevel::kInfo;

  // Ingest limits.
  uint64_t max_message_bytes = 64u << 20;  // larger batches get a Rejected ack
  uint64_t max_group_bytes = 64u << 20;    // one group commit (and the backlog behind it)
  uint32_t ingest_socket_mode = 0660;      // permissions of an ipc:// ingest socket
  uint32_t ingest_hwm = 4;                 // ZeroMQ receive queue per sender, in messages
  // What senders can make the daemon hold (docs/daemon.md, Limits): a batch
  // beyond one of these gets a Rejected ack (reason "limit").
  uint64_t max_inflight_bytes = 128u << 20;  // received, not yet acknowledged; then reading stops
  uint32_t max_world_size = 1u << 17;        // announced world size and rank index
  uint32_t max_runs = 10000;
  uint32_t max_ranks_per_run = 8192;
  uint32_t max_ranks = 1u << 17;             // ranks of all runs together
  uint64_t max_string_bytes = 64u << 10;     // any one text of a batch
  uint64_t max_source_bytes = 1u << 20;      // one source file (the shim's OPGUARD_MAX_SOURCE_KB default)
  uint64_t max_run_metadata_bytes = 64u << 10;  // job id, framework and settings of a run together

  // Storage.
  uint64_t write_buffer_bytes = 64u << 20;    // per memtable of the ops column family
  uint64_t memtable_budget_bytes = 512u << 20;  // all memtables together
  uint64_t block_cache_bytes = 128u << 20;
  int background_jobs = 2;
  std::string compression = "lz4";          // lz4 | zstd | snappy | none
  std::string bottommost_compression = "zstd";  // the level where data settles
  std::string compaction = "level";         // level | universal
  // Store each op record's event core (what a trace scan aligns on) with its
  // chunk: a first diff costs ~2.5x less CPU, ingest ~15% more CPU and the
  // store ~40 bytes more per op (docs/storage.md).
  bool op_cores = true;
  // Disk space (docs/storage.md): new records are refused ("retry later")
  // while the store holds max_bytes (0: no limit) or its file system has
  // less than reserved_bytes free, or fewer than reserved_inodes free
  // inodes (RocksDB's flushes and compactions create files); queries and
  // deletions go on.
  uint64_t max_bytes = 0;
  uint64_t reserved_bytes = 256u << 20;
  uint64_t reserved_inodes = 1024;

  // Retention: 0 disables a limit. Oldest runs (by last record) are removed
  // first; the most recently active run is never removed by retention.
  uint64_t retention_max_bytes = 0;
  std::chrono::seconds retention_max_age{0};
  std::chrono::seconds retention_interval{60};

  // Queries.
  uint32_t max_trace_page = 10000;  // ops per ReadTrace answer
  // How long one aligner query (diff, ranks, collectives, alignment) may
  // compute, from its arrival; then it stops with "query exceeded its time
  // budget of N s". The CLI's default timeout is the same 120 s.
  std::chrono::milliseconds query_time_budget{120000};
  // Rank traces kept between queries (query/trace_cache.h): ~80 bytes per
  // op; the default holds two 1.5 M-op traces. 0: none kept.
  uint64_t query_trace_cache_bytes = 256u << 20;

  // Explanations in prose (query/explain.h): an OpenAI-compatible chat
  // completions URL; empty: off, nothing is sent anywhere.
  std::string explain_endpoint;
  std::string explain_model = "gpt-4o-mini";
  std::string explain_api_key_file;  // the bearer token, one line; empty: none sent
  std::chrono::milliseconds explain_timeout{60000};
};

// The text printed by `opguardd --help`.
std::string HelpText();

// Parses the command line: reads --config FILE (or the default file when it
// exists and --local is not given) first, then applies the other flags.
// `--local DIR` puts the data dir and sockets under DIR for unprivileged use.
// Refuses a network endpoint an outsider could reach without credentials:
// a query endpoint off loopback without CURVE keys, HTTP off loopback
// without a token. Sets *help when --help was given. Errors are one line, naming the file for
// a bad file line. Sizes take K/M/G/T (powers of 1024, optional "iB"/"B"),
// durations s/m/h/d.
Result<Config> ParseCommandLine(int argc, const char* const* argv, bool* help);

}  // namespace opguard::daemon
