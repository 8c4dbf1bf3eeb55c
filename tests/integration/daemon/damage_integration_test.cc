// Damage on disk is reported, never answered as agreement (docs/storage.md,
// "Damage"): bytes flipped by the test in a real daemon's RocksDB files (a
// blob file holding op chunks, the SST holding the event cores), then the
// daemon restarted (no block cache, no memtable) and asked.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kBatches = 40;
constexpr uint32_t kOps = 50;

class DamageTest : public ::testing::Test {
 protected:
  std::unique_ptr<testing::DaemonProcess> StartDaemon() {
    auto d = std::make_unique<testing::DaemonProcess>(OPGUARDD_PATH, dir_.path());
    Status st = d->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return d;
  }

  // Two runs of the same ops (one rank, world size 1), flushed to files.
  void StoreTwoEqualRuns() {
    auto d = StartDaemon();
    ASSERT_TRUE(d->Running());
    testing::BatchOptions o;
    o.announce = o.definitions = true;
    o.world_size = 1;
    for (const char* run : {"ref", "sus"}) {
      testing::RankSender sender(d->ingest(), run, 0, run[0], kOps, o);
      ASSERT_TRUE(sender.Run(kBatches, Clock::now() + 60s, 8).ok());
    }
    EXPECT_EQ(d->Stop(), 0);  // flushed: chunks in blob files, cores in an SST
  }

  // The data files with `extension` whose bytes hold `magic` most often.
  std::vector<fs::path> FilesHolding(const std::string& extension, const std::string& magic) {
    std::vector<std::pair<size_t, fs::path>> found;
    for (const auto& e : fs::directory_iterator(dir_.path() + "/data")) {
      if (e.path().extension() != extension) continue;
      std::ifstream in(e.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      size_t n = 0;
      for (size_t at = bytes.find(magic); at != std::string::npos; at = bytes.find(magic, at + 1)) ++n;
      if (n > 0) found.emplace_back(n, e.path());
    }
    std::sort(found.rbegin(), found.rend());
    std::vector<fs::path> out;
    for (auto& [n, path] : found) {
      std::printf("%s holds %s %zu times (%llu bytes)\n", path.c_str(), magic.c_str(), n,
                  static_cast<unsigned long long>(fs::file_size(path)));
      out.push_back(path);
    }
    return out;
  }

  // Flips `count` runs of 64 bytes spread over the middle half of `file`.
  static void Flip(const fs::path& file, int count) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(file));
    for (int i = 0; i < count; ++i) {
      const std::streamoff at = size / 4 + (size / 2) * i / std::max(count, 1);
      char bytes[64];
      f.seekg(at);
      f.read(bytes, sizeof bytes);
      for (char& c : bytes) c = static_cast<char>(c ^ 0x5a);
      f.seekp(at);
      f.write(bytes, sizeof bytes);
    }
    ASSERT_TRUE(f.good()) << file;
  }

  static std::vector<uint64_t> ReadAll(testing::DaemonProcess& d, const std::string& run) {
    std::vector<uint64_t> ops;
    DaemonClient client(d.query(), 20s);
    uint64_t from = 0;
    for (int page = 0; page < 1000; ++page) {
      auto answer = client.ReadTrace(run, 0, 0, from, 5000);
      EXPECT_TRUE(answer.ok()) << answer.status().message();
      if (!answer.ok()) break;
      const auto* t = answer->envelope()->message_as_ReadTraceAnswer();
      if (t->ops()) {
        for (const auto* op : *t->ops()) ops.push_back(op->op_index());
      }
      if (t->done()) break;
      from = t->next_op();
    }
    return ops;
  }

  static double Metric(testing::DaemonProcess& d, const std::string& name) {
    auto metrics = testing::HttpGet(d.http(), "/metrics");
    if (!metrics.ok()) return -1;
    auto pos = metrics->body.find("\n" + name + " ");
    return pos == std::string::npos ? -1 : std::stod(metrics->body.substr(pos + name.size() + 2));
  }

  static nlohmann::json Verify(testing::DaemonProcess& d, const std::string& query) {
    auto r = testing::HttpGet(d.http(), "/api/verify" + query, 60s);
    if (!r.ok() || r->status != 200) return nullptr;
    return nlohmann::json::parse(r->body);
  }

  testing::CommandResult Diff(testing::DaemonProcess& d) {
    return testing::RunCommand(std::string(OPGUARD_CLI_PATH) + " diff --daemon " + d.query() + " ref sus 2>&1", 120);
  }

  testing::TempDir dir_;
};

