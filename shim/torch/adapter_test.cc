// The PyTorch adapter in a real Python process (Debian's torch, CPU), with
// OPGUARD=1 and the staged `opguard` package, recording into a ZeroMQ ROUTER
// written here that verifies and acknowledges every batch and keeps the op
// records, so their fields can be checked one by one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "opguard/idl/envelope.h"

namespace opguard::torch_adapter {
namespace {

namespace w = opguard::wire;

struct Op {
  uint32_t lane = 0;
  uint64_t op_index = 0;
  uint64_t step = 0;
  uint64_t name_id = 0;
  std::string name;  // resolved by Ingest::Ops()
  bool backward = false;
  bool replicated = false;
};

// Receives batches on `endpoint` until stopped, acknowledging each one.
class Ingest {
 public:
  explicit Ingest(std::string endpoint) : endpoint_(std::move(endpoint)) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.bind(endpoint_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Ingest() {
    stop_ = true;
    thread_.join();
  }

  // The ops received so far, lane by lane in op order, names resolved.
  std::vector<Op> Ops() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Op> out;
    for (const auto& [key, op] : ops_) {
      Op copy = op;
      auto it = strings_.find(copy.name_id);
      copy.name = it != strings_.end() ? it->second : "?";
      out.push_back(copy);
    }
    return out;
  }
  int invalid() {
    std::lock_guard<std::mutex> lock(mu_);
    return invalid_;
  }

 private:
  void Serve() {
    while (!stop_) {
      zmq_pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      zmq::message_t id, msg;
      while (!stop_ && sock_.recv(id, zmq::recv_flags::dontwait)) {
        if (!id.more() || !sock_.recv(msg, zmq::recv_flags::none)) continue;
        Handle(id, msg);
      }
    }
  }

  void Handle(const zmq::message_t& id, const zmq::message_t& msg) {
    w::AlignedStorage aligned;
    auto env = w::OpenEnvelope(msg.data(), msg.size(), aligned);
    if (!env.ok() || (*env)->message_type() != w::Message::Batch) {
      std::lock_guard<std::mutex> lock(mu_);
      ++invalid_;
      return;
    }
    const w::Batch* b = (*env)->message_as_Batch();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (b->strings() != nullptr) {
        for (const auto* s : *b->strings()) strings_[s->id()] = s->text()->str();
      }
      if (b->ops() != nullptr) {
        for (const auto* r : *b->ops()) {
          Op op;
          op.lane = r->lane();
          op.op_index = r->op_index();
          op.step = r->step();
          op.name_id = r->name();
          op.backward = r->backward();
          op.replicated = r->replicated();
          ops_[{op.lane, op.op_index}] = op;  // a resent batch overwrites
        }
      }
    }
    flatbuffers::FlatBufferBuilder fbb(256);
    auto run = fbb.CreateString(b->run()->string_view());
    w::AckBuilder ab(fbb);
    ab.add_run(run);
    ab.add_rank(b->rank());
    ab.add_session(b->session());
    ab.add_seq(b->seq());
    ab.add_code(w::AckCode::Durable);
    w::FinishEnvelope(fbb, ab.Finish());
    zmq::message_t reply_id(id.data(), id.size());
    zmq::message_t reply(fbb.GetBufferPointer(), fbb.GetSize());
    (void)sock_.send(reply_id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)sock_.send(reply, zmq::send_flags::dontwait);
  }

  const std::string endpoint_;
  zmq::context_t ctx_{1};
  zmq::socket_t sock_{ctx_, zmq::socket_type::router};
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::map<uint64_t, std::string> strings_;
  std::map<std::pair<uint32_t, uint64_t>, Op> ops_;
  int invalid_ = 0;
};

class AdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/opguard-adapter-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `script` with OPGUARD=1 as rank 0 of 1 against `ingest`; returns
  // its exit status (stderr is kept in `log_`).
  int RunPython(const std::string& script, const std::string& endpoint) {
    const std::string err = dir_ + "/stderr.txt";
    std::ostringstream cmd;
    cmd << "env -u OPGUARD_DEPTH -u OPGUARD_NESTED_OPS OPGUARD=1 OPGUARD_RUN=adapter-test"
        << " OPGUARD_ENDPOINT=" << endpoint << " RANK=0 WORLD_SIZE=1 OMP_NUM_THREADS=1"
        << " OPGUARD_FLUSH_TIMEOUT_MS=20000 PYTHONDONTWRITEBYTECODE=1"
        << " PYTHONPATH=" << OPGUARD_PYTHON_STAGE << " " << OPGUARD_TEST_PYTHON << " " << script
        << " > /dev/null 2> " << err;
    const int status = std::system(cmd.str().c_str());
    std::ifstream in(err);
    std::stringstream text;
    text << in.rdbuf();
    log_ = text.str();
    return status;
  }

