// The PyTorch adapter in a real Python process (Debian's torch, CPU), with
// OPGUARD=1 and the staged `opguard` package, recording into the shim's fake
// daemon (verifies and acknowledges every batch, keeps the op records), so
// their fields can be checked one by one. OPGUARD_TEST_PYTHON and
// OPGUARD_PYTHON_STAGE in the environment name another interpreter and
// package (a venv's torch from pip and the adapter built for it:
// scripts/torch-suite.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fake_daemon.h"

namespace opguard::torch_adapter {
namespace {

using shim::testing::FakeDaemon;
using shim::testing::ReceivedOp;

// The environment's `name`, else the build's `fallback`.
std::string FromEnvironment(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : fallback;
}

// The ops of lane 0 (the training thread; CPU backward runs there too) in op
// order, with their names.
std::vector<std::pair<ReceivedOp, std::string>> Lane0Ops(FakeDaemon& ingest) {
  auto received = ingest.Snapshot();
  std::vector<std::pair<ReceivedOp, std::string>> out;
  for (const ReceivedOp& op : received.ops) {
    if (op.lane != 0) continue;
    auto it = received.strings.find(op.name);
    out.emplace_back(op, it != received.strings.end() ? it->second : "?");
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first.op_index < b.first.op_index; });
  return out;
}

class AdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/opguard-adapter-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    ingest_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Runs testdata/`script` under OPGUARD=1 against a fresh fake daemon
  // (`ingest_`, left running), with `env` ("NAME=value ...") added to its
  // environment: it must exit 0 with every batch valid.
  ::testing::AssertionResult Record(const std::string& script, const std::string& env = "") {
    const std::string endpoint = "ipc://" + dir_ + "/ingest.sock";
    ingest_ = std::make_unique<FakeDaemon>(endpoint);
    if (!ingest_->Start()) return ::testing::AssertionFailure() << "the fake daemon did not start";
    const int status = RunPython(std::string(OPGUARD_ADAPTER_TESTDATA) + "/" + script, endpoint, env);
    if (status != 0) return ::testing::AssertionFailure() << script << ": status " << status << "\n" << log_;
    const uint64_t invalid = ingest_->Snapshot().invalid;
    if (invalid != 0) return ::testing::AssertionFailure() << invalid << " invalid batches";
    return ::testing::AssertionSuccess();
  }

  // Runs `script` with OPGUARD=1 as rank 0 of 1 against `ingest`; returns
  // its exit status (stderr is kept in `log_`).
  int RunPython(const std::string& script, const std::string& endpoint, const std::string& env) {
    const std::string err = dir_ + "/stderr.txt";
    std::ostringstream cmd;
    cmd << "env -u OPGUARD_DEPTH -u OPGUARD_NESTED_OPS OPGUARD=1 OPGUARD_RUN=adapter-test"
        << " OPGUARD_ENDPOINT=" << endpoint << " RANK=0 WORLD_SIZE=1 OMP_NUM_THREADS=1"
        << " OPGUARD_FLUSH_TIMEOUT_MS=20000 PYTHONDONTWRITEBYTECODE=1 " << env
        << " PYTHONPATH=" << FromEnvironment("OPGUARD_PYTHON_STAGE", OPGUARD_PYTHON_STAGE) << " "
        << FromEnvironment("OPGUARD_TEST_PYTHON", OPGUARD_TEST_PYTHON) << " " << script
        << " > /dev/null 2> " << err;
    const int status = std::system(cmd.str().c_str());
    std::ifstream in(err);
    std::stringstream text;
    text << in.rdbuf();
    log_ = text.str();
    return status;
  }

