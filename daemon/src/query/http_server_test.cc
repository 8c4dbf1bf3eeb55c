#include "query/http_server.h"

#include <gtest/gtest.h>

namespace opguard::daemon {
namespace {

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

}  // namespace
}  // namespace opguard::daemon
