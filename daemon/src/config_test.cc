#include "opguard/daemon/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>

namespace opguard::daemon {
namespace {

// Parses `opguardd ARGS...` (always in local mode, so the machine's
// /etc/opguard/opguardd.conf is never read).
Result<Config> Parse(std::initializer_list<const char*> args, bool* help = nullptr) {
  std::vector<const char*> argv = {"opguardd", "--local", "/tmp/og"};
  argv.insert(argv.end(), args);
  bool ignored = false;
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data(), help ? help : &ignored);
}

// A config file with `text`, removed at the end of the test.
class ConfigFile {
 public:
  explicit ConfigFile(const std::string& text) {
    char name[] = "/tmp/opguardd-config-test-XXXXXX";
    const int fd = ::mkstemp(name);
    ::close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~ConfigFile() { std::remove(path_.c_str()); }
  const char* path() const { return path_.c_str(); }

 private:
  std::string path_;
};

TEST(Config, DefaultsMatchTheIssue) {
  Config c;
  EXPECT_EQ(c.data_dir, "/var/lib/opguard");
  EXPECT_EQ(c.ingest, "ipc:///run/opguard/ingest.sock");
  EXPECT_EQ(c.listen, "tcp://127.0.0.1:7455");
  EXPECT_EQ(c.http, "127.0.0.1:7456");
}

TEST(Config, FileFormat) {
  ConfigFile file(
      "# comment\n"
      "   # indented comment\n"
      "\n"
      " data_dir = /srv/my runs   # trailing comment\n"
      "retention.max_bytes = 2G\n"
      "retention.max_age=30d\n"
      "retention.interval = 15m\n"
      "peers = tcp://a:7455, tcp://b:7455\n"
      "http = off\n"
      "log_level = debug\n"
      "ingest.socket_mode = 0660\n"
      "ingest.hwm = 64\n"
      "ingest.max_message_bytes = 1MiB\n"
      "storage.write_buffer_bytes = 8M\n"
      "storage.background_jobs = 4\n"
      "storage.compression = zstd\n"
      "storage.compaction = universal\n"
      "storage.op_cores = false\n"
      "storage.max_bytes = 3MiB\n"
      "storage.reserved_bytes = 0\n"
      "storage.reserved_inodes = 10\n"
      "query.max_trace_page = 500\n"
      "query.time_budget = 1500ms\n");
  auto c = Parse({"--config", file.path()});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->config_path, file.path());
  EXPECT_EQ(c->data_dir, "/srv/my runs");
  EXPECT_EQ(c->ingest, "ipc:///tmp/og/ingest.sock");  // local mode, not overridden
  EXPECT_EQ(c->retention_max_bytes, 2ull << 30);
  EXPECT_EQ(c->retention_max_age.count(), 30 * 86400);
  EXPECT_EQ(c->retention_interval.count(), 15 * 60);
  EXPECT_EQ(c->peers, (std::vector<std::string>{"tcp://a:7455", "tcp://b:7455"}));
  EXPECT_TRUE(c->http.empty());
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_EQ(c->ingest_socket_mode, 0660u);
  EXPECT_EQ(c->ingest_hwm, 64u);
  EXPECT_EQ(c->max_message_bytes, 1u << 20);
  EXPECT_EQ(c->write_buffer_bytes, 8u << 20);
  EXPECT_EQ(c->background_jobs, 4);
  EXPECT_EQ(c->compression, "zstd");
  EXPECT_EQ(c->compaction, "universal");
  EXPECT_FALSE(c->op_cores);
  EXPECT_TRUE(Parse({})->op_cores);
  EXPECT_EQ(c->max_bytes, 3u << 20);
  EXPECT_EQ(c->reserved_bytes, 0u);
  EXPECT_EQ(c->reserved_inodes, 10u);
  EXPECT_EQ(c->max_trace_page, 500u);
  EXPECT_EQ(c->query_time_budget.count(), 1500);
}

TEST(Config, QueryTimeBudgetTakesUnitsAndRefusesZero) {
  auto c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->query_time_budget.count(), 120000);
  c = Parse({"--query.time-budget", "5m"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->query_time_budget.count(), 300000);
  EXPECT_FALSE(Parse({"--query.time-budget", "0s"}).ok());
  auto bad = Parse({"--query.time-budget", "soon"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'soon' is not a duration"), std::string::npos)
      << bad.status().message();
}

TEST(Config, TheShippedConfigFileParses) {
  const std::string shipped = std::string(OPGUARD_SOURCE_DIR) + "/systemd/opguardd.conf";
  auto c = Parse({"--config", shipped.c_str()});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->data_dir, "/var/lib/opguard");
  EXPECT_EQ(c->listen, "tcp://127.0.0.1:7455");
  EXPECT_EQ(c->retention_max_bytes, 0u);
  EXPECT_EQ(c->max_bytes, 0u);
  EXPECT_EQ(c->reserved_bytes, 256u << 20);
  EXPECT_EQ(c->reserved_inodes, 1024u);
}

TEST(Config, FlagFormsAndFlagsOverrideTheFile) {
  ConfigFile file("retention.max_bytes = 2G\ndata_dir = /from/file\nhttp = 127.0.0.1:1\n");
  auto c =
      Parse({"--config", file.path(), "--retention.max-bytes", "512MiB", "--data-dir=/from/flag",
             "--peers", "tcp://a:1,tcp://b:2", "--ingest.socket-mode=660", "--http", "off"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->retention_max_bytes, 512ull << 20);
  EXPECT_EQ(c->data_dir, "/from/flag");
  EXPECT_EQ(c->peers.size(), 2u);
  EXPECT_EQ(c->ingest_socket_mode, 0660u);
  EXPECT_TRUE(c->http.empty());
  // A flag given twice: the later one wins.
  auto twice = Parse({"--data-dir", "/a", "--data-dir", "/b"});
  ASSERT_TRUE(twice.ok()) << twice.status().message();
  EXPECT_EQ(twice->data_dir, "/b");
}

TEST(Config, LocalModePutsEverythingUnderTheDirectory) {
  const char* argv[] = {"opguardd",    "--local", "/tmp/x/",
                        "--log-level", "debug",   "--http=127.0.0.1:0"};
  bool help = false;
  auto c = ParseCommandLine(6, argv, &help);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(help);
  EXPECT_TRUE(c->config_path.empty());
  EXPECT_EQ(c->data_dir, "/tmp/x/data");
  EXPECT_EQ(c->ingest, "ipc:///tmp/x/ingest.sock");
  EXPECT_EQ(c->listen, "ipc:///tmp/x/query.sock");
  EXPECT_EQ(c->http, "127.0.0.1:0");
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
}

TEST(Config, LocalModeSocketDirAndIdleExit) {
  auto c = Parse({"--socket-dir", "/run/user/7/opguard/", "--idle-exit", "10m"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->local_dir, "/tmp/og");
  EXPECT_EQ(c->data_dir, "/tmp/og/data");
  EXPECT_EQ(c->ingest, "ipc:///run/user/7/opguard/ingest.sock");
  EXPECT_EQ(c->query_socket, "ipc:///run/user/7/opguard/query.sock");
  EXPECT_EQ(c->idle_exit, std::chrono::seconds(600));
  EXPECT_FALSE(c->user_daemon);
  EXPECT_EQ(Parse({})->idle_exit, std::chrono::seconds(0));  // never, unless asked

  const char* user[] = {"opguardd", "--user", "--idle-exit", "30s"};
  bool help = false;
  auto u = ParseCommandLine(4, user, &help);
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_TRUE(u->user_daemon);
  EXPECT_EQ(u->idle_exit, std::chrono::seconds(30));
  EXPECT_FALSE(Parse({"--user"}).ok());  // with --local
  const char* sockets_alone[] = {"opguardd", "--socket-dir", "/tmp/s"};
  EXPECT_FALSE(ParseCommandLine(3, sockets_alone, &help).ok());
}

// Every error is one line that names the flag, or the file and the key.
void ExpectError(const Result<Config>& c, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(c.ok());
  const std::string& m = c.status().message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  for (const char* part : parts) EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
}

TEST(Config, BadValuesSayWhereAndWhy) {
  ExpectError(Parse({"--log-level", "loud"}), {"--log-level", "loud"});
  ExpectError(Parse({"--retention.max-bytes", "12Q"}),
              {"--retention.max-bytes", "'12Q' is not a size"});
  ExpectError(Parse({"--retention.max-age", "3w"}),
              {"--retention.max-age", "'3w' is not a duration"});
  ExpectError(Parse({"--http", "nohostport"}), {"--http", "not HOST:PORT"});
  ExpectError(Parse({"--ingest.max-message-bytes", "10"}), {"--ingest.max-message-bytes", "10"});
  ExpectError(Parse({"--ingest.socket-mode", "999"}), {"--ingest.socket-mode"});
  ExpectError(Parse({"--ingest.hwm", "0"}), {"--ingest.hwm"});
  ExpectError(Parse({"--storage.compression", "lzma"}), {"--storage.compression", "lzma"});
  ExpectError(Parse({"--data-dir", ""}), {"--data-dir", "empty"});

  ConfigFile bad_value("# fine\nlog_level = loud\n");
  ExpectError(Parse({"--config", bad_value.path()}), {bad_value.path(), "log-level", "loud"});
  ConfigFile unknown("bogus_key = 1\n");
  ExpectError(Parse({"--config", unknown.path()}), {unknown.path(), "bogus-key"});
  ConfigFile no_equals("no equals sign\n");
  ExpectError(Parse({"--config", no_equals.path()}), {no_equals.path(), "no equals sign"});
  ConfigFile not_here("config = /etc/other.conf\n");
  ExpectError(Parse({"--config", not_here.path()}), {not_here.path(), "config"});
}

TEST(Config, CommandLineErrors) {
  bool help = false;
  const char* missing[] = {"opguardd", "--data-dir"};
  ExpectError(ParseCommandLine(2, missing, &help), {"--data-dir"});
  const char* unknown[] = {"opguardd", "--frobnicate", "1"};
  ExpectError(ParseCommandLine(3, unknown, &help), {"--frobnicate"});
  const char* positional[] = {"opguardd", "stray"};
  ExpectError(ParseCommandLine(2, positional, &help), {"stray"});
  const char* no_file[] = {"opguardd", "--config", "/nonexistent/opguardd.conf"};
  ExpectError(ParseCommandLine(3, no_file, &help), {"/nonexistent/opguardd.conf"});
  const char* h[] = {"opguardd", "--data-dir", "/x", "--help"};
  EXPECT_TRUE(ParseCommandLine(4, h, &help).ok());
  EXPECT_TRUE(help);
}

TEST(Config, HelpDocumentsEveryFlag) {
  const std::string help = HelpText();
  for (const char* flag : {"--config",
                           "--local",
                           "--data-dir",
                           "--ingest",
                           "--listen",
                           "--query-socket",
                           "--socket-group",
                           "--admin-group",
                           "--curve.key-file",
                           "--curve.authorized-keys",
                           "--http.token-file",
                           "--http",
                           "--peers",
                           "--log-level",
                           "--ingest.max-message-bytes",
                           "--ingest.max-group-bytes",
                           "--ingest.socket-mode",
                           "--ingest.hwm",
                           "--storage.write-buffer-bytes",
                           "--storage.memtable-budget-bytes",
                           "--storage.block-cache-bytes",
                           "--storage.background-jobs",
                           "--storage.compression",
                           "--storage.bottommost-compression",
                           "--storage.compaction",
                           "--storage.op-cores",
                           "--retention.max-bytes",
                           "--retention.max-age",
                           "--retention.interval",
                           "--query.max-trace-page",
                           "--query.time-budget",
                           "--help",
                           "retention.max_bytes",
                           "SIGTERM"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace opguard::daemon
