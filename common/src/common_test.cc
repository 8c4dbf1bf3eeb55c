#include <gtest/gtest.h>

#include "opguard/common/hex.h"
#include "opguard/common/log.h"
#include "opguard/common/spdlog_sink.h"
#include "opguard/common/status.h"
#include "opguard/common/utf8.h"

namespace opguard {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  OPGUARD_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(Status, PropagatesFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().ToString(), "invalid argument: odd: 3");
}

TEST(Hex, RoundTripsAndRejectsBadDigits) {
  const uint8_t in[3] = {0x00, 0xab, 0xff};
  EXPECT_EQ(ToHex(in, 3), "00abff");
  uint8_t out[3];
  ASSERT_TRUE(FromHex("00ABff", out, 3));
  EXPECT_EQ(0, memcmp(in, out, 3));
  EXPECT_FALSE(FromHex("00abf", out, 3));
  EXPECT_FALSE(FromHex("00abfg", out, 3));
}

TEST(Utf8, AcceptsWellFormedAndRefusesTheRest) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("aten::linear"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("run\xff"));             // never valid
  EXPECT_FALSE(IsValidUtf8("caf\xe9"));             // Latin-1
  EXPECT_FALSE(IsValidUtf8("\xc3"));                // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));            // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));        // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));    // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x28\xa1"));        // bad continuation
}

TEST(Log, ParsesLevels) {
  LogLevel level;
  EXPECT_TRUE(ParseLogLevel("warn", &level));
  EXPECT_EQ(level, LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
}

TEST(Log, PlainLinesByDefaultTimestampedThroughSpdlog) {
  SetLogLevel(LogLevel::kInfo);
  testing::internal::CaptureStderr();
  OPGUARD_LOG(LogLevel::kWarn, "plain");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "opguard warning: plain\n");

  LogThroughSpdlog("opguard-test");
  testing::internal::CaptureStderr();
  OPGUARD_LOG(LogLevel::kDebug, "filtered out");
  OPGUARD_LOG(LogLevel::kError, "through spdlog");
  const std::string line = testing::internal::GetCapturedStderr();
  SetLogSink(nullptr);
  // "2026-12-01T15:40:00.123 opguard-test error: through spdlog"
  ASSERT_GT(line.size(), 24u) << line;
  EXPECT_EQ(line[4], '-') << line;
  EXPECT_EQ(line[10], 'T') << line;
  EXPECT_EQ(line.substr(23), " opguard-test error: through spdlog\n");
}

}  // namespace
}  // namespace opguard
