// Daemon counters, exported as Prometheus text on GET /metrics. Written by
// the ingest and query threads with relaxed atomics (no ordering needed: each
// counter stands alone), read by the HTTP thread.
//
// May be included by every room of the daemon (it depends on nothing).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace opguard::daemon {

class Store;

enum class RejectReason : int {
  kOversized = 0,   // larger than ingest.max_message_bytes
  kNotOpGuard,      // no OPG1 identifier: garbage, or truncated below the header
  kMalformed,       // fails the FlatBuffers Verifier (truncated, hostile offsets)
  kSchemaMajor,     // another schema major version
  kWrongMessage,    // a valid envelope that is not a Batch
  kInvalidBatch,    // a Batch that breaks the contract (empty run name, ...)
  kLimit,           // beyond a configured limit (world size, runs, ranks, string bytes, ...)
  kOwner,           // into a run another uid created
  kCount
};
inline constexpr int kRejectReasonCount = static_cast<int>(RejectReason::kCount);
const char* RejectReasonName(RejectReason reason);

struct Metrics {
  // Latency buckets of the ack histogram (seconds), receive -> ack sent.
  static constexpr std::array<double, 14> kAckBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                         0.025,  0.05,  0.1,    0.25,  0.5,
                                                         1,      2.5,   5,      10};

  std::atomic<uint64_t> ops{0}, collectives{0}, strings{0}, sites{0}, sources{0}, steps{0};
  std::atomic<uint64_t> gap_notices{0}, gap_records{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> batches_durable{0}, batches_duplicate{0};
  std::array<std::atomic<uint64_t>, kRejectReasonCount> rejected{};
  std::atomic<uint64_t> commit_groups{0}, commit_batches{0}, commit_seconds_micros{0};
  std::atomic<uint64_t> store_errors{0};
  std::atomic<uint64_t> ingest_exceptions{0};  // messages whose handling threw (a bug caught)
  std::array<std::atomic<uint64_t>, kAckBuckets.size() + 1> ack_buckets{};  // last: +Inf
  std::atomic<uint64_t> ack_count{0}, ack_sum_micros{0};
  std::atomic<uint64_t> queries{0}, query_errors{0}, http_requests{0};
  std::atomic<uint64_t> http_connections{0};      // gauge: open HTTP connections
  std::atomic<uint64_t> http_accept_backoffs{0};  // accepting paused: at the cap or out of descriptors
  std::atomic<uint64_t> runs_deleted{0};
  std::atomic<uint64_t> queries_denied{0};      // admin requests refused (transport or uid)
  // Aligner queries stopped before their answer (CancelToken reasons).
  std::atomic<uint64_t> queries_client_gone{0}, queries_over_budget{0};
  std::atomic<uint64_t> explanations_asked{0};  // calls to explain.endpoint
  std::atomic<uint64_t> curve_denied{0};        // CURVE clients not in curve.authorized_keys
  std::atomic<uint64_t> http_evicted{0};        // at the cap: the connection waiting longest for a request closed
  std::atomic<uint64_t> http_misdirected{0};    // HTTP requests whose Host names another site (421)
  std::atomic<uint64_t> sources_refused{0};     // source files over ingest.max_source_bytes, not stored
  std::atomic<uint64_t> http_unauthorized{0};   // HTTP requests off loopback without the token
  std::atomic<uint64_t> dedup_deferred{0};  // "retry later": one out-of-order range too many (SessionState::kMaxRanges)
  std::atomic<uint64_t> text_repaired{0};   // batches with text that was not UTF-8, stored repaired
  std::atomic<uint64_t> dedup_checked{0};   // batches of a revived session, records checked against the store
  std::atomic<uint64_t> inflight_bytes{0};       // gauge: received, not yet acknowledged
  std::atomic<uint64_t> ingest_paused_micros{0};  // receiver not reading: budget exhausted
  // Disk space (docs/storage.md).
  std::atomic<uint64_t> read_only{0};           // gauge: 1 while new records are refused for space
  std::atomic<uint64_t> read_only_entered{0};   // times ingest paused for space
  std::atomic<uint64_t> batches_deferred{0};    // answered "retry later" (or unanswered) for space
  std::atomic<uint64_t> store_resumes{0};       // RocksDB stopped by ENOSPC, resumed

  void ObserveAck(uint64_t micros);
  // For counters fed with sender-chosen numbers (gap records): stop at the top.
  static void AddSaturating(std::atomic<uint64_t>* counter, uint64_t n);
  uint64_t RejectedTotal() const;
  // The whole exposition, Prometheus text format 0.0.4.
  std::string Prometheus(const Store& store, uint64_t runs, double uptime_s) const;
};

}  // namespace opguard::daemon
