#include "opguard/daemon/config.h"

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <memory>

#include "access/access.h"

namespace opguard::daemon {
namespace {

// The file through CLI11's `key = value` reader, with two differences from its
// TOML-like defaults: a key spells its flag's '-' as '_' and its dots are part
// of the name (not TOML tables), and a value is never split into a list at
// spaces or commas (data_dir = /srv/my runs stays one path).
class FileFormat : public CLI::ConfigBase {
 public:
  FileFormat() {
    parentSeparatorChar = '\0';
    arraySeparator = ';';  // not ',': only a bracketed [a; b] value is a list
  }
  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    auto items = ConfigBase::from_config(in);
    for (auto& item : items) std::replace(item.name.begin(), item.name.end(), '_', '-');
    return items;
  }
};

// CLI11's unit readers, with a one-line error instead of their unit tables.
CLI::Validator Units(CLI::Validator units, const std::string& what) {
  return CLI::Validator(
      [units, what](std::string& text) {
        const std::string given = text;
        try {
          if (units(text).empty()) return std::string();
        } catch (const CLI::ValidationError&) {
        }
        return "'" + given + "' is not " + what;
      },
      "");
}

// CLI11 splits --peers at ',' but keeps the spaces of "a, b".
std::string Trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

// A file mode, always octal like chmod's ("0660").
CLI::Validator OctalMode() {
  return CLI::Validator(
      [](std::string& s) {
        const bool octal =
            !s.empty() && s.size() <= 4 && s.find_first_not_of("01234567") == std::string::npos;
        if (!octal || std::stoul(s, nullptr, 8) > 0777) return "'" + s + "' is not an octal mode";
        s = std::to_string(std::stoul(s, nullptr, 8));
        return std::string();
      },
      "");
}

// CLI11 2.1 has no validator for this.
std::string NotEmpty(const std::string& s) { return s.empty() ? "empty" : ""; }

struct Flags {
  std::string config_path, local_dir, socket_dir;
  bool user = false;
};

std::unique_ptr<CLI::App> MakeApp(Config* c, Flags* flags) {
  const auto size = Units(CLI::AsSizeValue(false), "a size (64MiB, 500G)");
  const auto duration = Units(CLI::AsNumberWithUnit(std::map<std::string, uint64_t>{
                                  {"s", 1}, {"m", 60}, {"min", 60}, {"h", 3600}, {"d", 86400}}),
                              "a duration (90s, 15m, 12h, 30d)");
  const auto compression = CLI::IsMember({"lz4", "zstd", "snappy", "none"});

  auto app = std::make_unique<CLI::App>(
      "The OpGuard node daemon: receives op-boundary records from training ranks over\n"
      "ZeroMQ, stores them in RocksDB and answers queries (ZeroMQ, HTTP JSON, /metrics).\n\n"
      "Every option is also a config-file key (`key = value`, '#' comments): the flag\n"
      "--retention.max-bytes is the key retention.max_bytes. Flags override the file.\n",
      "opguardd");
  app->footer(
      "Sizes take K/M/G/T suffixes (powers of 1024, optional \"iB\"/\"B\"); durations\n"
      "s/m/h/d. Signals: SIGTERM/SIGINT finish the in-flight batch and close the store.");
  app->get_formatter()->column_width(38);
  app->config_formatter(std::make_shared<FileFormat>());
  app->allow_config_extras(false);
  app->option_defaults()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);  // a later value wins

