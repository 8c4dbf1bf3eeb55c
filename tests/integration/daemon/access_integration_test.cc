// Who may do what, against a real opguardd (docs/operations.md): group-owned
// sockets and runtime dir, a private data dir, runs owned by the uid that
// created them (SO_PEERCRED through ZeroMQ), `opguard rm` only by the owner,
// root or the admin group and only on the unix query socket, CURVE with
// `opguard keygen` keys on TCP (clients and peer daemons), nothing bound off
// loopback without credentials, and the HTTP token off loopback.
//
// The cases that act as other users fork a child that drops to another uid;
// they need root and are skipped without it. OPGUARDD_UNDER_TEST=PATH runs
// these against another opguardd build.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <grp.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>

#include "opguard/daemon/testing/batch_maker.h"

namespace opguard::daemon {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using testing::BatchOptions;
using testing::DaemonProcess;

std::string Opguardd() {
  const char* other = std::getenv("OPGUARDD_UNDER_TEST");
  return other != nullptr && *other != '\0' ? other : OPGUARDD_PATH;
}

// Uids no account uses: the kernel knows them, the login database does not.
constexpr uid_t kAlice = 40001;
constexpr uid_t kMallory = 40002;

mode_t Mode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
}

gid_t Group(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_gid : static_cast<gid_t>(-1);
}

std::optional<gid_t> GroupId(const char* name) {
  const group* g = ::getgrnam(name);
  return g ? std::optional<gid_t>(g->gr_gid) : std::nullopt;
}

// Runs `fn` in a child process as `uid` (primary group `gid`, plus
// `groups`); returns {exit code, what fn returned as text}.
std::pair<int, std::string> AsUser(uid_t uid, gid_t gid, std::vector<gid_t> groups,
                                   const std::function<std::pair<int, std::string>()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      _exit(120);
    }
    auto [code, text] = fn();
    (void)!::write(fds[1], text.data(), text.size());
    ::close(fds[1]);
    _exit(code);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// What the ingest socket answers `frame` sent as `uid`.
std::string AckAs(uid_t uid, const DaemonProcess& d, const std::string& frame) {
  return AsUser(uid, uid, {}, [&] {
           auto reply = testing::SendRaw(d.ingest(), frame, 5s);
           return std::make_pair(0, reply.ok() ? testing::DescribeAck(*reply)
                                               : "no ack: " + reply.status().message());
         }).second;
}

// `opguard ARGS` run as `uid`: {exit code, output}.
std::pair<int, std::string> CliAs(uid_t uid, const std::string& args) {
  return AsUser(uid, uid, {}, [&] {
    auto r = testing::RunCommand(std::string(OPGUARD_CLI_PATH) + " " + args, 60);
    return std::make_pair(r.exit_code, r.output);
  });
}

testing::CommandResult Cli(const std::string& args, int timeout_s = 60) {
  return testing::RunCommand(std::string(OPGUARD_CLI_PATH) + " " + args, timeout_s);
}

// A TCP port nothing listens on now.
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// An IPv4 address of this machine that is not loopback, or "".
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    found = ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
  }
  ::freeifaddrs(list);
  return found;
}

// The status of a GET from local address `from` to `to` (HOST:PORT), with
// extra header lines; *headers gets the response's headers.
int HttpStatus(const std::string& from, const std::string& to, const std::string& target,
               const std::string& headers = "", std::string* response_headers = nullptr) {
  auto r = testing::HttpGet(to, target, 10s, headers, from);
  if (!r.ok()) return -1;
  if (response_headers) *response_headers = r->headers;
  return r->status;
}

class AccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Other uids must reach the sockets inside the temp dir (the data dir
    // in it stays 0700).
    ::chmod(dir_.path().c_str(), 0755);
  }

  std::unique_ptr<DaemonProcess> StartDaemon(std::vector<std::string> args = {},
                                             const testing::TempDir* dir = nullptr) {
    auto d = std::make_unique<DaemonProcess>(Opguardd(), (dir ? dir : &dir_)->path(), std::move(args));
    Status st = d->Start();
    EXPECT_TRUE(st.ok()) << st.message() << "\n" << Log(*d);
    return d;
  }

  static std::string Log(const DaemonProcess& d) {
    std::ifstream in(d.log_path());
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  static double Metric(DaemonProcess& d, const std::string& name_and_labels) {
    auto metrics = testing::HttpGet(d.http(), "/metrics");
    if (!metrics.ok()) return -1;
    auto pos = metrics->body.find("\n" + name_and_labels + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(metrics->body.substr(pos + name_and_labels.size() + 2));
  }

  static bool HasRun(DaemonProcess& d, const std::string& run) {
    auto r = testing::HttpGet(d.http(), "/api/runs/" + run);
    return r.ok() && r->status == 200;
  }

  static void SkipUnlessRoot() {
    if (::geteuid() != 0) GTEST_SKIP() << "acting as other uids needs root";
  }

  // opguard keygen BASE; both files must come out 0600.
  void Keygen(const std::string& base) {
    auto r = Cli("keygen " + base);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Mode(base + ".key"), 0600u) << base;
    EXPECT_EQ(Mode(base + ".pub"), 0600u) << base;
  }

  testing::TempDir dir_;
};

BatchOptions Announce() {
  BatchOptions o;
  o.announce = o.definitions = true;
  o.world_size = 4;
  return o;
}

// The ingest socket, the query socket and a runtime dir the daemon creates
// belong to socket_group and are not open to everyone.
TEST_F(AccessTest, SocketsAndRuntimeDirAreGroupOwned) {
  const auto users = GroupId("users");
  if (!users) GTEST_SKIP() << "no 'users' group on this machine";
  const std::string run_dir = dir_.path() + "/run";
  auto d = StartDaemon({"--socket-group", "users", "--ingest", "ipc://" + run_dir + "/ingest.sock"});
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(Mode(run_dir + "/ingest.sock"), 0660u);
  EXPECT_EQ(Group(run_dir + "/ingest.sock"), *users);
  EXPECT_EQ(Mode(run_dir), 0750u);
  EXPECT_EQ(Group(run_dir), *users);
  EXPECT_EQ(Mode(dir_.path() + "/query.sock"), 0660u);
  EXPECT_EQ(Group(dir_.path() + "/query.sock"), *users);
  if (::geteuid() == 0) {
    // A member of the group sends; anyone else cannot even connect.
    const std::string ingest = "ipc://" + run_dir + "/ingest.sock";
    auto send = [&ingest](uint32_t seq) {
      return [&ingest, seq] {
        auto reply = testing::SendRaw(ingest, testing::MakeBatch("grp", 0, 1, seq, seq * 10, 10, Announce()), 3s);
        return std::make_pair(0, reply.ok() ? testing::DescribeAck(*reply) : "no ack");
      };
    };
    EXPECT_EQ(AsUser(kAlice, kAlice, {*users}, send(0)).second, "durable");
    EXPECT_EQ(AsUser(kMallory, kMallory, {}, send(1)).second, "no ack");
  }
  EXPECT_EQ(d->Stop(), 0);
}

// Without the group the daemon says so once and keeps the sockets to its
// own user and group.
TEST_F(AccessTest, AMissingGroupIsAWarningAndTheSocketStaysPrivate) {
  auto d = StartDaemon({"--socket-group", "opguard-test-no-such-group"});
  ASSERT_TRUE(d->Running());
  EXPECT_NE(Log(*d).find("group 'opguard-test-no-such-group' does not exist"), std::string::npos) << Log(*d);
  EXPECT_EQ(Mode(dir_.path() + "/ingest.sock"), 0660u);
  EXPECT_EQ(Group(dir_.path() + "/ingest.sock"), ::getegid());
  EXPECT_EQ(d->Stop(), 0);
}

// --local data is the user's alone: the data dir 0700, RocksDB's files 0600.
TEST_F(AccessTest, LocalDataIsNotWorldReadable) {
  ::mkdir((dir_.path() + "/data").c_str(), 0755);  // made readable beforehand
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  ASSERT_EQ(testing::SendRaw(d->ingest(), testing::MakeBatch("private", 0, 1, 0, 0, 10, Announce()), 10s).ok(),
            true);
  EXPECT_EQ(d->Stop(), 0);
  EXPECT_EQ(Mode(d->data_dir()) & 077, 0u) << std::oct << Mode(d->data_dir());
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(d->data_dir())) {
    if (!f.is_regular_file()) continue;
    ++files;
    EXPECT_EQ(Mode(f.path().string()) & 077, 0u) << f.path() << " mode " << std::oct << Mode(f.path().string());
  }
  EXPECT_GT(files, 0);
}