  std::string dir_;
  // The key=value lines of the last script's stderr.
  std::map<std::string, std::string> Printed() const {
    std::map<std::string, std::string> printed;
    std::istringstream lines(log_);
    for (std::string line; std::getline(lines, line);) {
      if (auto eq = line.find('='); eq != std::string::npos) printed[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return printed;
  }

  std::string log_;
  std::unique_ptr<FakeDaemon> ingest_;
};

// Ops inside torch.optim's Optimizer.step and inside opguard.replicated() are
// flagged replicated; forward and backward ops, and ops outside the region,
// are not.
TEST_F(AdapterTest, OptimizerStepAndReplicatedRegionOpsAreFlagged) {
  ASSERT_TRUE(Record("replicated_train.py"));

  const auto ops = Lane0Ops(*ingest_);
  ASSERT_FALSE(ops.empty()) << log_;
  for (size_t i = 0; i < ops.size(); ++i) ASSERT_EQ(ops[i].first.op_index, i) << "missing ops";

  size_t after_loop = ops.size();  // the first op after the last Optimizer.step
  for (uint64_t step = 0; step < 2; ++step) {
    // Within a step: forward ops, backward ops, then the optimizer's ops (the
    // last ones updating a parameter, aten::add_); the next iteration's
    // forward starts the next step, and what runs after the loop stays in the
    // last one.
    size_t first = ops.size(), last_backward = ops.size(), end = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].first.step != step) continue;
      first = std::min(first, i);
      if (ops[i].second == "aten::add_") end = i + 1;
      if (ops[i].first.backward) last_backward = i;
    }
    if (step == 1) after_loop = end;
    ASSERT_LT(first, end) << "no ops in step " << step;
    ASSERT_LT(last_backward, end) << "no backward ops in step " << step;
    std::ostringstream listing;  // for failure messages
    for (size_t i = first; i < end; ++i) {
      const auto& [op, name] = ops[i];
      listing << "\n  " << i << " " << name << (op.backward ? " backward" : "")
              << (op.replicated ? " replicated" : "");
    }
    size_t forward = 0, backward = 0, updates = 0;
    bool in_step = false;
    for (size_t i = first; i < end; ++i) {
      const auto& [op, name] = ops[i];
      if (i <= last_backward) {
        EXPECT_FALSE(op.replicated) << "step " << step << " op " << i << listing.str();
        ++(op.backward ? backward : forward);
        continue;
      }
      // Torch 1.13's record_function makes its handle (aten::zeros) before
      // the Optimizer.step scope opens; every op from the scope's first on is
      // the optimizer's.
      in_step = in_step || name != "aten::zeros";
      EXPECT_EQ(op.replicated, in_step) << "step " << step << " op " << i << listing.str();
      EXPECT_FALSE(op.backward) << name;
      if (name == "aten::add_") ++updates;
    }
    EXPECT_GT(forward, 3u) << "step " << step;
    EXPECT_GT(backward, 3u) << "step " << step;
    // SGD updates each of the four parameters in place (and, from the second
    // step on, their momentum buffers).
    EXPECT_GE(updates, 4u) << "step " << step << listing.str();
  }

  std::map<std::string, int> after;  // ops after the loop: name -> replicated
  for (size_t i = after_loop; i < ops.size(); ++i) {
    EXPECT_EQ(ops[i].first.step, 1u) << ops[i].second;
    after[ops[i].second] = ops[i].first.replicated ? 1 : 0;
  }
  ASSERT_TRUE(after.count("aten::sin") && after.count("aten::tan") && after.count("aten::cos"))
      << log_;
  EXPECT_EQ(after["aten::sin"], 1);
  EXPECT_EQ(after["aten::tan"], 1);
  EXPECT_EQ(after["aten::cos"], 0);
  ASSERT_TRUE(after.count("aten::exp")) << log_;
  EXPECT_EQ(after["aten::exp"], 0) << "a step range whose enter failed stayed open";
}