  // One option: its help group, flag, field, value name in --help, and help.
  auto add = [&app](const char* group, const char* flag, auto& field, const char* value,
                    const std::string& help) {
    return app->add_option(flag, field, help)->group(group)->option_text(value);
  };
  auto add_size = [&add, &size](const char* group, const char* flag, uint64_t& field,
                                const std::string& help, uint64_t min = 0) {
    return add(group, flag, field, "N", help)->transform(size)->check(CLI::Range(min, UINT64_MAX));
  };
  auto add_seconds = [&app](const char* flag, std::chrono::seconds* field,
                            const std::string& help) {
    return app
        ->add_option_function<uint64_t>(
            flag, [field](uint64_t s) { *field = std::chrono::seconds(s); }, help)
        ->group("retention (0 = no limit)")
        ->option_text("DUR");
  };
  const char* kGeneral = "Options";
  add(kGeneral, "--config", flags->config_path, "FILE",
      "config file (default /etc/opguard/opguardd.conf if it exists)")
      ->configurable(false);
  add(kGeneral, "--local", flags->local_dir, "DIR",
      "unprivileged local mode: data in DIR/data, ingest socket\n"
      "ipc://DIR/ingest.sock, queries ipc://DIR/query.sock\n"
      "(no TCP), sockets 0660 with the user's group;\n"
      "the default config file is not read; DIR, its data\n"
      "and socket folders must be this user's alone")
      ->configurable(false);
  add(kGeneral, "--socket-dir", flags->socket_dir, "DIR",
      "with --local: the sockets' folder instead of DIR\n"
      "(e.g. $XDG_RUNTIME_DIR/opguard)")
      ->configurable(false);
  app->add_flag("--user", flags->user,
                "start this user's daemon unless it runs (--local under\n"
                "$XDG_STATE_HOME/opguard, sockets in $XDG_RUNTIME_DIR/\n"
                "opguard, --idle-exit or $OPGUARD_DAEMON_IDLE s, else\n"
                "10m), print its endpoints, return\n"
                "once it answers (what OPGUARD=1 and opguard do)")
      ->group(kGeneral)
      ->configurable(false);
  app->add_option_function<uint64_t>(
         "--idle-exit", [c](uint64_t s) { c->idle_exit = std::chrono::seconds(s); },
         "exit after DUR without a batch received or a query\n"
         "answered (default 0: never)")
      ->group(kGeneral)
      ->option_text("DUR")
      ->transform(duration);
  add(kGeneral, "--data-dir", c->data_dir, "DIR", "RocksDB directory (default /var/lib/opguard)")
      ->check(NotEmpty);
  add(kGeneral, "--ingest", c->ingest, "ENDPOINT",
      "ZeroMQ endpoint the shims send to\n(default ipc:///run/opguard/ingest.sock)")
      ->check(NotEmpty);
  const auto off = [](std::string s) { return s == "off" || s == "none" ? std::string() : s; };
  add(kGeneral, "--listen", c->listen, "ENDPOINT",
      "ZeroMQ query endpoint for the CLI and peer daemons\n"
      "(default tcp://127.0.0.1:7455; \"off\"); off loopback\n"
      "it needs curve.key_file and curve.authorized_keys")
      ->transform(off);
  add(kGeneral, "--query-socket", c->query_socket, "ENDPOINT",
      "unix query socket, the one that takes admin requests\n"
      "(opguard rm) (default ipc:///run/opguard/query.sock)")
      ->transform(off)
      ->check([](const std::string& s) {
        return s.empty() || s.rfind("ipc://", 0) == 0 ? std::string() : "'" + s + "' is not ipc://PATH";
      });
  add(kGeneral, "--http", c->http, "HOST:PORT",
      "HTTP JSON API and /metrics (default 127.0.0.1:7456;\n"
      "port 0 picks a free port, \"off\" disables HTTP)")
      ->transform(off)
      ->check([](const std::string& s) {
        return s.empty() || s.rfind(':') != std::string::npos ? std::string()
                                                              : "'" + s + "' is not HOST:PORT";
      });
  add(kGeneral, "--http.max-connections", c->http_max_connections, "N",
      "HTTP connections served at once (default 64; at most\n"
      "a quarter of the file descriptor limit)")
      ->check(CLI::Range(1u, 1000000u));
  add(kGeneral, "--http.token-file", c->http_token_file, "FILE",
      "token HTTP clients off loopback must present\n"
      "(Bearer, cookie or ?token=); needed to serve HTTP\n"
      "off loopback");
  add(kGeneral, "--http.host-names", c->http_host_names, "N1,N2,...",
      "Host header names the HTTP server answers besides IP\n"
      "addresses, localhost and this node's host name; others\n"
      "get 421 (DNS rebinding)")
      ->delimiter(',')
      ->transform(Trim);
  add(kGeneral, "--web-root", c->web_root, "DIR",
      "the web viewer's files (default: ../share/opguard/web\n"
      "next to opguardd, or the source tree's web/)");
  add(kGeneral, "--peers", c->peers, "E1,E2,...",
      "query endpoints of the other nodes' daemons\n(cluster queries)")
      ->delimiter(',')
      ->transform(Trim);
  app->add_option_function<std::string>(
         "--log-level", [c](const std::string& s) { ParseLogLevel(s, &c->log_level); },
         "debug | info | warn | error | off (default info)")
      ->option_text("LEVEL")
      ->check(CLI::IsMember({"debug", "info", "warn", "warning", "error", "off"}));