// A run belongs to the uid whose batch created it: another uid's batches
// into it are refused (reason "owner"), also after a restart.
TEST_F(AccessTest, ARunBelongsToTheUidThatCreatedIt) {
  SkipUnlessRoot();
  const std::vector<std::string> open = {"--ingest.socket-mode", "0666", "--query.socket-mode", "0666"};
  auto d = StartDaemon(open);
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(AckAs(kAlice, *d, testing::MakeBatch("alice-run", 0, 1, 0, 0, 10, Announce())), "durable");
  // Mallory's fake rank and her overwrite of rank 0 both bounce.
  const std::string fake = AckAs(kMallory, *d, testing::MakeBatch("alice-run", 1, 9, 0, 0, 10, Announce()));
  EXPECT_EQ(fake.rfind("rejected: ", 0), 0u) << fake;
  EXPECT_NE(fake.find("belongs to uid " + std::to_string(kAlice)), std::string::npos) << fake;
  const std::string overwrite = AckAs(kMallory, *d, testing::MakeBatch("alice-run", 0, 1, 1, 10, 10, {}));
  EXPECT_EQ(overwrite.rfind("rejected: ", 0), 0u) << overwrite;
  EXPECT_EQ(Metric(*d, "opguard_batches_rejected_total{reason=\"owner\"}"), 2);
  // Mallory's own run is hers; Alice keeps writing into hers.
  EXPECT_EQ(AckAs(kMallory, *d, testing::MakeBatch("mallory-run", 0, 1, 0, 0, 10, Announce())), "durable");
  EXPECT_EQ(AckAs(kAlice, *d, testing::MakeBatch("alice-run", 0, 1, 1, 10, 10, {})), "durable");
  auto run = testing::HttpGet(d->http(), "/api/runs/alice-run");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(json::parse(run->body)["ranks"].size(), 1u) << run->body;
  // The owner is stored with the run.
  EXPECT_EQ(d->Stop(), 0);
  d = StartDaemon(open);
  ASSERT_TRUE(d->Running());
  const std::string after = AckAs(kMallory, *d, testing::MakeBatch("alice-run", 2, 9, 0, 0, 10, Announce()));
  EXPECT_EQ(after.rfind("rejected: ", 0), 0u) << after;
  EXPECT_EQ(AckAs(kAlice, *d, testing::MakeBatch("alice-run", 0, 1, 2, 20, 10, {})), "durable");
  EXPECT_EQ(d->Stop(), 0);
}

// `opguard rm` removes a run only for its owner, root or the admin group,
// and only through the unix query socket.
TEST_F(AccessTest, RmOnlyByTheOwnerRootOrAdminsAndOnlyOnTheUnixSocket) {
  SkipUnlessRoot();
  const passwd* nobody = ::getpwnam("nobody");
  if (nobody == nullptr) GTEST_SKIP() << "no 'nobody' account";
  const group* admins = ::getgrgid(nobody->pw_gid);  // nobody's own group: it is a member
  ASSERT_NE(admins, nullptr);
  const int port = FreePort();
  const std::string tcp = "tcp://127.0.0.1:" + std::to_string(port);
  auto d = StartDaemon({"--ingest.socket-mode", "0666", "--query.socket-mode", "0666", "--listen", tcp,
                        "--admin-group", admins->gr_name});
  ASSERT_TRUE(d->Running()) << Log(*d);
  for (const char* run : {"a1", "a2", "a3", "a4"}) {
    ASSERT_EQ(AckAs(kAlice, *d, testing::MakeBatch(run, 0, 1, 0, 0, 10, Announce())), "durable");
  }
  const std::string unix_socket = " --daemon " + d->query();
  // Not hers: refused, the run stays.
  auto [rc, out] = CliAs(kMallory, "rm a1" + unix_socket);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("permission denied"), std::string::npos) << out;
  EXPECT_TRUE(HasRun(*d, "a1"));
  // Over TCP not even root may.
  auto over_tcp = Cli("rm a1 --daemon " + tcp);
  EXPECT_EQ(over_tcp.exit_code, 2) << over_tcp.output;
  EXPECT_NE(over_tcp.output.find("unix query socket"), std::string::npos) << over_tcp.output;
  EXPECT_TRUE(HasRun(*d, "a1"));
  EXPECT_EQ(Metric(*d, "opguard_queries_denied_total"), 2);
  // The owner, root and an admin may.
  auto [rc1, out1] = CliAs(kAlice, "rm a1" + unix_socket);
  EXPECT_EQ(rc1, 0) << out1;
  EXPECT_FALSE(HasRun(*d, "a1"));
  auto by_root = Cli("rm a2" + unix_socket);
  EXPECT_EQ(by_root.exit_code, 0) << by_root.output;
  auto [rc3, out3] = CliAs(nobody->pw_uid, "rm a3" + unix_socket);
  EXPECT_EQ(rc3, 0) << out3;
  EXPECT_TRUE(HasRun(*d, "a4"));
  // Reading stays open to every caller of the socket.
  auto [rc4, out4] = CliAs(kMallory, "runs" + unix_socket);
  EXPECT_EQ(rc4, 0) << out4;
  EXPECT_NE(out4.find("a4"), std::string::npos) << out4;
  EXPECT_EQ(d->Stop(), 0);
}