// A strided output is fingerprinted in logical element order, as its
// contiguous copy is, and a contiguous view of cached bytes is finalized from
// their cached sums under its own shape: every clone (contiguous output,
// hashed from its bytes) carries the fingerprint of the view the op before
// it made (transposes, permutes, steps, size-1 and stride-0 dimensions,
// reshapes, every element size, transposed planes larger than a copy block,
// and one view too large to gather).
TEST_F(AdapterTest, StridedViewsAreFingerprintedInLogicalOrder) {
  ASSERT_TRUE(Record("strided_views.py"));

  const auto ops = Lane0Ops(*ingest_);
  size_t clones = 0;
  for (size_t i = 1; i < ops.size(); ++i) {
    if (ops[i].second != "aten::clone") continue;
    ++clones;
    const auto& [view, view_name] = ops[i - 1];
    EXPECT_EQ(ops[i].first.out_lo, view.out_lo) << "clone " << clones << " of " << view_name;
  }
  EXPECT_EQ(clones, 10u * 11u + 4u + 1u) << log_;
}

// A large output is fingerprinted off the training thread, and the in-place
// write right after the op waits for that fingerprint: the record carries the
// bits the op produced (the CPU fingerprint of a copy the script took right
// after the op), the write's record the written ones.
TEST_F(AdapterTest, LargeOutputHashedOffThreadKeepsThePreWriteBits) {
  ASSERT_TRUE(Record("async_large.py"));
  std::map<std::string, std::string> printed = Printed();
  ASSERT_TRUE(printed.count("expect3")) << log_;
  EXPECT_NE(printed["fp_resolved"], "0") << "nothing was fingerprinted off the thread";
  EXPECT_EQ(printed["fp_failed"], "0");
  std::vector<const ReceivedOp*> muls, adds;
  const ReceivedOp* clone = nullptr;
  const auto ops = Lane0Ops(*ingest_);
  for (const auto& [op, name] : ops) {
    if (name == "aten::mul") muls.push_back(&op);
    if (name == "aten::add_") adds.push_back(&op);
    if (name == "aten::clone" && clone == nullptr) clone = &op;
  }
  ASSERT_GE(muls.size(), 4u) << log_;
  ASSERT_EQ(adds.size(), 4u) << log_;
  ASSERT_NE(clone, nullptr);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::to_string(muls[i]->out_lo), printed["expect" + std::to_string(i)])
        << "op " << i << ": the bytes it produced, before the write";
    EXPECT_EQ(adds[i]->in_lo, muls[i]->out_lo) << "the write's input is the op's output";
    EXPECT_NE(adds[i]->out_lo, muls[i]->out_lo);
  }
  EXPECT_EQ(clone->out_lo, adds[3]->out_lo);
  EXPECT_TRUE(ingest_->Snapshot().gaps.empty());
}

// With two intra-op threads, large tensors hashed on the training thread are
// split over torch's pool: contiguous outputs, a transposed view the adapter
// gathers and one hashed from its strides carry the fingerprint the calling
// thread alone computes from the same bytes.
TEST_F(AdapterTest, LargeTensorsHashedOnTheIntraOpPoolMatchTheSerialFingerprint) {
  ASSERT_TRUE(Record("intra_op_pool.py"));
  std::map<std::string, std::string> printed = Printed();
  ASSERT_EQ(printed["threads"], "2") << log_;
  std::vector<const ReceivedOp*> muls, clones;
  const auto ops = Lane0Ops(*ingest_);
  for (const auto& [op, name] : ops) {
    if (name == "aten::mul") muls.push_back(&op);
    if (name == "aten::clone") clones.push_back(&op);
  }
  ASSERT_EQ(muls.size(), 6u) << log_;
  ASSERT_EQ(clones.size(), 6u) << log_;
  for (size_t i = 0; i < 3; ++i) {
    const std::string n = std::to_string(i);
    EXPECT_EQ(std::to_string(muls[2 * i]->out_lo), printed["mul" + n]) << "step " << i;
    EXPECT_EQ(std::to_string(clones[2 * i]->in_lo), printed["t" + n]) << "strided, step " << i;
    EXPECT_EQ(std::to_string(clones[2 * i]->out_lo), printed["t" + n]);
    EXPECT_EQ(std::to_string(clones[2 * i + 1]->in_lo), printed["tsmall" + n]) << "gathered";
    EXPECT_EQ(std::to_string(clones[2 * i + 1]->out_lo), printed["tsmall" + n]);
  }
  EXPECT_TRUE(ingest_->Snapshot().gaps.empty());
}