  add_size("ingest", "--ingest.max-message-bytes", c->max_message_bytes,
           "largest accepted batch (default 64MiB); larger ones\n"
           "are rejected; beyond twice this ZeroMQ drops the connection")
      ->check(CLI::Range(uint64_t{1} << 10, uint64_t{1} << 31));
  add_size("ingest", "--ingest.max-group-bytes", c->max_group_bytes,
           "bytes written by one group commit (default 64MiB)", 4096);
  add("ingest", "--ingest.socket-mode", c->ingest_socket_mode, "OCTAL",
      "permissions of an ipc:// ingest socket (default 0660:\n"
      "the training jobs of socket_group's members)")
      ->transform(OctalMode());
  add("ingest", "--ingest.hwm", c->ingest_hwm, "N",
      "messages ZeroMQ queues per sender before backpressure\n(default 4)")
      ->check(CLI::Range(1, 1000000));
  add_size("limits", "--ingest.max-inflight-bytes", c->max_inflight_bytes,
           "batches received and not yet acknowledged, at most\n"
           "(default 128MiB); then the daemon stops reading",
           4096);
  add("limits", "--ingest.max-world-size", c->max_world_size, "N",
      "largest world size and rank index accepted\n(default 131072)")
      ->check(CLI::Range(1u, 1u << 30));
  add("limits", "--ingest.max-runs", c->max_runs, "N", "runs stored, at most (default 10000)")
      ->check(CLI::Range(1u, UINT32_MAX));
  add("limits", "--ingest.max-ranks-per-run", c->max_ranks_per_run, "N",
      "ranks of one run, at most (default 8192)")
      ->check(CLI::Range(1u, UINT32_MAX));
  add("limits", "--ingest.max-ranks", c->max_ranks, "N",
      "ranks of all runs together, at most (default 131072)")
      ->check(CLI::Range(1u, UINT32_MAX));
  add_size("limits", "--ingest.max-string-bytes", c->max_string_bytes,
           "longest text of a batch (default 64KiB)", 256);
  add_size("limits", "--ingest.max-source-bytes", c->max_source_bytes,
           "largest source file stored (default 1MiB, as the shim's\n"
           "OPGUARD_MAX_SOURCE_KB); a larger one is not stored, the\n"
           "rest of its batch is", 0);
  add_size("limits", "--ingest.max-run-metadata-bytes", c->max_run_metadata_bytes,
           "a run's job id, framework and settings together\n(default 64KiB)", 1024);

  const char* kAccess = "access (docs/operations.md)";
  add(kAccess, "--socket-group", c->socket_group, "GROUP",
      "group of the runtime dir and the unix sockets\n"
      "(default opguard; \"\": the daemon's own group)");
  add(kAccess, "--query.socket-mode", c->query_socket_mode, "OCTAL",
      "permissions of an ipc:// query socket (default 0660)")
      ->transform(OctalMode());
  add(kAccess, "--admin-group", c->admin_group, "GROUP",
      "members may remove any run (default opguard-admin;\n"
      "root and the daemon's user always may)");
  add(kAccess, "--curve.key-file", c->curve_key_file, "FILE",
      "this daemon's CURVE keypair (opguard keygen): TCP\n"
      "queries and peer traffic are encrypted and\nauthenticated");
  add(kAccess, "--curve.authorized-keys", c->curve_authorized_keys, "FILE",
      "client public keys allowed on TCP, one per line");

