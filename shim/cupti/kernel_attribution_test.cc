// KernelAttribution against the real libcupti of the CUDA toolkit. Without a
// CUDA driver (CI, development machines) CUPTI refuses to enable activity
// records: Start must say so in one log line and return nothing, leaving the
// process as it was. With a driver (a GPU machine), the CUPTI calls the
// shim makes around and after an op must succeed.
#include "kernel_attribution.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "opguard/common/log.h"

namespace opguard::shim::cupti {
namespace {

std::mutex g_lines_mu;
std::vector<std::string> g_lines;

void CaptureLine(LogLevel, std::string_view message) {
  std::lock_guard<std::mutex> lock(g_lines_mu);
  g_lines.emplace_back(message);
}

class KernelAttributionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_lines.clear();
    SetLogSink(&CaptureLine);
  }
  void TearDown() override { SetLogSink(nullptr); }
  static std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(g_lines_mu);
    return g_lines;
  }
};

bool CuptiInstalled() {
  void* h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) h = dlopen("/usr/local/cuda/lib64/libcupti.so", RTLD_NOW | RTLD_LOCAL);
  return h != nullptr;  // left loaded: Start finds the same copy
}

bool DriverPresent() { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) != nullptr; }

TEST_F(KernelAttributionTest, RealCuptiWithoutADriverFallsBackInOneLine) {
  if (!CuptiInstalled()) GTEST_SKIP() << "libcupti is not installed (no CUDA toolkit)";
  if (DriverPresent()) GTEST_SKIP() << "a CUDA driver is present: RealCuptiWithADriver covers this machine";
  std::string why;
  std::unique_ptr<KernelAttribution> ka = KernelAttribution::Start(KernelsConfig{true, ""}, &why);
  EXPECT_EQ(ka, nullptr);
  EXPECT_EQ(why, "CUPTI could not enable EXTERNAL_CORRELATION records (CUPTI_ERROR_UNKNOWN; no CUDA driver?)");
  ASSERT_EQ(Lines().size(), 1u);
  EXPECT_EQ(Lines()[0], "kernel names are not recorded: " + why);
  // Nothing was left claimed: a second attempt fails the same way, not as
  // "already running".
  std::unique_ptr<KernelAttribution> again = KernelAttribution::Start(KernelsConfig{true, ""}, &why);
  EXPECT_EQ(again, nullptr);
  EXPECT_NE(why.find("CUPTI could not enable"), std::string::npos) << why;
}

TEST_F(KernelAttributionTest, RealCuptiWithADriverAcceptsTheOpCalls) {
  if (!CuptiInstalled()) GTEST_SKIP() << "libcupti is not installed (no CUDA toolkit)";
  if (!DriverPresent()) GTEST_SKIP() << "no CUDA driver on this machine (CUPTI refuses to start)";
  std::string why;
  std::unique_ptr<KernelAttribution> ka = KernelAttribution::Start(KernelsConfig{true, ""}, &why);
  ASSERT_NE(ka, nullptr) << why;
  const uint64_t key = OpKey(0, 1);
  ASSERT_TRUE(ka->BeginOp(key));
  ka->EndOp(key);
  ka->GpuWorkDone(key);
  EXPECT_TRUE(ka->waiting_for_flush());
  ka->Flush();
  KernelList l = ka->KernelsFor(key);
  EXPECT_EQ(l.state, KernelsState::kReady);  // launched nothing
  EXPECT_TRUE(l.names.empty());
  EXPECT_TRUE(ka->on());
  ka->Stop();
  EXPECT_TRUE(Lines().empty());
}

TEST_F(KernelAttributionTest, MissingLibraryIsOneLine) {
  std::string why;
  auto ka = KernelAttribution::Start(KernelsConfig{true, "/nonexistent/libcupti.so.13"}, &why);
  EXPECT_EQ(ka, nullptr);
  EXPECT_NE(why.find("cannot load /nonexistent/libcupti.so.13"), std::string::npos) << why;
  ASSERT_EQ(Lines().size(), 1u);
  EXPECT_NE(Lines()[0].find("kernel names are not recorded"), std::string::npos);
}

TEST_F(KernelAttributionTest, ALibraryThatIsNotCuptiIsRefused) {
  std::string why;
  auto ka = KernelAttribution::Start(KernelsConfig{true, "libm.so.6"}, &why);
  EXPECT_EQ(ka, nullptr);
  EXPECT_EQ(why, "libm.so.6 lacks the CUPTI Activity API functions used");
  EXPECT_EQ(Lines().size(), 1u);
}

}  // namespace
}  // namespace opguard::shim::cupti