// In-place writes run inside a tensor subclass's __torch_dispatch__ (the
// ops on an AsyncCollectiveTensor or a DTensor) do not bump the written
// tensor's version counter: each written op's output is the bytes written,
// as the clone after it hashes them, never the target's earlier fingerprint.
TEST_F(AdapterTest, WritesInsideASubclassDispatchAreHashedAsWritten) {
  ASSERT_TRUE(Record("subclass_writes.py"));

  const auto ops = Lane0Ops(*ingest_);
  size_t writes = 0;
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    const std::string& name = ops[i].second;
    if (name != "aten::copy_" && name != "aten::add_" && name != "aten::mul_" &&
        name != "aten::add") {
      continue;
    }
    size_t next = i + 1;  // torch 1.13 returns copy_'s result through an alias
    while (next + 1 < ops.size() && ops[next].second == "aten::alias") ++next;
    if (ops[next].second != "aten::clone") continue;
    ++writes;
    EXPECT_EQ(ops[i].first.out_lo, ops[next].first.out_lo) << name << " before clone " << writes;
  }
  EXPECT_EQ(writes, 3u * 4u) << log_;
}

// Views made inside a tensor subclass's __torch_dispatch__ (DTensor's local
// aten::t of every Linear) do not share their base's version counter: each
// starts at 0. A view made after its base was written must carry the bytes
// written (as the contiguous copy after it hashes them), never the
// fingerprint of an earlier view of the same bytes and layout.
TEST_F(AdapterTest, ViewsMadeInsideASubclassDispatchShowLaterWrites) {
  ASSERT_TRUE(Record("subclass_views.py"));

  auto ops = Lane0Ops(*ingest_);
  // torch 1.13 returns the dispatch's result through an aten::alias.
  std::erase_if(ops, [](const auto& op) { return op.second == "aten::alias"; });
  size_t views = 0;
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    if (ops[i].second != "aten::t" || ops[i + 1].second != "aten::add_") continue;
    // aten::t (hashed), aten::add_, aten::t (the view checked), then the
    // same view outside the dispatch and its copy: aten::contiguous or, where
    // it is not recorded, the aten::clone it runs.
    ASSERT_LT(i + 4, ops.size());
    ASSERT_EQ(ops[i + 2].second, "aten::t");
    ASSERT_EQ(ops[i + 3].second, "aten::t");
    ASSERT_TRUE(ops[i + 4].second == "aten::contiguous" || ops[i + 4].second == "aten::clone")
        << ops[i + 4].second;
    ++views;
    EXPECT_NE(ops[i].first.out_lo, ops[i + 2].first.out_lo) << "view " << views;
    EXPECT_EQ(ops[i + 2].first.out_lo, ops[i + 4].first.out_lo) << "view " << views;
  }
  std::string names;
  for (const auto& op : ops) names += op.second + " ";
  EXPECT_EQ(views, 3u) << names << log_;
}

// Ops that write through their arguments record the written tensors as
// outputs, after the op: an in-place foreach op (it returns nothing) has
// each tensor of its written list, in order; an in-place op returning its
// target and an out= op returning its out argument have that tensor once.
// Each output is the bytes written, as the clone after the op hashes them.
TEST_F(AdapterTest, WrittenArgumentsAreOutputs) {
  ASSERT_TRUE(Record("written_arguments.py"));

  const auto ops = Lane0Ops(*ingest_);
  size_t foreach_ops = 0, single = 0;
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    const auto& [op, name] = ops[i];
    if (name == "aten::_foreach_add_" || name == "aten::_foreach_mul_") {
      ++foreach_ops;
      ASSERT_LT(i + 2, ops.size());
      EXPECT_EQ(op.outputs, 3u) << name << " " << foreach_ops;
      ASSERT_EQ(ops[i + 1].second, "aten::clone");
      EXPECT_EQ(op.out_lo, ops[i + 1].first.out_lo) << name << " " << foreach_ops;
    } else if (name == "aten::add_" || name == "aten::mul") {
      ++single;
      EXPECT_EQ(op.outputs, 1u) << name << " " << single;
      ASSERT_EQ(ops[i + 1].second, "aten::clone");
      EXPECT_EQ(op.out_lo, ops[i + 1].first.out_lo) << name << " " << single;
    }
  }
  EXPECT_EQ(foreach_ops, 6u) << log_;
  EXPECT_EQ(single, 6u) << log_;
  EXPECT_TRUE(ingest_->Snapshot().gaps.empty());
}