// 64 bytes flipped in the blob file of one run's op chunks. The diff reads
// the event cores (intact), but once a read found the records damaged, the
// diff says incomplete and names the ops instead of "identical". Before, a
// trace page returned fewer ops while the diff said identical.
TEST_F(DamageTest, DamagedRecordsMakeTheDiffIncompleteOnceFound) {
  StoreTwoEqualRuns();
  auto blobs = FilesHolding(".blob", "OGZ1");
  ASSERT_FALSE(blobs.empty());
  Flip(blobs[0], 1);
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  const auto ref = ReadAll(*d, "ref"), sus = ReadAll(*d, "sus");
  const std::string damaged = ref.size() < sus.size() ? "ref" : "sus";
  ASSERT_LT(std::min(ref.size(), sus.size()), kBatches * kOps) << "the flip hit no chunk";
  EXPECT_GE(Metric(*d, "opguard_store_read_errors_total"), 1);

  const auto diff = Diff(*d);
  EXPECT_EQ(diff.exit_code, 3) << diff.output;
  EXPECT_NE(diff.output.find("incomplete"), std::string::npos) << diff.output;
  const std::string side = damaged == "ref" ? "reference" : "suspect";
  EXPECT_NE(diff.output.find("rank 0 " + side + " lane 0: ops #"), std::string::npos) << diff.output;

  const auto bad = Verify(*d, "?run=" + damaged);
  ASSERT_FALSE(bad.is_null());
  EXPECT_EQ(bad["status"], "damaged") << bad.dump();
  ASSERT_FALSE(bad["damaged_ops"].empty()) << bad.dump();
  EXPECT_EQ(bad["damaged_ops"][0]["run"], damaged);
  const auto good = Verify(*d, std::string("?run=") + (damaged == "ref" ? "sus" : "ref"));
  ASSERT_FALSE(good.is_null());
  EXPECT_EQ(good["status"], "ok") << good.dump();
  EXPECT_EQ(good["ops_read"], kBatches * kOps);
  EXPECT_EQ(d->Stop(), 0);
}

// The same damage found by a scrub of the whole store before any query:
// `GET /api/verify` names it, and the diff after it is incomplete.
TEST_F(DamageTest, AScrubFindsDamageNoQueryHasRead) {
  StoreTwoEqualRuns();
  auto blobs = FilesHolding(".blob", "OGZ1");
  ASSERT_FALSE(blobs.empty());
  Flip(blobs[0], 1);
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  const auto all = Verify(*d, "");
  ASSERT_FALSE(all.is_null());
  EXPECT_EQ(all["status"], "damaged") << all.dump();
  EXPECT_GE(all["read_errors"], 1) << all.dump();
  ASSERT_FALSE(all["damaged_ops"].empty()) << all.dump();
  const auto diff = Diff(*d);
  EXPECT_EQ(diff.exit_code, 3) << diff.output;
  EXPECT_NE(diff.output.find("ops #"), std::string::npos) << diff.output;
  EXPECT_EQ(d->Stop(), 0);
}

// 8 x 64 bytes flipped in the SST holding the event cores: each read of
// them is counted and logged, and the diff answers from the intact chunks
// (complete, so identical). Before, nothing was counted nor logged.
TEST_F(DamageTest, DamagedCoresAreCountedLoggedAndTheChunksAnswer) {
  StoreTwoEqualRuns();
  auto ssts = FilesHolding(".sst", "OGE1");
  ASSERT_FALSE(ssts.empty());
  Flip(ssts[0], 8);
  auto d = StartDaemon();
  ASSERT_TRUE(d->Running());
  const auto diff = Diff(*d);
  EXPECT_EQ(diff.exit_code, 0) << diff.output;
  EXPECT_NE(diff.output.find("aligned " + std::to_string(kBatches * kOps)), std::string::npos) << diff.output;
  EXPECT_GE(Metric(*d, "opguard_store_read_errors_total"), 1);
  std::ifstream log(d->log_path());
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("damaged data in the event cores"), std::string::npos) << text;
  const auto all = Verify(*d, "");
  ASSERT_FALSE(all.is_null());
  EXPECT_EQ(all["status"], "damaged") << all.dump();
  EXPECT_EQ(d->Stop(), 0);
}

}  // namespace
}  // namespace opguard::daemon
