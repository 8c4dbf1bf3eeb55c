#include "access/access.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.hpp>

#include <filesystem>
#include <fstream>

#include "opguard/daemon/config.h"
#include "opguard/daemon/curve_keys.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "query/http_auth.h"

namespace opguard::daemon {
namespace {

TEST(Access, LoopbackEndpoints) {
  for (const char* e : {"tcp://127.0.0.1:7455", "tcp://127.1.2.3:1", "tcp://localhost:7455", "tcp://[::1]:7455",
                        "127.0.0.1:7456", "127.0.0.1:0", "localhost:80"}) {
    EXPECT_TRUE(IsLoopbackEndpoint(e)) << e;
  }
  for (const char* e : {"tcp://0.0.0.0:7455", "tcp://*:7455", "tcp://eth0:7455", "tcp://10.0.0.1:7455",
                        "tcp://127.0.0.1.example.com:1", "0.0.0.0:7456", "[::]:7456", "node7:7456"}) {
    EXPECT_FALSE(IsLoopbackEndpoint(e)) << e;
  }
}

// The uid comes from the kernel through ZeroMQ on ipc://, and only there.
TEST(Access, UnixPeerUidIsTheSendersUid) {
  testing::TempDir dir;
  zmq::context_t context(1);
  for (const std::string& endpoint : {"ipc://" + dir.path() + "/s.sock", std::string("tcp://127.0.0.1:*")}) {
    zmq::socket_t server(context, zmq::socket_type::router);
    server.set(zmq::sockopt::linger, 0);
    server.bind(endpoint);
    zmq::socket_t client(context, zmq::socket_type::dealer);
    client.set(zmq::sockopt::linger, 0);
    client.connect(server.get(zmq::sockopt::last_endpoint));
    client.send(zmq::str_buffer("hello"), zmq::send_flags::none);
    zmq::message_t id, payload;
    server.set(zmq::sockopt::rcvtimeo, 5000);
    ASSERT_TRUE(server.recv(id));
    ASSERT_TRUE(server.recv(payload));
    const auto uid = UnixPeerUid(payload);
    if (IsUnixEndpoint(endpoint)) {
      ASSERT_TRUE(uid.has_value());
      EXPECT_EQ(*uid, ::geteuid());
    } else {
      EXPECT_FALSE(uid.has_value()) << *uid;
    }
  }
}

TEST(Access, AdminPolicy) {
  AdminPolicy policy("opguard-test-no-such-group");
  EXPECT_TRUE(policy.MayChange(0, 1234));                                   // root
  EXPECT_TRUE(policy.MayChange(::geteuid(), 1234));                         // the daemon's user
  EXPECT_TRUE(policy.MayChange(40001, 40001));                              // the owner
  EXPECT_EQ(policy.MayChange(40002, 40001), ::geteuid() == 40002);          // someone else
  EXPECT_EQ(policy.MayChange(40002, kUnknownOwner), ::geteuid() == 40002);  // nobody owns it
}

TEST(HttpToken, OnlyOffLoopbackAndOnlyTheRightToken) {
  const std::string token = "abcdef0123456789abcdef";
  EXPECT_TRUE(CheckHttpToken("", false, "", "", "/api/runs").allowed);     // no token configured
  EXPECT_TRUE(CheckHttpToken(token, true, "", "", "/api/runs").allowed);   // loopback
  EXPECT_FALSE(CheckHttpToken(token, false, "", "", "/api/runs").allowed);
  EXPECT_FALSE(CheckHttpToken(token, false, "Bearer abcdef0123456789abcdeX", "", "/").allowed);
  EXPECT_FALSE(CheckHttpToken(token, false, "Bearer " + token + "x", "", "/").allowed);
  EXPECT_FALSE(CheckHttpToken(token, false, "Basic " + token, "", "/").allowed);
  EXPECT_TRUE(CheckHttpToken(token, false, "Bearer " + token, "", "/").allowed);
  EXPECT_TRUE(CheckHttpToken(token, false, "", "theme=dark; opguard_token=" + token, "/").allowed);
  EXPECT_FALSE(CheckHttpToken(token, false, "", "xopguard_token=" + token, "/").allowed);
  const auto url = CheckHttpToken(token, false, "", "", "/diff?a=1&token=" + token);
  EXPECT_TRUE(url.allowed);
  EXPECT_TRUE(url.set_cookie);
  EXPECT_FALSE(CheckHttpToken(token, false, "", "", "/diff?xtoken=" + token).allowed);
  EXPECT_FALSE(CheckHttpToken(token, false, "", "", "/token=" + token).allowed);
  EXPECT_EQ(TokenCookie(token).rfind("opguard_token=" + token + ";", 0), 0u);
  EXPECT_TRUE(IsValidToken(token));
  EXPECT_FALSE(IsValidToken("has space"));
  EXPECT_FALSE(IsValidToken("semi;colon"));
}

TEST(CurveKeys, KeygenFilesRoundTrip) {
  testing::TempDir dir;
  auto keys = GenerateKeyPair();
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  EXPECT_EQ(keys->public_key.size(), 40u);
  const std::string base = dir.path() + "/sub/node";
  ASSERT_TRUE(WriteKeyPair(base, *keys, "me@here", false).ok());
  struct stat st {};
  ASSERT_EQ(::stat((base + ".key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((base + ".pub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(WriteKeyPair(base, *keys, "", false).ok()) << "replaced an existing keypair";
  auto read = ReadKeyPair(base + ".key");
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->public_key, keys->public_key);
  EXPECT_EQ(read->secret_key, keys->secret_key);
  EXPECT_EQ(*ReadPublicKey(base + ".pub"), keys->public_key);
  EXPECT_EQ(*ReadPublicKey(base + ".key"), keys->public_key);
  EXPECT_EQ(*ReadPublicKey(keys->public_key), keys->public_key);
  EXPECT_FALSE(ReadPublicKey("not-a-key").ok());
  // A keypair whose halves do not belong together.
  auto other = GenerateKeyPair();
  std::ofstream(dir.path() + "/mixed.key") << "public-key = " << other->public_key << "\nsecret-key = "
                                           << keys->secret_key << "\n";
  EXPECT_FALSE(ReadKeyPair(dir.path() + "/mixed.key").ok());
  // authorized_keys: .pub lines, comments and blank lines; a bad line is an error.
  std::ofstream(dir.path() + "/authorized_keys") << "# users\n\n"
                                                 << keys->public_key << " me@here\n"
                                                 << other->public_key << "\n";
  auto allowed = ReadAuthorizedKeys(dir.path() + "/authorized_keys");
  ASSERT_TRUE(allowed.ok()) << allowed.status().message();
  EXPECT_EQ(*allowed, (std::vector<std::string>{keys->public_key, other->public_key}));
  std::ofstream(dir.path() + "/bad_keys") << keys->public_key << "\nnot-a-key\n";
  auto bad = ReadAuthorizedKeys(dir.path() + "/bad_keys");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad_keys:2"), std::string::npos) << bad.status().message();
}

Result<Config> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), {"opguardd", "--local", "/tmp/og"});
  bool help = false;
  return ParseCommandLine(static_cast<int>(args.size()), args.data(), &help);
}

TEST(Config, NothingOffLoopbackWithoutCredentials) {
  auto open = Parse({"--listen", "tcp://0.0.0.0:7455"});
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("refusing to listen on tcp://0.0.0.0:7455 without CURVE keys"),
            std::string::npos)
      << open.status().message();
  EXPECT_TRUE(Parse({"--listen", "tcp://0.0.0.0:7455", "--curve.key-file", "/k", "--curve.authorized-keys", "/a"}).ok());
  EXPECT_TRUE(Parse({"--listen", "tcp://127.0.0.1:7455"}).ok());
  EXPECT_FALSE(Parse({"--listen", "udp://127.0.0.1:7455"}).ok());
  auto http = Parse({"--http", "0.0.0.0:7456"});
  ASSERT_FALSE(http.ok());
  EXPECT_NE(http.status().message().find("without a token"), std::string::npos) << http.status().message();
  EXPECT_TRUE(Parse({"--http", "0.0.0.0:7456", "--http.token-file", "/t"}).ok());
  EXPECT_FALSE(Parse({"--query-socket", "tcp://127.0.0.1:1"}).ok());
  EXPECT_FALSE(Parse({"--ingest", "tcp://0.0.0.0:7457"}).ok());
  EXPECT_TRUE(Parse({"--ingest", "tcp://127.0.0.1:7457"}).ok());
  // Local mode: the query socket is the listen endpoint, no group.
  auto local = Parse({});
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->query_socket, "ipc:///tmp/og/query.sock");
  EXPECT_EQ(local->socket_group, "");
  EXPECT_EQ(Config{}.socket_group, "opguard");
  EXPECT_EQ(Config{}.ingest_socket_mode, 0660u);
}

}  // namespace
}  // namespace opguard::daemon
