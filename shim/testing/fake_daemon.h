// Test-only stand-in for opguardd's ingest: a ZeroMQ ROUTER that verifies
// every envelope, keeps what it received (deduplicated by rank, session and
// batch sequence, as the daemon's idempotent keys would) and acknowledges
// batches. Used by the shim's unit tests, the shim benchmark and loadgen's
// self-test. It can be stopped and restarted on the same endpoint, told to
// withhold acks, to reject chosen batches, to lose chosen acks, or to be slow:
// answer each batch only a while after it arrived (ack_delay_ms) and/or spend
// time on every message it reads (service_us), as a loaded daemon would.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <zmq.hpp>

namespace opguard::shim::testing {

struct ReceivedOp {
  uint32_t rank = 0;
  uint32_t lane = 0;
  uint64_t op_index = 0;
  uint64_t step = 0;
  uint64_t name = 0;
  uint64_t site = 0;
  int64_t seq_nr = -1;
  bool backward = false;
  bool replicated = false;
  bool trusted = false;
  uint32_t inputs = 0;
  uint32_t outputs = 0;
  uint64_t out_lo = 0;  // first output's fingerprint, low half
  uint64_t out_hi = 0;
  bool out_has_stats = false;
  uint64_t in_lo = 0;   // first input's tensor fingerprint, low half (0 none)
  std::vector<uint64_t> kernels;  // string ids of kernel names
};

struct ReceivedCollective {
  uint32_t rank = 0;
  uint64_t communicator = 0;
  uint64_t seq = 0;
  uint8_t phase = 0;
  uint64_t op_index = 0;
  uint64_t out_lo = 0;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t reduce_op = 0;
  int32_t root = -1;
  uint64_t count = 0;
  uint64_t time_ns = 0;
  uint32_t inputs = 0;
  uint32_t outputs = 0;
  uint64_t in_lo = 0;   // first input's fingerprint, low half
};

struct ReceivedGap {
  uint32_t rank = 0;
  uint32_t lane = 0;
  uint64_t first_op = 0, last_op = 0, records_dropped = 0;
  uint64_t communicator = 0, first_seq = 0, last_seq = 0;
  std::string reason;
};

struct Received {
  uint64_t messages = 0;     // every message received
  uint64_t invalid = 0;      // failed OpenEnvelope or not a Batch
  uint64_t batches = 0;      // distinct batches stored
  uint64_t duplicates = 0;   // a batch seen again (a resend of a stored batch)
  uint64_t records = 0;      // ops + collectives in distinct batches
  uint64_t acks_sent = 0;
  uint64_t acks_lost = 0;    // acks swallowed by drop_first_ack_seqs
  // Most distinct batches (session, seq) received and never answered yet at
  // any one time: a copy that arrives after its batch was answered is left
  // out (the sender may have the ack already), so the count never exceeds the
  // sender's window, however late a resend arrives.
  uint64_t max_outstanding = 0;
  std::map<uint64_t, uint64_t> receipts;  // batch seq -> times received (any session)
  uint64_t announces = 0;
  uint64_t end_of_run = 0;   // batches with end_of_run
  uint64_t steps = 0;
  uint64_t sources = 0;
  std::set<uint64_t> sessions;
  std::string framework;
  std::map<std::string, std::string> determinism;
  std::map<std::string, std::string> versions;
  std::map<uint64_t, std::string> strings;
  std::set<uint64_t> sites;
  std::set<uint64_t> communicators;
  std::vector<ReceivedOp> ops;                 // only with keep_records
  std::vector<ReceivedCollective> collectives; // only with keep_records
  std::vector<ReceivedGap> gaps;
  std::vector<std::string> runs;               // distinct run names seen
};

struct FakeDaemonOptions {
  bool ack = true;                   // answer Durable (else stay silent)
  std::set<uint64_t> reject_seqs;    // answer Rejected for these batch seqs
  bool keep_records = true;          // false: count only (benchmarks)
  uint32_t ack_delay_ms = 0;         // each ack leaves this long after its batch arrived
  uint32_t service_us = 0;           // time spent on every message read (a busy daemon)
  std::set<uint64_t> drop_first_ack_seqs;  // the first ack for these seqs is lost
};

class FakeDaemon {
 public:
  explicit FakeDaemon(std::string endpoint, FakeDaemonOptions options = {});
  ~FakeDaemon();
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  // Binds and serves on a thread of its own. Returns false if bind failed.
  bool Start();
  // Closes the socket and joins; what was received is kept.
  void Stop();
  void SetAck(bool ack);
  void SetAckDelay(uint32_t ms) { ack_delay_ms_ = ms; }
  void SetServiceUs(uint32_t us) { service_us_ = us; }

  Received Snapshot();
  // Waits until pred(received) holds or timeout_ms passed; returns pred's value.
  bool WaitFor(const std::function<bool(const Received&)>& pred, int timeout_ms);

 private:
  void Serve(std::string* error);
  struct Reply {
    std::chrono::steady_clock::time_point due;
    std::string id;
    std::string ack;
    std::tuple<uint64_t, uint64_t> key;  // session, seq
  };
  void Handle(const zmq::message_t& id, const zmq::message_t& msg, std::deque<Reply>* replies);
  // Sends the replies that are due; returns the time until the next one.
  std::chrono::milliseconds SendDue(zmq::socket_t& sock, std::deque<Reply>* replies);

  const std::string endpoint_;
  zmq::context_t ctx_{1};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ack_;
  std::atomic<uint32_t> ack_delay_ms_;
  std::atomic<uint32_t> service_us_;
  const std::set<uint64_t> reject_seqs_;
  const bool keep_records_;

  std::mutex mu_;
  std::condition_variable cv_;
  Received received_;
  std::set<std::tuple<uint32_t, uint64_t, uint64_t>> stored_;  // rank, session, seq
  std::set<std::tuple<uint64_t, uint64_t>> outstanding_;       // received, not answered
  std::set<std::tuple<uint64_t, uint64_t>> answered_;          // an ack was sent
  std::set<uint64_t> drop_first_ack_seqs_;                      // not yet dropped
};

}  // namespace opguard::shim::testing