  add_size("storage", "--storage.write-buffer-bytes", c->write_buffer_bytes,
           "memtable size for ops (default 64MiB)", 1 << 20);
  add_size("storage", "--storage.memtable-budget-bytes", c->memtable_budget_bytes,
           "all memtables together (default 512MiB)");
  add_size("storage", "--storage.block-cache-bytes", c->block_cache_bytes,
           "read cache (default 128MiB)");
  add("storage", "--storage.background-jobs", c->background_jobs, "N",
      "flush/compaction threads (default 2)")
      ->check(CLI::Range(1, 64));
  add("storage", "--storage.compression", c->compression, "NAME",
      "lz4 | zstd | snappy | none (default lz4): op chunks\n"
      "(compressed at ingest) and upper levels")
      ->check(compression);
  add("storage", "--storage.bottommost-compression", c->bottommost_compression, "NAME",
      "where the other data settles (default zstd)")
      ->check(compression);
  add("storage", "--storage.op-cores", c->op_cores, "BOOL",
      "store each op's alignment core with its records\n"
      "(default true): a first diff reads no record, for\n"
      "~40 bytes per op on disk and ~15% more ingest CPU");
  add("storage", "--storage.compaction", c->compaction, "STYLE",
      "level | universal (default level)")
      ->check(CLI::IsMember({"level", "universal"}));
  add_size("storage", "--storage.max-bytes", c->max_bytes,
           "new records are answered \"retry later\" while the\n"
           "store's SST and blob files hold this much\n"
           "(default 0: no limit); queries and rm go on");
  add_size("storage", "--storage.reserved-bytes", c->reserved_bytes,
           "free space kept on the data directory's file\n"
           "system: new records wait below it (default\n"
           "256MiB; rm and compactions use it)");
  add("storage", "--storage.reserved-inodes", c->reserved_inodes, "N",
      "free inodes kept on that file system: new records\n"
      "wait below it (default 1024; RocksDB's flushes\n"
      "and compactions create files; 0: no inode checks)");

  add_size("retention (0 = no limit)", "--retention.max-bytes", c->retention_max_bytes,
           "remove oldest runs while the store is larger\n(e.g. 500G)");
  add_seconds("--retention.max-age", &c->retention_max_age,
              "remove runs whose last record is older\n(e.g. 30d, 12h)")
      ->transform(duration);
  add_seconds("--retention.interval", &c->retention_interval, "how often to check (default 60s)")
      ->transform(duration)
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX));

  add("queries", "--query.max-trace-page", c->max_trace_page, "N",
      "ops per trace answer at most (default 10000)")
      ->check(CLI::Range(1, 1000000));
  add_size("queries", "--query.trace-cache-bytes", c->query_trace_cache_bytes,
           "rank traces kept between queries (~80 bytes per op;\ndefault 256MiB; 0: none)");
  const auto millis = Units(CLI::AsNumberWithUnit(std::map<std::string, uint64_t>{
                                {"ms", 1}, {"s", 1000}, {"m", 60000}, {"min", 60000}, {"h", 3600000}}),
                            "a duration (500ms, 90s, 15m)");
  app->add_option_function<uint64_t>(
         "--query.time-budget",
         [c](uint64_t ms) { c->query_time_budget = std::chrono::milliseconds(ms); },
         "how long one diff, ranks, collectives or alignment\nquery may compute (default 120s)")
      ->group("queries")
      ->option_text("DUR")
      ->transform(millis)
      ->check(CLI::Range(uint64_t{1}, uint64_t{24} * 3600000));

  const char* kExplain = "explanations (nothing is sent without explain.endpoint)";
  add(kExplain, "--explain.endpoint", c->explain_endpoint, "URL",
      "an OpenAI-compatible chat completions URL\n(http:// or https://): a diff's evidence\n"
      "is sent there for an explanation in prose,\nkept by its hash (default: none)")
      ->check([](const std::string& url) {
        return url.empty() || url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0
                   ? std::string()
                   : std::string("must be an http:// or https:// URL");
      });
  add(kExplain, "--explain.model", c->explain_model, "NAME", "the model asked (default gpt-4o-mini)");
  add(kExplain, "--explain.api-key-file", c->explain_api_key_file, "FILE",
      "a file holding the endpoint's bearer token");
  app->add_option_function<uint64_t>(
         "--explain.timeout", [c](uint64_t ms) { c->explain_timeout = std::chrono::milliseconds(ms); },
         "how long one answer may take (default 60s)")
      ->group(kExplain)
      ->option_text("DUR")
      ->transform(millis)
      ->check(CLI::Range(uint64_t{1}, uint64_t{3600000}));
  return app;
}

