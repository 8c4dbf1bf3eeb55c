#include "opguard/daemon/config.h"

#include <gtest/gtest.h>

namespace opguard::daemon {
namespace {

TEST(Config, DefaultsMatchTheIssue) {
  Config c;
  EXPECT_EQ(c.data_dir, "/var/lib/opguard");
  EXPECT_EQ(c.ingest, "ipc:///run/opguard/ingest.sock");
  EXPECT_EQ(c.listen, "tcp://127.0.0.1:7455");
  EXPECT_EQ(c.http, "127.0.0.1:7456");
}

TEST(Config, FileKeysAndFlagsAreTheSameKeys) {
  Config c;
  ASSERT_TRUE(ApplyConfigText("# comment\n data_dir = /srv/og \nretention.max_bytes = 2G\n"
                              "retention.max_age=30d\npeers = tcp://a:7455, tcp://b:7455\nhttp = off\n",
                              "test.conf", &c)
                  .ok());
  EXPECT_EQ(c.data_dir, "/srv/og");
  EXPECT_EQ(c.retention_max_bytes, 2ull << 30);
  EXPECT_EQ(c.retention_max_age.count(), 30 * 86400);
  ASSERT_EQ(c.peers.size(), 2u);
  EXPECT_EQ(c.peers[1], "tcp://b:7455");
  EXPECT_TRUE(c.http.empty());
  ASSERT_TRUE(ApplyKey("retention-max-bytes", "512MiB", &c).ok());
  EXPECT_EQ(c.retention_max_bytes, 512ull << 20);
  ASSERT_TRUE(ApplyKey("ingest.socket_mode", "0660", &c).ok());
  EXPECT_EQ(c.ingest_socket_mode, 0660u);
}

TEST(Config, BadValuesSayWhereAndWhy) {
  Config c;
  Status st = ApplyConfigText("log_level = loud\n", "x.conf", &c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("x.conf:1"), std::string::npos) << st.message();
  EXPECT_FALSE(ApplyConfigText("no equals sign\n", "x.conf", &c).ok());
  EXPECT_FALSE(ApplyKey("bogus", "1", &c).ok());
  EXPECT_FALSE(ApplyKey("retention.max_bytes", "12Q", &c).ok());
  EXPECT_FALSE(ApplyKey("retention.max_age", "3w", &c).ok());
  EXPECT_FALSE(ApplyKey("http", "nohostport", &c).ok());
  EXPECT_FALSE(ApplyKey("ingest.max_message_bytes", "10", &c).ok());
}

TEST(Config, LocalModePutsEverythingUnderTheDirectory) {
  const char* argv[] = {"opguardd", "--local", "/tmp/x/", "--log-level", "debug", "--http=127.0.0.1:0"};
  bool help = false;
  auto c = ParseCommandLine(6, argv, &help);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(help);
  EXPECT_EQ(c->data_dir, "/tmp/x/data");
  EXPECT_EQ(c->ingest, "ipc:///tmp/x/ingest.sock");
  EXPECT_EQ(c->listen, "ipc:///tmp/x/query.sock");
  EXPECT_EQ(c->http, "127.0.0.1:0");
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
}

TEST(Config, CommandLineErrors) {
  bool help = false;
  const char* missing[] = {"opguardd", "--data-dir"};
  EXPECT_FALSE(ParseCommandLine(2, missing, &help).ok());
  const char* unknown[] = {"opguardd", "--frobnicate", "1"};
  EXPECT_FALSE(ParseCommandLine(3, unknown, &help).ok());
  const char* no_file[] = {"opguardd", "--config", "/nonexistent/opguardd.conf"};
  EXPECT_FALSE(ParseCommandLine(3, no_file, &help).ok());
  const char* h[] = {"opguardd", "--help"};
  EXPECT_TRUE(ParseCommandLine(2, h, &help).ok());
  EXPECT_TRUE(help);
}

TEST(Config, HelpDocumentsEveryFlag) {
  const std::string help = HelpText();
  for (const char* flag : {"--config", "--local", "--data-dir", "--ingest", "--listen", "--http", "--peers",
                           "--log-level", "--retention.max-bytes", "--retention.max-age"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace opguard::daemon
