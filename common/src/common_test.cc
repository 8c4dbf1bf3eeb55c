#include <gtest/gtest.h>

#include <thread>

#include "opguard/common/cancel.h"
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

TEST(CancelToken, StopsOnCancelBudgetOrProcessFlagAndKeepsTheFirstReason) {
  CancelToken open;
  EXPECT_TRUE(open.Check().ok());
  EXPECT_TRUE(CheckCancel(nullptr).ok());

  CancelToken gone(std::chrono::hours(1));
  gone.Cancel(CancelToken::Reason::kClientGone);
  gone.Cancel(CancelToken::Reason::kStopping);
  EXPECT_EQ(gone.reason(), CancelToken::Reason::kClientGone);
  EXPECT_EQ(gone.Check().message(), "query cancelled: its client went away");

  CancelToken budget(std::chrono::milliseconds(20));
  EXPECT_TRUE(budget.Check().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(CheckCancel(&budget).message(), "query exceeded its time budget of 20 ms");
  EXPECT_EQ(budget.reason(), CancelToken::Reason::kTimeBudget);
  EXPECT_EQ(CancelToken(std::chrono::seconds(120)).Message(), "not cancelled");

  std::atomic<bool> stopping{false};
  CancelToken both(std::chrono::seconds(2), &stopping);
  EXPECT_TRUE(both.Check().ok());
  stopping = true;
  EXPECT_EQ(both.Check().message(), "daemon is stopping");
  stopping = false;  // the first reason stays
  EXPECT_EQ(both.reason(), CancelToken::Reason::kStopping);
}

TEST(CancelToken, NamesWholeSecondsOfTheBudget) {
  CancelToken t(std::chrono::seconds(2));
  t.Cancel(CancelToken::Reason::kTimeBudget);
  EXPECT_EQ(t.Check().message(), "query exceeded its time budget of 2 s");
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

TEST(Utf8, RepairWritesEachBadByteAsAnEscape) {
  EXPECT_EQ(RepairUtf8("/home/\xe9l\xe8ve/train.py"), "/home/\\xe9l\\xe8ve/train.py");
  EXPECT_EQ(RepairUtf8("caf\xc3\xa9"), "caf\xc3\xa9");           // valid: unchanged
  EXPECT_EQ(RepairUtf8("\xc3"), "\\xc3");                        // truncated
  EXPECT_EQ(RepairUtf8("\xed\xa0\x80!"), "\\xed\\xa0\\x80!");     // surrogate
  EXPECT_EQ(RepairUtf8("\xe2\x28\xa1"), "\\xe2(\\xa1");             // bad continuation
  EXPECT_TRUE(IsValidUtf8(RepairUtf8("\xff\xfe\xc0\xaf\xf4\x90\x80\x80")));
  std::string storage;
  const std::string_view ok = "aten::add";
  EXPECT_EQ(RepairedUtf8(ok, &storage).data(), ok.data()) << "valid text is not copied";
  EXPECT_EQ(RepairedUtf8("\xff", &storage), "\\xff");
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
