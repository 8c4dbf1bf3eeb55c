// The C API of libopguard_shim.so, exercised in fresh child processes
// (testing/api_child.cc) against a fake daemon: exit flush, fork, disabled
// means nothing happens, bad configuration, no blocking when the daemon is
// absent. Also what the library exports.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fake_daemon.h"
#include "opguard/shim.h"

extern char** environ;

namespace {

using opguard::shim::testing::FakeDaemon;
using opguard::shim::testing::Received;
using Clock = std::chrono::steady_clock;

struct ChildResult {
  int status = -1;  // exit code, or -1 if killed / timed out
  std::map<std::string, std::string> out;
  std::string err;
};

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/opguard-api-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    endpoint_ = "ipc://" + dir_ + "/ingest.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs the child with a clean environment plus `env`; kills it after
  // timeout_s.
  ChildResult Run(std::vector<std::string> args, std::map<std::string, std::string> env,
                  int timeout_s = 20) {
    std::vector<std::string> envs = {"PATH=/usr/bin:/bin"};
    // A sanitizer build's options (scripts/sanitize.sh) hold for the child too.
    for (const char* var : {"ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS"}) {
      if (const char* v = std::getenv(var); v != nullptr && env.count(var) == 0) env[var] = v;
    }
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    args.insert(args.begin(), OPGUARD_SHIM_API_CHILD);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string out_path = dir_ + "/out.txt", err_path = dir_ + "/err.txt";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    auto start = Clock::now();
    EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    ChildResult r;
    int status = 0;
    while (true) {
      pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) {
        r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      if (Clock::now() - start > std::chrono::seconds(timeout_s)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "child timed out";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::ifstream out(out_path);
    std::string line;
    while (std::getline(out, line)) {
      auto eq = line.find('=');
      if (eq != std::string::npos) r.out[line.substr(0, eq)] = line.substr(eq + 1);
    }
    std::ifstream err(err_path);
    std::stringstream ss;
    ss << err.rdbuf();
    r.err = ss.str();
    return r;
  }

  std::map<std::string, std::string> Enabled(std::map<std::string, std::string> extra = {}) {
    std::map<std::string, std::string> env = {{"OPGUARD", "1"}, {"OPGUARD_RUN", "api-test"},
                                              {"OPGUARD_ENDPOINT", endpoint_}};
    for (auto& [k, v] : extra) env[k] = v;
    return env;
  }

  std::string dir_;
  std::string endpoint_;
};

TEST_F(ApiTest, ExitFlushDeliversEverything) {
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  // Batches are cut neither by count nor by time before exit: only the exit
  // handler can send these records.
  auto r = Run({"record", "5000"}, Enabled({{"OPGUARD_BATCH_RECORDS", "1000000"},
                                            {"OPGUARD_BATCH_INTERVAL_MS", "60000"},
                                            {"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out["enabled"], "1");
  EXPECT_EQ(r.out["bad"], "0");
  EXPECT_EQ(r.out["rank"], "1");
  Received got = daemon.Snapshot();
  EXPECT_EQ(got.records, 5000u);
  EXPECT_EQ(got.end_of_run, 1u);
  EXPECT_EQ(got.framework, "api-child");
  EXPECT_EQ(got.strings.at(opguard_intern("aten::add", 9)), "aten::add");
  for (const auto& op : got.ops) EXPECT_EQ(op.rank, 1u);
  EXPECT_EQ(r.err, "");  // nothing to say when all goes well
}

TEST_F(ApiTest, PendingFingerprintsAreSentWhenResolvedAndExitWaitsForThem) {
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  // With a GPU (and the CUDA backend beside the library) the child's "device"
  // pointer would reach a kernel; the device path there is checked by
  // scripts/gpu-check.sh.
  bool gpu = std::filesystem::exists("/dev/nvidiactl");
  auto r = Run({"pending", gpu ? "0" : "1"}, Enabled({{"OPGUARD_BATCH_INTERVAL_MS", "60000"}}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out["api"], std::to_string(OPGUARD_SHIM_API_VERSION));
  EXPECT_EQ(r.out["host_rc"], "0");
  EXPECT_EQ(r.out["host_pending"], "1");
  EXPECT_EQ(r.out["record_rc"], "0");
  EXPECT_EQ(r.out["begin_rc"], "0");
  EXPECT_EQ(r.out["record2_rc"], "0");
  EXPECT_EQ(r.out["resolve_rc"], "0");
  Received got = daemon.Snapshot();
  ASSERT_GE(got.ops.size(), 2u);
  EXPECT_EQ(got.ops[0].op_index, 0u);
  EXPECT_EQ(std::to_string(got.ops[0].out_lo), r.out["expect_lo"]);
  EXPECT_EQ(got.ops[1].op_index, 1u);
  EXPECT_EQ(got.ops[1].out_lo, 4242u);
  EXPECT_EQ(got.ops[1].out_hi, 4343u);
  EXPECT_EQ(got.end_of_run, 1u);
  if (!gpu) {
    EXPECT_EQ(r.out["device_rc"], "0");
    EXPECT_EQ(r.out["record3_rc"], "0");
    EXPECT_EQ(got.ops.size(), 2u);
    ASSERT_EQ(got.gaps.size(), 1u);
    EXPECT_EQ(got.gaps[0].first_op, 2u);
    EXPECT_EQ(got.gaps[0].reason, "missing fingerprint: no CUDA device");
    // One line says why, once.
    EXPECT_NE(r.err.find("no CUDA device fingerprints"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST_F(ApiTest, ForkedChildIsDisabledAndParentCarriesOn) {
  FakeDaemon daemon(endpoint_);
  ASSERT_TRUE(daemon.Start());
  auto r = Run({"fork"}, Enabled());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out["child_enabled"], "0");
  EXPECT_EQ(r.out["child_rc"], std::to_string(OPGUARD_ERR_DISABLED));
  EXPECT_EQ(r.out["child_status"], "0");
  EXPECT_EQ(r.out["parent_enabled"], "1");
  Received got = daemon.Snapshot();
  EXPECT_EQ(got.records, 100u);
  EXPECT_EQ(got.sessions.size(), 1u);  // nothing from the forked child
  for (const auto& op : got.ops) EXPECT_NE(op.out_lo, 999u);
  EXPECT_EQ(got.end_of_run, 1u);
}

TEST_F(ApiTest, DisabledStartsNothing) {
  for (const char* value : {"", "0"}) {
    std::map<std::string, std::string> env = {{"OPGUARD_ENDPOINT", endpoint_}};
    if (*value != '\0') env["OPGUARD"] = value;
    auto r = Run({"disabled"}, env);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out["enabled"], "0");
    EXPECT_EQ(r.out["rc"], std::to_string(OPGUARD_ERR_DISABLED));
    EXPECT_EQ(r.out["threads_after"], r.out["threads_before"]);
    EXPECT_EQ(r.out["fds_after"], r.out["fds_before"]);
    // Ids are content hashes, computed even when disabled: XXH64("abc", 0).
    EXPECT_EQ(r.out["intern_abc"], "4952883123889572249");
    EXPECT_EQ(r.err, "");
  }
}

TEST_F(ApiTest, BadValueWarnsOnceAndTrainingGoesOn) {
  for (const auto& [var, value] : std::map<std::string, std::string>{
           {"OPGUARD_BATCH_RECORDS", "lots"}, {"OPGUARD", "yes"}, {"WORLD_SIZE", "0"},
           {"OPGUARD_ENDPOINT", "/run/x.sock"}, {"OPGUARD_LOG_LEVEL", "chatty"}}) {
    auto env = Enabled({{var, value}});
    if (var == "WORLD_SIZE") env["RANK"] = "0";
    auto r = Run({"record", "10"}, env);
    ASSERT_EQ(r.status, 0) << var;
    EXPECT_EQ(r.out["enabled"], "0") << var;
    EXPECT_EQ(r.out["bad"], "10") << var;  // every record call answered DISABLED
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(var), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  }
}

TEST_F(ApiTest, AbsentDaemonNeverBlocksAndExitIsBounded) {
  auto r = Run({"noblock", "200000"}, Enabled({{"OPGUARD_FLUSH_TIMEOUT_MS", "300"},
                                               {"OPGUARD_BUFFER_MB", "8"}}));
  // Returning at all (Run's timeout) shows that neither the calls nor the
  // exit flush waited for the absent daemon; the counts show how.
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_GT(std::stoll(r.out["ok"]), 0);
  EXPECT_GT(std::stoll(r.out["dropped"]), 0);  // 8 MiB fill up: drops, not waits
  EXPECT_EQ(std::stoll(r.out["ok"]) + std::stoll(r.out["dropped"]), 200000);
  EXPECT_NE(r.err.find("not acknowledged"), std::string::npos) << r.err;  // exit gave up
}

TEST_F(ApiTest, ExportsOnlyTheCApi) {
  void* lib = dlopen(OPGUARD_SHIM_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  EXPECT_NE(dlsym(lib, "opguard_record_op"), nullptr);
  EXPECT_NE(dlsym(lib, "opguard_get_counters"), nullptr);
  // Internals and statically linked dependencies stay hidden.
  EXPECT_EQ(dlsym(lib, "_ZN7opguard3LogENS_8LogLevelESt17basic_string_viewIcSt11char_traitsIcEE"), nullptr);
  EXPECT_EQ(dlsym(lib, "XXH64"), nullptr);
  dlclose(lib);
}

TEST_F(ApiTest, InProcessCallsWithoutOpguardAreInert) {
  // This test process does not set OPGUARD.
  ASSERT_EQ(getenv("OPGUARD"), nullptr);
  EXPECT_EQ(opguard_api_version(), OPGUARD_SHIM_API_VERSION);
  EXPECT_EQ(opguard_init(), 0);
  EXPECT_EQ(opguard_enabled(), 0);
  EXPECT_STREQ(opguard_run_name(), "");
  EXPECT_EQ(opguard_flush(10), OPGUARD_ERR_DISABLED);
  EXPECT_EQ(opguard_record_op(nullptr, nullptr), OPGUARD_ERR_DISABLED);
  EXPECT_EQ(opguard_site("a.py", 1, "f"), opguard_site("a.py", 1, "f"));
  EXPECT_NE(opguard_site("a.py", 1, "f"), opguard_site("a.py", 2, "f"));
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  c.records_sent = 7;
  EXPECT_EQ(opguard_get_counters(&c), OPGUARD_ERR_DISABLED);
  EXPECT_EQ(c.records_sent, 0u);
}

TEST_F(ApiTest, FingerprintHelper) {
  float data[6] = {1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  opguard_tensor a = {}, b = {};
  int rc = opguard_fingerprint_host(data, OPGUARD_DTYPE_FLOAT32, shape, 2, nullptr, &a);
  if (rc == OPGUARD_ERR_UNSUPPORTED) GTEST_SKIP() << "built without opguard_fingerprint";
  ASSERT_EQ(rc, OPGUARD_OK);
  ASSERT_EQ(opguard_fingerprint_host(data, OPGUARD_DTYPE_FLOAT32, shape, 2, nullptr, &b), OPGUARD_OK);
  EXPECT_EQ(a.fp_lo, b.fp_lo);
  EXPECT_EQ(a.fp_hi, b.fp_hi);
  EXPECT_EQ(a.has_stats, 1);
  EXPECT_EQ(a.stats.sum, 21.0);
  EXPECT_EQ(a.stats.max, 6.0);
  std::swap(data[0], data[1]);  // position-sensitive
  ASSERT_EQ(opguard_fingerprint_host(data, OPGUARD_DTYPE_FLOAT32, shape, 2, nullptr, &b), OPGUARD_OK);
  EXPECT_FALSE(a.fp_lo == b.fp_lo && a.fp_hi == b.fp_hi);
  EXPECT_EQ(opguard_fingerprint_host(data, 0, shape, 2, nullptr, &b), OPGUARD_ERR_INVALID);
  EXPECT_EQ(opguard_fingerprint_host(data, OPGUARD_DTYPE_FLOAT32, nullptr, 2, nullptr, &b),
            OPGUARD_ERR_INVALID);
}

// A caller's pool gets the shares of a large tensor and gives the fingerprint,
// statistics and sums of the calling thread alone; a strided view too.
TEST_F(ApiTest, FingerprintOnACallersPoolEqualsTheSerialOne) {
  std::vector<float> data(1 << 20);
  uint64_t state = 3;
  for (float& v : data) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / 4096.0f;
  }
  struct Pool {
    int calls = 0, tasks = 0;
  } pool;
  const opguard_parallel_for run = [](void* ctx, int tasks, void (*task)(void*, int), void* task_ctx) {
    auto* p = static_cast<Pool*>(ctx);
    ++p->calls;
    p->tasks += tasks;
    std::vector<std::thread> threads;
    for (int i = 1; i < tasks; ++i) threads.emplace_back(task, task_ctx, i);
    task(task_ctx, 0);
    for (auto& t : threads) t.join();
  };
  const int64_t shape[] = {1024, 1024};
  const int64_t transposed[] = {1, 1024};
  for (const int64_t* strides : {static_cast<const int64_t*>(nullptr), transposed}) {
    opguard_tensor serial = {}, pooled = {};
    opguard_byte_sums serial_sums = {}, pooled_sums = {};
    const int rc = opguard_fingerprint_host_sums(data.data(), OPGUARD_DTYPE_FLOAT32, shape, 2,
                                                 strides, &serial, &serial_sums);
    if (rc == OPGUARD_ERR_UNSUPPORTED) GTEST_SKIP() << "built without opguard_fingerprint";
    ASSERT_EQ(rc, OPGUARD_OK);
    pool = {};
    ASSERT_EQ(opguard_fingerprint_host_parallel(data.data(), OPGUARD_DTYPE_FLOAT32, shape, 2,
                                                strides, 4, run, &pool, &pooled, &pooled_sums),
              OPGUARD_OK);
    EXPECT_EQ(pool.calls, 1);
    EXPECT_EQ(pool.tasks, 4);
    EXPECT_EQ(pooled.fp_lo, serial.fp_lo);
    EXPECT_EQ(pooled.fp_hi, serial.fp_hi);
    EXPECT_EQ(std::memcmp(&pooled.stats, &serial.stats, sizeof(serial.stats)), 0);
    EXPECT_EQ(pooled_sums.a0, serial_sums.a0);
    EXPECT_EQ(pooled_sums.a1, serial_sums.a1);
  }
  // No pool, or one task: the calling thread alone.
  opguard_tensor out = {};
  EXPECT_EQ(opguard_fingerprint_host_parallel(data.data(), OPGUARD_DTYPE_FLOAT32, shape, 2, nullptr,
                                              4, nullptr, nullptr, &out, nullptr),
            OPGUARD_OK);
  pool = {};
  EXPECT_EQ(opguard_fingerprint_host_parallel(data.data(), OPGUARD_DTYPE_FLOAT32, shape, 2, nullptr,
                                              1, run, &pool, &out, nullptr),
            OPGUARD_OK);
  EXPECT_EQ(pool.calls, 0);
}

// A reshape of the same bytes, finalized from their sums, equals the bytes
// fingerprinted under the new shape, for many buffers and shapes; a shape
// change still changes the fingerprint.
TEST_F(ApiTest, ReshapeFromByteSumsEqualsFingerprintOfTheNewShape) {
  std::vector<float> data(720);
  uint64_t state = 7;
  for (int trial = 0; trial < 50; ++trial) {
    for (float& v : data) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) / 4096.0f;
    }
    const int64_t from[] = {720};
    opguard_tensor flat = {};
    opguard_byte_sums sums = {};
    const int rc = opguard_fingerprint_host_sums(data.data(), OPGUARD_DTYPE_FLOAT32, from, 1,
                                                 nullptr, &flat, &sums);
    if (rc == OPGUARD_ERR_UNSUPPORTED) GTEST_SKIP() << "built without opguard_fingerprint";
    ASSERT_EQ(rc, OPGUARD_OK);
    const std::vector<std::vector<int64_t>> shapes = {{720}, {24, 30}, {30, 24}, {2, 3, 4, 30},
                                                      {720, 1}, {1, 720}};
    for (const auto& to : shapes) {
      opguard_tensor direct = {}, reshaped = flat;
      ASSERT_EQ(opguard_fingerprint_host(data.data(), OPGUARD_DTYPE_FLOAT32, to.data(),
                                         static_cast<uint32_t>(to.size()), nullptr, &direct),
                OPGUARD_OK);
      ASSERT_EQ(opguard_fingerprint_reshape(&sums, OPGUARD_DTYPE_FLOAT32, to.data(),
                                            static_cast<uint32_t>(to.size()), &reshaped),
                OPGUARD_OK);
      EXPECT_EQ(reshaped.fp_lo, direct.fp_lo) << trial << " rank " << to.size();
      EXPECT_EQ(reshaped.fp_hi, direct.fp_hi);
      EXPECT_EQ(reshaped.ndim, to.size());
      EXPECT_EQ(std::memcmp(&reshaped.stats, &direct.stats, sizeof(direct.stats)), 0);
      if (to.size() > 1) {
        EXPECT_NE(reshaped.fp_lo, flat.fp_lo) << "shape not mixed in";
      }
    }
  }
  EXPECT_EQ(opguard_fingerprint_reshape(nullptr, OPGUARD_DTYPE_FLOAT32, nullptr, 0, nullptr),
            OPGUARD_ERR_INVALID);
}

}  // namespace