// Tensors of one storage with version counters of their own (`p.data`):
// a fingerprint cached through one of them is not taken for another at the
// same count, and a write through one is seen through the others. Each
// clone's input (read through the cache) is its output (hashed afresh), and
// each write's output is what the clone after it copies.
TEST_F(AdapterTest, WritesAreSeenThroughEveryTensorOfTheStorage) {
  ASSERT_TRUE(Record("storage_aliases.py"));

  const auto ops = Lane0Ops(*ingest_);
  size_t clones = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& [op, name] = ops[i];
    if (name == "aten::clone") {
      ++clones;
      EXPECT_EQ(op.in_lo, op.out_lo) << "clone " << clones << ": its input is stale";
    } else if (name == "aten::mul_" || name == "aten::add_") {
      ASSERT_LT(i + 1, ops.size());
      ASSERT_EQ(ops[i + 1].second, "aten::clone");
      EXPECT_EQ(op.out_lo, ops[i + 1].first.out_lo) << name << " before clone " << clones + 1;
    }
  }
  EXPECT_EQ(clones, 9u) << log_;
}

// Ops on tensors without data (the meta device, FakeTensorMode) compute
// nothing: no op records, no gaps; the real ops around them are recorded.
TEST_F(AdapterTest, OpsOnTensorsWithoutDataAreNeitherOpsNorGaps) {
  ASSERT_TRUE(Record("fake_tensors.py"));

  std::vector<std::string> names;
  for (const auto& op : Lane0Ops(*ingest_)) names.push_back(op.second);
  EXPECT_EQ(names, (std::vector<std::string>{"aten::ones", "aten::mul"})) << log_;
  EXPECT_TRUE(ingest_->Snapshot().gaps.empty()) << ingest_->Snapshot().gaps.front().reason;
}

// Ops run inside opguard.paused() regions are not recorded, on any thread,
// nested regions included, nor are collectives (dispatcher ops and those
// the Python wrappers record); recording resumes when the outermost one ends.
TEST_F(AdapterTest, PausedRegionsAreNotRecorded) {
  ASSERT_TRUE(Record("paused.py"));
  const auto received = ingest_->Snapshot();
  std::map<std::string, int> recorded;
  for (const ReceivedOp& op : received.ops) {
    auto it = received.strings.find(op.name);
    if (it != received.strings.end()) ++recorded[it->second];
  }
  EXPECT_EQ(recorded["aten::tan"], 1) << log_;
  EXPECT_EQ(recorded["aten::cos"], 1);
  EXPECT_EQ(recorded["aten::atan"], 1);
  for (const char* name : {"aten::sin", "aten::exp", "aten::sinh", "aten::cosh"}) {
    EXPECT_EQ(recorded.count(name), 0u) << name << " was recorded while paused";
  }
  // The two collectives called outside the region, Entered and Completed
  // each; none of the two called inside it.
  EXPECT_EQ(received.collectives.size(), 4u);
}