// Nothing an outsider reaches off loopback answers without credentials.
Status CheckExposure(const Config& c) {
  if (c.listen.rfind("tcp://", 0) == 0 && !IsLoopbackEndpoint(c.listen) &&
      (c.curve_key_file.empty() || c.curve_authorized_keys.empty())) {
    return InvalidArgument("refusing to listen on " + c.listen +
                           " without CURVE keys: set curve.key_file and curve.authorized_keys "
                           "(opguard keygen), or listen on 127.0.0.1");
  }
  // Senders have no credentials on TCP (the shim speaks plain ZeroMQ): a
  // training job elsewhere reaches the daemon through a mounted ipc socket.
  if (c.ingest.rfind("tcp://", 0) == 0 && !IsLoopbackEndpoint(c.ingest)) {
    return InvalidArgument("refusing ingest on " + c.ingest +
                           ": senders off this machine cannot be authenticated; use ipc:// or "
                           "tcp://127.0.0.1");
  }
  if (c.listen.rfind("ipc://", 0) != 0 && c.listen.rfind("tcp://", 0) != 0 && !c.listen.empty()) {
    return InvalidArgument("listen = " + c.listen + ": only tcp:// and ipc:// endpoints are served");
  }
  if (!c.http.empty() && !IsLoopbackEndpoint(c.http) && c.http_token_file.empty()) {
    return InvalidArgument("refusing to serve HTTP on " + c.http +
                           " without a token: set http.token_file, or bind 127.0.0.1");
  }
  return Status::Ok();
}

}  // namespace

std::string HelpText() {
  Config config;
  Flags flags;
  return MakeApp(&config, &flags)->help();
}

Result<Config> ParseCommandLine(int argc, const char* const* argv, bool* help) {
  *help = false;
  Config config;
  Flags flags;
  auto app = MakeApp(&config, &flags);
  // First the command line alone: --help, --config, --local and flag errors.
  try {
    app->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    *help = true;
    return Config{};
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }
  // Then in order, each overriding the one before: defaults, local mode, the
  // file, the flags again.
  config = Config{};
  std::string& local = flags.local_dir;
  if (!local.empty()) {
    while (local.size() > 1 && local.back() == '/') local.pop_back();
    std::string& sockets = flags.socket_dir;
    while (sockets.size() > 1 && sockets.back() == '/') sockets.pop_back();
    if (sockets.empty()) sockets = local;
    config.local_dir = local;
    config.data_dir = local + "/data";
    config.ingest = "ipc://" + sockets + "/ingest.sock";
    config.listen = "ipc://" + sockets + "/query.sock";
    config.query_socket = config.listen;
    config.socket_group.clear();  // one user's daemon
  }
  struct stat st {};
  if (flags.config_path.empty() && local.empty() && ::stat(kDefaultConfigPath, &st) == 0) {
    flags.config_path = kDefaultConfigPath;
  }
  if (!flags.config_path.empty()) {
    std::ifstream file(flags.config_path);
    if (!file) return NotFound("cannot read config file " + flags.config_path);
    try {
      app->parse_from_stream(file);
    } catch (const CLI::ParseError& e) {
      return InvalidArgument(flags.config_path + ": " + e.what());
    }
    config.config_path = flags.config_path;
  }
  app->parse(argc, argv);  // parsed without error above
  config.user_daemon = flags.user;
  if (flags.user && !local.empty()) return InvalidArgument("--user and --local exclude each other");
  if (!flags.socket_dir.empty() && local.empty()) {
    return InvalidArgument("--socket-dir goes with --local DIR");
  }
  OPGUARD_RETURN_IF_ERROR(CheckExposure(config));
  return config;
}

}  // namespace opguard::daemon
