#include "query/explain.h"

#include <gtest/gtest.h>

namespace opguard::daemon {
namespace {

TEST(ChatEndpoint, UrlsSplitIntoSchemeHostPortAndPath) {
  auto e = ParseChatEndpoint("https://api.example.com/v1/chat/completions");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->tls);
  EXPECT_EQ(e->host, "api.example.com");
  EXPECT_EQ(e->port, "443");
  EXPECT_EQ(e->target, "/v1/chat/completions");
  e = ParseChatEndpoint("http://127.0.0.1:8000");
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->tls);
  EXPECT_EQ(e->port, "8000");
  EXPECT_EQ(e->target, "/v1/chat/completions");
  e = ParseChatEndpoint("http://[::1]:9000/x");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, "9000");
  for (const char* bad : {"ftp://h/x", "http://", "http://h:8x/", "https://user:pw@h/v1"}) {
    EXPECT_FALSE(ParseChatEndpoint(bad).ok()) << bad;
  }
}

TEST(SourceExcerpt, NumbersTheLinesAroundThePivotAndMarksIt) {
  std::string text;
  for (int i = 1; i <= 40; ++i) text += "line " + std::to_string(i) + "\n";
  const std::string e = SourceExcerpt(text, 20, 2);
  EXPECT_EQ(e, "    18  line 18\n    19  line 19\n>   20  line 20\n    21  line 21\n    22  line 22\n");
  EXPECT_EQ(SourceExcerpt(text, 1, 1), ">    1  line 1\n     2  line 2\n");
}

TEST(ExplainPrompt, LeavesOutPerRankDetailAndTimingsAndIsStable) {
  nlohmann::json report = {{"status", "diverged"}, {"first_divergence", {{"op", "aten::mm"}}},
                           {"ranks", nlohmann::json::array({1, 2})}, {"nodes", {{{"seconds", 0.25}}}}};
  const std::string a = ExplainPrompt(report, "> 5 x = y\n", "", {{"ref", {{"world_size", 2}}}});
  EXPECT_NE(a.find("aten::mm"), std::string::npos);
  EXPECT_NE(a.find("> 5 x = y"), std::string::npos);
  EXPECT_NE(a.find("(not sent)"), std::string::npos);
  EXPECT_EQ(a.find("\"ranks\""), std::string::npos);
  EXPECT_EQ(a.find("seconds"), std::string::npos);
  report["nodes"][0]["seconds"] = 9.5;
  EXPECT_EQ(ExplainPrompt(report, "> 5 x = y\n", "", {{"ref", {{"world_size", 2}}}}), a);
}

}  // namespace
}  // namespace opguard::daemon