// A query endpoint off loopback, or HTTP off loopback, without credentials
// is refused at start with one line.
TEST_F(AccessTest, NoNetworkEndpointWithoutCredentials) {
  const std::string any = "tcp://0.0.0.0:" + std::to_string(FreePort());
  auto r = testing::RunCommand(Opguardd() + " --local " + dir_.path() + " --http off --listen " + any, 20);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("refusing to listen on " + any + " without CURVE keys"), std::string::npos)
      << r.output;
  auto h = testing::RunCommand(Opguardd() + " --local " + dir_.path() + " --http 0.0.0.0:0", 20);
  EXPECT_EQ(h.exit_code, 2) << h.output;
  EXPECT_NE(h.output.find("without a token"), std::string::npos) << h.output;
}

// With keys, TCP queries need CURVE and a key from curve.authorized_keys,
// on loopback too.
TEST_F(AccessTest, TcpQueriesNeedAnAuthorizedCurveKey) {
  const std::string k = dir_.path() + "/keys";
  Keygen(k + "/server");
  Keygen(k + "/client");
  Keygen(k + "/stranger");
  EXPECT_NE(Cli("keygen " + k + "/client").exit_code, 0) << "keygen replaced a keypair";
  std::filesystem::copy_file(k + "/client.pub", k + "/authorized_keys");
  const std::string tcp = "tcp://127.0.0.1:" + std::to_string(FreePort());
  auto d = StartDaemon({"--listen", tcp, "--curve.key-file", k + "/server.key", "--curve.authorized-keys",
                        k + "/authorized_keys"});
  ASSERT_TRUE(d->Running());
  const std::string status = "status --timeout 3 --daemon " + tcp;
  auto ok = Cli(status + " --key " + k + "/client.key --server-key " + k + "/server.pub");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("opguardd"), std::string::npos) << ok.output;
  auto by_env = testing::RunCommand("OPGUARD_DAEMON=" + tcp + " OPGUARD_KEY=" + k + "/client.key OPGUARD_SERVER_KEY=" +
                                    k + "/server.pub " + OPGUARD_CLI_PATH + " status --timeout 3");
  EXPECT_EQ(by_env.exit_code, 0) << by_env.output;
  auto plain = Cli(status);
  EXPECT_EQ(plain.exit_code, 2) << plain.output;
  auto stranger = Cli(status + " --key " + k + "/stranger.key --server-key " + k + "/server.pub");
  EXPECT_EQ(stranger.exit_code, 2) << stranger.output;
  EXPECT_GE(Metric(*d, "opguard_curve_denied_total"), 1);
  // The unix socket needs no key.
  auto local = Cli("status --timeout 3 --daemon " + d->query());
  EXPECT_EQ(local.exit_code, 0) << local.output;
  EXPECT_EQ(d->Stop(), 0);
}