// Replicated ops read a tensor cached before their region from its bytes,
// and one an earlier op of the same region hashed from the cache.
TEST_F(AdapterTest, ReplicatedOpsReuseOnlyFingerprintsTakenInTheirRegion) {
  ASSERT_TRUE(Record("replicated_reads.py"));
  std::map<std::string, ReceivedOp> by_name;
  for (const auto& [op, name] : Lane0Ops(*ingest_)) by_name.emplace(name, op);
  for (const char* name : {"aten::neg", "aten::sin", "aten::cos", "aten::tan", "aten::abs", "aten::exp"}) {
    ASSERT_TRUE(by_name.count(name)) << name << "\n" << log_;
  }
  EXPECT_TRUE(by_name["aten::sin"].replicated);
  EXPECT_FALSE(by_name["aten::abs"].replicated);
  // `before` changed behind torch's back after aten::neg read it: the
  // region's first op hashes what is there now.
  EXPECT_NE(by_name["aten::sin"].in_lo, by_name["aten::neg"].in_lo);
  EXPECT_EQ(by_name["aten::cos"].in_lo, by_name["aten::sin"].in_lo);
  // cos's output, changed behind torch's back inside the region, is read by
  // tan from the fingerprint cos's record took; a region opened later reads
  // its bytes again.
  EXPECT_EQ(by_name["aten::tan"].in_lo, by_name["aten::cos"].out_lo);
  EXPECT_NE(by_name["aten::exp"].in_lo, by_name["aten::cos"].out_lo);
}

// Trusted mode: the ops OPGUARD_TRUSTED names are recorded with dtypes and
// shapes but no fingerprint (zero, no statistics) and flagged trusted; an op
// reading a trusted op's output hashes it; inside opguard.replicated() even a
// trusted op is fingerprinted. A malformed list warns once and leaves every op
// fingerprinted.
TEST_F(AdapterTest, TrustedOpsAreRecordedWithoutFingerprints) {
  for (const bool malformed : {false, true}) {
    SCOPED_TRACE(malformed ? "malformed list" : "aten::mm, aten::sin");
    ASSERT_TRUE(Record("trusted_ops.py", malformed ? "TRUSTED_MALFORMED=1" : ""));
    std::map<std::string, std::vector<ReceivedOp>> by_name;
    for (const auto& [op, name] : Lane0Ops(*ingest_)) by_name[name].push_back(op);
    ASSERT_EQ(by_name["aten::mm"].size(), 1u) << log_;
    ASSERT_EQ(by_name["aten::cos"].size(), 1u);
    ASSERT_EQ(by_name["aten::sin"].size(), 2u);
    const ReceivedOp& mm = by_name["aten::mm"][0];
    const ReceivedOp& cos = by_name["aten::cos"][0];
    const ReceivedOp& sin = by_name["aten::sin"][0];
    const ReceivedOp& replicated_sin = by_name["aten::sin"][1];
    EXPECT_EQ(mm.outputs, 1u);
    EXPECT_EQ(mm.inputs, 2u);
    EXPECT_EQ(mm.trusted, !malformed);
    EXPECT_EQ(sin.trusted, !malformed);
    EXPECT_EQ(mm.out_lo == 0 && mm.out_hi == 0 && mm.in_lo == 0, !malformed);
    EXPECT_EQ(mm.out_has_stats, malformed);
    EXPECT_EQ(sin.out_lo == 0 && sin.out_hi == 0, !malformed);
    EXPECT_FALSE(cos.trusted);
    EXPECT_NE(cos.in_lo, 0u) << "the trusted op's output was not hashed where it was read";
    EXPECT_NE(cos.out_lo, 0u);
    EXPECT_TRUE(cos.out_has_stats);
    EXPECT_TRUE(replicated_sin.replicated);
    EXPECT_FALSE(replicated_sin.trusted);
    EXPECT_NE(replicated_sin.out_lo, 0u);
    const bool warned = log_.find("OPGUARD_TRUSTED: 'mm' is not an op name") != std::string::npos;
    EXPECT_EQ(warned, malformed) << log_;
  }
}

