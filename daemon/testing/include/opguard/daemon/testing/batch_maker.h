// Test and benchmark helpers for the daemon: synthetic Batch envelopes, a
// per-rank DEALER sender with the shim's ack/resend contract, a real opguardd
// child process, and temp dirs. Not part of the product.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "opguard/common/status.h"

namespace opguard::daemon::testing {

struct BatchOptions {
  uint32_t inputs = 2;           // tensor inputs per op (plus one scalar)
  uint32_t outputs = 1;
  bool announce = false;         // include a RunAnnounce (shims send it in batch 0)
  bool definitions = false;      // include the strings and sites the ops use
  uint32_t steps_every = 0;      // a step mark every N ops (0: none)
  uint32_t collectives_every = 0;  // a completed all-reduce every N ops
  uint32_t world_size = 8;
  uint16_t schema_major = 0;     // 0: this build's major
  bool end_of_run = false;
  std::vector<std::pair<uint64_t, uint64_t>> gaps;  // [first_op, last_op] missing on lane 0
  std::vector<std::pair<std::string, std::string>> determinism;  // added to the announce's settings
  // (path, text): a SourceFile each, with its path's string definition under
  // the id the shim gives it (XXH64 of the path).
  std::vector<std::pair<std::string, std::string>> sources;
  // RankSender only: build one batch and patch seq/op indices into copies of
  // it (costs the sender ~50 ns per op instead of ~2.5 us), to measure the
  // daemon rather than the batch builder. Record contents repeat.
  bool reuse_template = false;
};

// Deterministic content: the same arguments give the same bytes.
std::string MakeBatch(const std::string& run, uint32_t rank, uint64_t session, uint64_t seq,
                      uint64_t first_op, uint32_t n_ops, const BatchOptions& options);

// Rewrites seq and shifts every op index (and step, collective seq) of a
// MakeBatch result in place so that its first op is `first_op`.
void PatchBatch(std::string* bytes, uint64_t seq, uint64_t first_op);

// The string ids MakeBatch uses.
uint64_t OpNameId(uint64_t op_index);
std::string OpName(uint64_t op_index);

// Sends batches for one rank like the shim does: at most `window` unacked in
// flight, resend of every unacked batch not acked within `resend_after`
// (daemon restarted), stop at `deadline`. All calls from one thread.
class RankSender {
 public:
  RankSender(std::string endpoint, std::string run, uint32_t rank, uint64_t session,
             uint32_t ops_per_batch, BatchOptions options = {});
  ~RankSender();

  // Sends batches [0, batches) until all are acked or `deadline`. When
  // `stop_after_acks` > 0 returns as soon as that many are acked.
  Status Run(uint64_t batches, std::chrono::steady_clock::time_point deadline, uint32_t window = 8,
             uint64_t stop_after_acks = 0,
             std::chrono::milliseconds resend_after = std::chrono::milliseconds(1500));

  // Any thread: makes a running Run() return (with an error) soon.
  void Abort() { abort_ = true; }
  // Forget the acks: the next Run() sends every batch again (a shim never
  // does this; tests use it to prove resends are idempotent).
  void ForgetAcks() { acked_.clear(); }

  const std::set<uint64_t>& acked() const { return acked_; }
  uint64_t rejected() const { return rejected_; }
  uint64_t retried() const { return retried_; }  // "retry later" answers (disk full)
  uint64_t ops_acked() const { return acked_.size() * ops_per_batch_; }

 private:
  std::string MakeSeq(uint64_t seq) const;
  std::string endpoint_, run_;
  uint32_t rank_;
  uint64_t session_;
  uint32_t ops_per_batch_;
  BatchOptions options_;
  std::set<uint64_t> acked_;
  uint64_t rejected_ = 0;
  uint64_t retried_ = 0;
  mutable std::string template_;
  std::atomic<bool> abort_{false};
  void* context_ = nullptr;  // zmq::context_t
};

// Sends one raw frame on a fresh DEALER and waits for one reply frame.
// Returns the reply bytes, or an error on timeout.
Result<std::string> SendRaw(const std::string& endpoint, const std::string& frame,
                            std::chrono::milliseconds timeout);
// Decodes an Ack envelope: "durable", "rejected: <error>" or "retry: <error>".
std::string DescribeAck(const std::string& bytes);

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A real opguardd child process in local mode under `dir`.
class DaemonProcess {
 public:
  DaemonProcess(std::string binary, std::string dir, std::vector<std::string> extra_args = {});
  ~DaemonProcess();  // SIGKILLs a daemon still running

  // Starts it and waits (bounded) until its query endpoint answers.
  Status Start(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // SIGTERM and wait; returns the exit status (or -1 on timeout, then SIGKILLs).
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  void Kill9();
  bool Running();

  pid_t pid() const { return pid_; }
  std::string ingest() const { return "ipc://" + dir_ + "/ingest.sock"; }
  std::string query() const { return "ipc://" + dir_ + "/query.sock"; }
  std::string data_dir() const { return dir_ + "/data"; }
  const std::string& http() const { return http_; }  // HOST:PORT from its status
  // VmHWM (peak) and VmRSS (now) of the running process in bytes (0 if unknown).
  uint64_t PeakRssBytes() const;
  uint64_t RssBytes() const;
  const std::string& log_path() const { return log_; }

 private:
  std::string binary_, dir_, log_, http_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
};

// CPU seconds (user + system) process `pid` has used so far (0 if unknown):
// on a shared machine steadier than wall time.
double ProcessCpuSeconds(pid_t pid);

// A blocking TCP connection to "IPv4:PORT"; -1 when it cannot connect.
int ConnectTcp(const std::string& host_port);

// Minimal blocking HTTP GET against HOST:PORT; returns status, the header
// lines and body. `extra_headers`: "Name: value\r\n" lines to send;
// `from`: the local IPv4 address to connect from ("" : any).
struct HttpResult {
  int status = 0;
  std::string headers;
  std::string body;
};
Result<HttpResult> HttpGet(const std::string& host_port, const std::string& target,
                           std::chrono::milliseconds timeout = std::chrono::seconds(10),
                           const std::string& extra_headers = "", const std::string& from = "");

// Runs a command line through /bin/sh, capturing stdout+stderr (bounded by timeout seconds).
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command, int timeout_s = 30);

}  // namespace opguard::daemon::testing
