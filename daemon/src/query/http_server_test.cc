#include "query/http_server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "opguard/daemon/config.h"
#include "query/http_auth.h"
#include "query/web_files.h"

namespace opguard::daemon {
namespace {

namespace fs = std::filesystem;

// A bad percent escape is refused before any route runs (no service is
// needed to answer it), with a one-line reason.
TEST(HttpServer, BadPercentEscapesAreRefusedWith400) {
  for (const char* target :
       {"/api/runs%zz", "/api/runs/a%zz", "/api/runs/a%4", "/api/runs/a%", "/api/runs/a%00",
        "/nothing?x=%zz", "/api/diff?reference=a%g1&suspect=b", "/x?%00=1"}) {
    HttpResponse r = RouteHttp("GET", target, nullptr, nullptr, nullptr);
    EXPECT_EQ(r.status, 400) << target;
    EXPECT_NE(r.body.find("percent"), std::string::npos) << target << ": " << r.body;
    EXPECT_EQ(r.body.find('\n'), r.body.size() - 1) << target;
  }
  EXPECT_FALSE(IsAlignerRoute("/api/runs/a%zz/ranks"));
}

TEST(HttpServer, OnlyHostsThatNameTheDaemonAreAnswered) {
  const std::vector<std::string> names = {"node17", "viewer.internal"};
  for (const char* host : {"", "127.0.0.1", "127.0.0.1:7456", "10.1.2.3", "[::1]", "[::1]:7456", "localhost",
                           "LocalHost:7456", "localhost.", "app.localhost", "node17", "NODE17:80",
                           "viewer.internal.", "viewer.internal:7456"}) {
    EXPECT_TRUE(HostAllowed(host, names)) << host;
  }
  for (const char* host : {"evil.example", "evil.example:7456", "127.0.0.1.nip.io", "localhost.evil.example",
                           "node17.evil.example", "[::1", "[::1]x", "[evil]", "localhost:", "localhost:http",
                           "::1", "0x7f.1", "xlocalhost"}) {
    EXPECT_FALSE(HostAllowed(host, names)) << host;
  }
}

TEST(HttpServer, ListensOnLoopbackByDefault) {
  EXPECT_EQ(Config{}.http.rfind("127.0.0.1:", 0), 0u) << Config{}.http;
}

// Parameters are checked before any query runs: each bad one gets a 400
// naming it (no service is needed to answer).
TEST(HttpServer, BadParametersAreRefusedWith400) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"/api/alignment?reference=a&suspect=b&rank=x", "rank"},
      {"/api/alignment?reference=a&suspect=b&rank=-1", "rank"},
      {"/api/alignment?reference=a&suspect=b&rank=4294967296", "rank"},
      {"/api/alignment?reference=a&suspect=b", "rank="},
      {"/api/alignment?reference=a&rank=0", "suspect="},
      {"/api/alignment?reference=a&suspect=b&rank=0&count=0", "count"},
      {"/api/alignment?reference=a&suspect=b&rank=0&count=5001", "count"},
      {"/api/alignment?reference=a&suspect=b&rank=0&from=1e3", "from"},
      {"/api/alignment?reference=a&suspect=b&rank=0&from=", "from"},
      {"/api/alignment?reference=a&suspect=b&rank=0&op=99999999999999999999", "op"},
      {"/api/alignment?reference=a&suspect=b&rank=0&lane=0x1", "lane"},
      {"/api/alignment?reference=a&suspect=b&rank=0&sort=1", "unknown parameter 'sort'"},
      {"/api/runs/r/ranks/0/trace?count=0", "count"},
      {"/api/runs/r/ranks/0/trace?from=-5", "from"},
      {"/api/runs/r/ranks/0/trace?verbose", "unknown parameter 'verbose'"},
      {"/api/runs/r/ranks/0/lanes?x=1", "unknown parameter 'x'"},
      {"/api/runs?limit=5", "unknown parameter 'limit'"},
      {"/api/source?run=r", "file="},
      {"/api/source?file=a.py", "run="},
      {"/api/source?run=r&file=a.py&x=1", "unknown parameter 'x'"},
      {"/api/diff?reference=a&suspect=b&timeout=3601", "timeout"},
      {"/api/diff?reference=a", "suspect="},
      {"/metrics?x=1", "unknown parameter"},
  };
  for (const auto& [target, needle] : cases) {
    HttpResponse r = RouteHttp("GET", target, nullptr, nullptr, nullptr);
    EXPECT_EQ(r.status, 400) << target << ": " << r.body;
    EXPECT_NE(r.body.find(needle), std::string::npos) << target << ": " << r.body;
  }
  const std::string long_file(5000, 'a');
  EXPECT_EQ(
      RouteHttp("GET", "/api/source?run=r&file=" + long_file, nullptr, nullptr, nullptr).status,
      400);
  EXPECT_TRUE(IsAlignerRoute("/api/alignment?reference=a&suspect=b&rank=0"));
}

class WebRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("opguard-web-" + std::to_string(::getpid()));
    fs::create_directories(base_ / "web" / "sub");
    Write(base_ / "web" / "index.html", "<!doctype html>index");
    Write(base_ / "web" / "app.js", "export {};");
    Write(base_ / "web" / "sub" / "x.css", "a{}");
    Write(base_ / "web" / ".hidden", "hidden");
    Write(base_ / "secret.txt", "SECRET");
    fs::create_symlink(base_ / "secret.txt", base_ / "web" / "link.txt");
    fs::create_directory_symlink(base_, base_ / "web" / "up");
    root_ = (base_ / "web").string();
  }
  void TearDown() override { fs::remove_all(base_); }
  static void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  HttpResponse Get(const std::string& target) {
    return RouteHttp("GET", target, nullptr, nullptr, nullptr, root_);
  }

  fs::path base_;
  std::string root_;
};

TEST_F(WebRoot, ServesTheViewerAndItsFiles) {
  for (const char* page : {"/", "/diff?reference=a&suspect=b&rank=1&op=5", "/run?name=x"}) {
    auto r = Get(page);
    EXPECT_EQ(r.status, 200) << page;
    EXPECT_EQ(r.body, "<!doctype html>index") << page;
    EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
  }
  auto js = Get("/app.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(Get("/sub/x.css").body, "a{}");
  EXPECT_EQ(Get("/missing.js").status, 404);
  EXPECT_EQ(Get("/sub").status, 404);  // a directory is not a file
  // Without a web root the pages say how to get one.
  auto none = RouteHttp("GET", "/", nullptr, nullptr, nullptr, "");
  EXPECT_EQ(none.status, 404);
  EXPECT_NE(none.body.find("--web-root"), std::string::npos);
}

// Nothing outside the root is ever served, however the path is spelled:
// dot segments (plain or percent-encoded), encoded separators, NUL, hidden
// files, and symlinks that lead out of the root.
TEST_F(WebRoot, NoPathLeavesTheRoot) {
  for (const char* target :
       {"/../secret.txt", "/sub/../../secret.txt", "/%2e%2e/secret.txt", "/%2E%2E/secret.txt",
        "/..%2fsecret.txt", "/sub%2f..%2f..%2fsecret.txt", "/%2e%2e%2fsecret.txt",
        "/..%5csecret.txt", "/./index.html", "/.hidden", "/%2ehidden", "/sub/%00",
        "/index.html%00.js", "/link.txt", "/up/secret.txt", "/up/web/../secret.txt", "//etc/passwd",
        "/%2fetc%2fpasswd"}) {
    auto r = Get(target);
    EXPECT_TRUE(r.status == 400 || r.status == 404) << target << ": " << r.status;
    EXPECT_EQ(r.body.find("SECRET"), std::string::npos) << target;
    EXPECT_EQ(r.body.find("hidden\""), std::string::npos) << target;
  }
  EXPECT_FALSE(ReadWebFile(root_, {".."}));
  EXPECT_FALSE(ReadWebFile(root_, {"sub", "..", "..", "secret.txt"}));
  EXPECT_FALSE(ReadWebFile(root_, {std::string("a\0b", 3)}));
  EXPECT_TRUE(ReadWebFile(root_, {"sub", "x.css"}));
}

TEST_F(WebRoot, FindsAConfiguredRootOnlyWithAnIndex) {
  EXPECT_EQ(FindWebRoot(root_), root_);
  EXPECT_EQ(FindWebRoot((base_ / "web" / "sub").string()), "");
  // Unconfigured, a build finds the source tree's viewer.
  EXPECT_TRUE(fs::exists(fs::path(FindWebRoot("")) / "app.js")) << FindWebRoot("");
}

}  // namespace
}  // namespace opguard::daemon
