// Pending fingerprints end to end: a process using libopguard_shim.so
// (shim/testing/api_child.cc "held") records ops whose fingerprints another
// thread resolves later and in reverse order, into a real opguardd (RocksDB,
// ZeroMQ). Read back, the rank's trace holds every op in index order with the
// resolved bits, and the op whose fingerprint failed is a gap.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

using namespace std::chrono_literals;

TEST(PendingIntegration, HeldRecordsArriveCompleteAndInOrder) {
  testing::TempDir dir;
  testing::DaemonProcess d(OPGUARDD_PATH, dir.path());
  Status st = d.Start();
  ASSERT_TRUE(st.ok()) << st.message();

  constexpr int kPending = 200;  // 400 ops: 200 pending, 200 plain
  std::string cmd = "env -i PATH=/usr/bin:/bin OPGUARD=1 OPGUARD_RUN=held RANK=0 WORLD_SIZE=1"
                    " OPGUARD_ENDPOINT=" + d.ingest() + " OPGUARD_FLUSH_TIMEOUT_MS=20000 " +
                    OPGUARD_SHIM_API_CHILD + " held " + std::to_string(kPending) + " > " +
                    dir.path() + "/child.out 2>&1";
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;

  DaemonClient client(d.query(), 10s);
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> outputs;  // op index -> output fingerprint
  std::vector<uint64_t> order;
  uint64_t from = 0;
  for (int page = 0; page < 100; ++page) {
    auto answer = client.ReadTrace("held", 0, 0, from, 1000);
    ASSERT_TRUE(answer.ok()) << answer.status().message();
    const auto* t = answer->envelope()->message_as_ReadTraceAnswer();
    if (t->ops() != nullptr) {
      for (const auto* op : *t->ops()) {
        order.push_back(op->op_index());
        ASSERT_NE(op->outputs(), nullptr);
        ASSERT_EQ(op->outputs()->size(), 1u);
        const auto* fp = op->outputs()->Get(0)->fingerprint();
        outputs[op->op_index()] = {fp->lo(), fp->hi()};
      }
    }
    if (t->done()) break;
    from = t->next_op();
  }
  ASSERT_EQ(order.size(), 2u * kPending - 1) << "every op but the failed one";
  for (size_t i = 1; i < order.size(); ++i) ASSERT_LT(order[i - 1], order[i]);
  for (uint64_t i = 0; i < kPending; ++i) {
    const uint64_t pending_op = 2 * i, plain_op = 2 * i + 1;
    EXPECT_EQ(outputs.at(plain_op).first, 5000 + i);
    if (i == kPending / 2) {
      EXPECT_EQ(outputs.count(pending_op), 0u) << "the failed fingerprint's op is a gap";
      continue;
    }
    EXPECT_EQ(outputs.at(pending_op), std::make_pair(1000 + i, 2000 + i)) << "op " << pending_op;
  }
  // The rank's summary counts the one missing op.
  auto runs = client.ListRuns();
  ASSERT_TRUE(runs.ok()) << runs.status().message();
  uint64_t gaps = UINT64_MAX;
  for (const auto* r : *runs->envelope()->message_as_ListRunsAnswer()->runs()) {
    if (r->name()->str() != "held") continue;
    for (const auto* k : *r->ranks()) gaps = k->gaps();
  }
  EXPECT_EQ(gaps, 1u);
}

}  // namespace
}  // namespace opguard::daemon