  std::string dir_;
  std::string log_;
};

// Ops inside torch.optim's Optimizer.step and inside opguard.replicated() are
// flagged replicated; forward and backward ops, and ops outside the region,
// are not.
TEST_F(AdapterTest, OptimizerStepAndReplicatedRegionOpsAreFlagged) {
  const std::string endpoint = "ipc://" + dir_ + "/ingest.sock";
  Ingest ingest(endpoint);
  ASSERT_EQ(RunPython(OPGUARD_ADAPTER_TESTDATA "/replicated_train.py", endpoint), 0) << log_;
  EXPECT_EQ(ingest.invalid(), 0);

  std::vector<Op> ops;
  for (const Op& op : ingest.Ops()) {
    if (op.lane == 0) ops.push_back(op);  // the training thread (CPU: backward too)
  }
  ASSERT_FALSE(ops.empty()) << log_;
  for (size_t i = 0; i < ops.size(); ++i) ASSERT_EQ(ops[i].op_index, i) << "missing ops";

  for (uint64_t step = 0; step < 2; ++step) {
    // Within a step: forward ops, backward ops, then the optimizer's ops (the
    // step ends with Optimizer.step).
    size_t first = ops.size(), last_backward = ops.size(), end = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].step != step) continue;
      first = std::min(first, i);
      end = i + 1;
      if (ops[i].backward) last_backward = i;
    }
    ASSERT_LT(first, end) << "no ops in step " << step;
    ASSERT_LT(last_backward, end) << "no backward ops in step " << step;
    std::ostringstream listing;  // for failure messages
    for (size_t i = first; i < end; ++i) {
      listing << "\n  " << i << " " << ops[i].name << (ops[i].backward ? " backward" : "")
              << (ops[i].replicated ? " replicated" : "");
    }
    size_t forward = 0, backward = 0, updates = 0;
    bool in_step = false;
    for (size_t i = first; i < end; ++i) {
      const Op& op = ops[i];
      if (i <= last_backward) {
        EXPECT_FALSE(op.replicated) << "step " << step << " op " << i << listing.str();
        ++(op.backward ? backward : forward);
        continue;
      }
      // Torch 1.13's record_function makes its handle (aten::zeros) before
      // the Optimizer.step scope opens; every op from the scope's first on is
      // the optimizer's.
      in_step = in_step || op.name != "aten::zeros";
      EXPECT_EQ(op.replicated, in_step) << "step " << step << " op " << i << listing.str();
      EXPECT_FALSE(op.backward) << op.name;
      if (op.name == "aten::add_") ++updates;
    }
    EXPECT_GT(forward, 3u) << "step " << step;
    EXPECT_GT(backward, 3u) << "step " << step;
    // SGD updates each of the four parameters in place (and, from the second
    // step on, their momentum buffers).
    EXPECT_GE(updates, 4u) << "step " << step << listing.str();
  }

  std::map<std::string, int> after;  // ops after the last step: name -> replicated
  for (const Op& op : ops) {
    if (op.step == 2) after[op.name] = op.replicated ? 1 : 0;
  }
  ASSERT_TRUE(after.count("aten::sin") && after.count("aten::tan") && after.count("aten::cos"))
      << log_;
  EXPECT_EQ(after["aten::sin"], 1);
  EXPECT_EQ(after["aten::tan"], 1);
  EXPECT_EQ(after["aten::cos"], 0);
}

}  // namespace
}  // namespace opguard::torch_adapter