// Peer daemons of a cluster share the daemon keypair: a peer's answer comes
// through CURVE, and a daemon without the key cannot answer for a peer.
TEST_F(AccessTest, PeersAuthenticateWithTheClusterKey) {
  const std::string k = dir_.path() + "/keys";
  Keygen(k + "/cluster");
  Keygen(k + "/impostor");
  Keygen(k + "/client");
  std::filesystem::copy_file(k + "/client.pub", k + "/authorized_keys");
  testing::TempDir dir_b, dir_c;
  const std::string tcp_b = "tcp://127.0.0.1:" + std::to_string(FreePort());
  const std::string tcp_c = "tcp://127.0.0.1:" + std::to_string(FreePort());
  auto node = [&](const std::string& listen, const std::string& key, std::vector<std::string> more,
                  const testing::TempDir* dir) {
    std::vector<std::string> args = {"--listen", listen, "--curve.key-file", key, "--curve.authorized-keys",
                                     k + "/authorized_keys"};
    args.insert(args.end(), more.begin(), more.end());
    return StartDaemon(args, dir);
  };
  auto b = node(tcp_b, k + "/cluster.key", {}, &dir_b);
  auto c = node(tcp_c, k + "/impostor.key", {}, &dir_c);
  const std::string tcp_a = "tcp://127.0.0.1:" + std::to_string(FreePort());
  auto a = node(tcp_a, k + "/cluster.key", {"--peers", tcp_b + "," + tcp_c}, nullptr);
  ASSERT_TRUE(a->Running() && b->Running() && c->Running());
  BatchOptions o = Announce();
  o.collectives_every = 5;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    DaemonProcess& to = rank < 2 ? *a : (rank == 2 ? *b : *c);
    auto reply = testing::SendRaw(to.ingest(), testing::MakeBatch("spread", rank, 1, 0, 0, 20, o), 10s);
    ASSERT_TRUE(reply.ok() && testing::DescribeAck(*reply) == "durable");
  }
  auto r = Cli("collectives spread --json --timeout 8 --daemon " + tcp_a + " --key " + k + "/client.key --server-key " +
               k + "/cluster.pub");
  const auto brace = r.output.find('{');
  ASSERT_NE(brace, std::string::npos) << r.output;
  const json j = json::parse(r.output.substr(brace), nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.output;
  std::map<std::string, bool> answered;
  for (const auto& n : j["nodes"]) answered[n["endpoint"].get<std::string>()] = n["answered"].get<bool>();
  EXPECT_TRUE(answered[tcp_b]) << r.output;
  EXPECT_FALSE(answered[tcp_c]) << r.output;
}

// HTTP bound off loopback answers a client off loopback only with the
// token (header, cookie, or once in the URL, which sets the cookie); loopback
// clients, the viewer among them, need none.
TEST_F(AccessTest, HttpOffLoopbackNeedsTheToken) {
  const std::string address = NonLoopbackAddress();
  if (address.empty()) GTEST_SKIP() << "no non-loopback IPv4 address on this machine";
  const std::string token = "t0ken-for-the-access-test-0123456789";
  const std::string token_file = dir_.path() + "/http.token";
  std::ofstream(token_file) << token << "\n";
  auto d = StartDaemon({"--http", "0.0.0.0:0", "--http.token-file", token_file});
  ASSERT_TRUE(d->Running());
  const std::string port = d->http().substr(d->http().rfind(':') + 1);
  const std::string remote = address + ":" + port;
  const std::string loopback = "127.0.0.1:" + port;
  EXPECT_EQ(HttpStatus("127.0.0.1", loopback, "/api/runs"), 200);
  EXPECT_EQ(HttpStatus("127.0.0.1", loopback, "/"), 200);  // the viewer
  EXPECT_EQ(HttpStatus(address, remote, "/api/runs"), 401);
  EXPECT_EQ(HttpStatus(address, remote, "/api/runs", "Authorization: Bearer wrong\r\n"), 401);
  EXPECT_EQ(HttpStatus(address, remote, "/api/runs", "Authorization: Bearer " + token + "\r\n"), 200);
  std::string headers;
  EXPECT_EQ(HttpStatus(address, remote, "/?token=" + token, "", &headers), 200);
  EXPECT_NE(headers.find("opguard_token=" + token), std::string::npos) << headers;
  EXPECT_EQ(HttpStatus(address, remote, "/api/status", "Cookie: opguard_token=" + token + "\r\n"), 200);
  EXPECT_EQ(Metric(*d, "opguard_http_unauthorized_total"), 2);
  EXPECT_EQ(d->Stop(), 0);
}

}  // namespace
}  // namespace opguard::daemon