// Online SDC mode (OPGUARD_SDC=1, torch 2.0 and newer): no op is observed;
// after each optimizer step one replicated op per parameter records it and
// its optimizer state (Adam: 4 tensors) as its outputs, read from their
// bytes, and
// opguard.record_replica_state() adds its own. A value that is not 0 or 1,
// or a torch without torch.optim's step hooks, warns once and records every
// op (full mode), with the explicit replica state as well.
TEST_F(AdapterTest, SdcModeRecordsOnlyReplicaState) {
  for (const std::string value : {"1", "yes"}) {
    SCOPED_TRACE("OPGUARD_SDC=" + value);
    ASSERT_TRUE(Record("sdc_mode.py", "OPGUARD_SDC=" + value));
    const bool too_old = log_.find("OPGUARD_SDC=1 needs torch 2.0") != std::string::npos;
    const bool malformed = log_.find("OPGUARD_SDC='yes' is not 0 or 1") != std::string::npos;
    EXPECT_EQ(malformed, value == "yes") << log_;
    EXPECT_EQ(too_old, !malformed && log_.find("torch 1.") != std::string::npos) << log_;
    std::vector<std::pair<ReceivedOp, std::string>> replica_state;
    size_t aten_ops = 0;
    for (const auto& [op, name] : Lane0Ops(*ingest_)) {
      if (name.rfind("opguard::replica_state[", 0) == 0) replica_state.emplace_back(op, name);
      if (name.rfind("aten::", 0) == 0) ++aten_ops;
    }
    if (malformed || too_old) {
      EXPECT_GT(aten_ops, 20u) << "full mode records every op";
      ASSERT_EQ(replica_state.size(), 2u) << log_;  // the explicit ones only
    } else {
      EXPECT_EQ(aten_ops, 0u) << log_;
      ASSERT_EQ(replica_state.size(), 11u) << log_;
      // The DTensor parameter's op, last: its local 8 x 8 part.
      EXPECT_EQ(replica_state.back().second, "opguard::replica_state[SGD:0.0]");
      EXPECT_EQ(replica_state.back().first.outputs, 1u);
      EXPECT_NE(replica_state.back().first.out_lo, 0u);
      replica_state.pop_back();
      for (size_t i = 0; i < 8; ++i) {
        const auto& [op, name] = replica_state[i];
        EXPECT_EQ(name, "opguard::replica_state[Adam:0." + std::to_string(i % 4) + "]");
        EXPECT_EQ(op.step, i / 4);
        EXPECT_EQ(op.outputs, 4u) << "the parameter, exp_avg, exp_avg_sq, step";
        EXPECT_EQ(op.inputs, 0u);
        EXPECT_TRUE(op.replicated);
        EXPECT_NE(op.out_lo, 0u);
        EXPECT_TRUE(op.out_has_stats);
      }
      // The parameters moved between the steps.
      EXPECT_NE(replica_state[0].first.out_lo, replica_state[4].first.out_lo);
    }
    const auto& [ema, ema_name] = replica_state[replica_state.size() - 2];
    const auto& [pair, pair_name] = replica_state.back();
    EXPECT_EQ(ema_name, "opguard::replica_state[ema]");
    EXPECT_EQ(pair_name, "opguard::replica_state[pair]");
    EXPECT_EQ(ema.outputs, 1u);
    EXPECT_EQ(pair.outputs, 2u);
    EXPECT_TRUE(ema.replicated);
    EXPECT_NE(ema.out_lo, 0u);
    EXPECT_EQ(ema.out_lo, pair.out_lo) << "the same tensor, the same fingerprint";
    EXPECT_EQ(log_.find("recorded no replica state"), std::string::npos) << log_;
  }
  // A hand-written update that records no state: nothing, said at exit.
  ASSERT_TRUE(Record("sdc_hand_written.py", "OPGUARD_SDC=1"));
  const bool full_mode = log_.find("OPGUARD_SDC=1 needs torch 2.0") != std::string::npos;
  EXPECT_EQ(Lane0Ops(*ingest_).empty(), !full_mode) << log_;
  EXPECT_EQ(log_.find("OPGUARD_SDC=1 recorded no replica state in this process: it ran no "
                      "torch.optim step") != std::string::npos,
            !full_mode)
      << log_;
}

}  // namespace
}  // namespace opguard::torch_adapter
