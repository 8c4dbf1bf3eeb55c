// Text that is not UTF-8 through every string argument of the C API: a
// process using libopguard_shim.so (shim/testing/api_child.cc "latin1")
// records ops at a call site under a Latin-1 path into a real opguardd. The
// shim repairs each string (every bad byte as \xNN) instead of sending bytes
// that used to make the daemon refuse the whole batch: every op is stored,
// the names read back repaired, the source file is served under its repaired
// path and the reported gap is there.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

using namespace std::chrono_literals;

TEST(StringsIntegration, Latin1PathsNamesAndReasonsLoseNoOp) {
  testing::TempDir dir;
  testing::DaemonProcess d(OPGUARDD_PATH, dir.path());
  Status st = d.Start();
  ASSERT_TRUE(st.ok()) << st.message();

  const std::string out = dir.path() + "/child.out";
  std::string cmd = "env -i PATH=/usr/bin:/bin OPGUARD=1 OPGUARD_RUN=latin1 RANK=0 WORLD_SIZE=1"
                    " OPGUARD_ENDPOINT=" + d.ingest() + " OPGUARD_FLUSH_TIMEOUT_MS=20000 " +
                    OPGUARD_SHIM_API_CHILD + " latin1 > " + out + " 2>&1";
  int status = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream printed;
  printed << in.rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd << "\n" << printed.str();

  DaemonClient client(d.query(), 10s);
  auto answer = client.ReadTrace("latin1", 0, 0, 0, 100);
  ASSERT_TRUE(answer.ok()) << answer.status().message() << "\n" << printed.str();
  const auto* t = answer->envelope()->message_as_ReadTraceAnswer();
  std::vector<uint64_t> ops;
  std::map<uint64_t, uint64_t> site_of;
  for (const auto* op : *t->ops()) {
    ops.push_back(op->op_index());
    site_of[op->op_index()] = op->site();
  }
  EXPECT_EQ(ops, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 8})) << "ops 6-7 are the reported gap";
  std::map<uint64_t, std::string> strings;
  for (const auto* s : *t->strings()) strings[s->id()] = s->text()->str();
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> sites;  // id -> file, function
  for (const auto* s : *t->sites()) sites[s->id()] = {s->file(), s->function()};
  ASSERT_EQ(sites.count(site_of[3]), 1u);
  EXPECT_EQ(strings[sites[site_of[3]].first], "/home/\\xe9l\\xe8ve/train.py");
  EXPECT_EQ(strings[sites[site_of[3]].second], "f\\xf6rward");
  bool name_seen = false;
  for (const auto& [id, text] : strings) name_seen = name_seen || text == "aten::caf\\xe9";
  EXPECT_TRUE(name_seen) << "the Latin-1 op name, repaired";

  auto source = testing::HttpGet(d.http(), "/api/source?run=latin1&file=%2Fhome%2F%5Cxe9l%5Cxe8ve%2Ftrain.py");
  ASSERT_TRUE(source.ok()) << source.status().message();
  ASSERT_EQ(source->status, 200) << source->body;
  EXPECT_EQ(nlohmann::json::parse(source->body)["text"], "x = 1\n");

  auto run = testing::HttpGet(d.http(), "/api/runs/latin1");
  ASSERT_TRUE(run.ok() && run->status == 200);
  const auto rank = nlohmann::json::parse(run->body)["ranks"][0];
  EXPECT_EQ(rank["ops"], 7u);
  EXPECT_EQ(rank["gaps"], 2u);
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace opguard::daemon
