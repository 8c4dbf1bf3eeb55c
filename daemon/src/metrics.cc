#include "metrics.h"

#include <cstdio>

#include "opguard/common/saturating.h"
#include "storage/store.h"

namespace opguard::daemon {

const char* RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kOversized: return "oversized";
    case RejectReason::kNotOpGuard: return "not_opguard";
    case RejectReason::kMalformed: return "malformed";
    case RejectReason::kSchemaMajor: return "schema_major";
    case RejectReason::kWrongMessage: return "wrong_message";
    case RejectReason::kInvalidBatch: return "invalid_batch";
    case RejectReason::kLimit:
      return "limit";
    case RejectReason::kOwner: return "owner";
    case RejectReason::kCount: break;
  }
  return "unknown";
}

void Metrics::AddSaturating(std::atomic<uint64_t>* counter, uint64_t n) {
  uint64_t old = counter->load(std::memory_order_relaxed);
  while (!counter->compare_exchange_weak(old, SaturatingAdd(old, n), std::memory_order_relaxed)) {
  }
}

void Metrics::ObserveAck(uint64_t micros) {
  size_t i = 0;
  const double s = static_cast<double>(micros) / 1e6;
  while (i < kAckBuckets.size() && s > kAckBuckets[i]) ++i;
  ack_buckets[i].fetch_add(1, std::memory_order_relaxed);
  ack_count.fetch_add(1, std::memory_order_relaxed);
  ack_sum_micros.fetch_add(micros, std::memory_order_relaxed);
}

uint64_t Metrics::RejectedTotal() const {
  uint64_t total = 0;
  for (const auto& r : rejected) total += r.load(std::memory_order_relaxed);
  return total;
}

namespace {
void Line(std::string* out, const char* name, const char* labels, double value) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s%s %.17g\n", name, labels, value);
  out->append(buf);
}
void Head(std::string* out, const char* name, const char* type, const char* help) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
}
double L(const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); }
}  // namespace

std::string Metrics::Prometheus(const Store& store, uint64_t runs, double uptime_s) const {
  std::string o;
  o.reserve(8192);
  Head(&o, "opguard_records_ingested_total", "counter", "Records stored, by kind.");
  Line(&o, "opguard_records_ingested_total", "{kind=\"op\"}", L(ops));
  Line(&o, "opguard_records_ingested_total", "{kind=\"collective\"}", L(collectives));
  Line(&o, "opguard_records_ingested_total", "{kind=\"string\"}", L(strings));
  Line(&o, "opguard_records_ingested_total", "{kind=\"site\"}", L(sites));
  Line(&o, "opguard_records_ingested_total", "{kind=\"source\"}", L(sources));
  Line(&o, "opguard_records_ingested_total", "{kind=\"step\"}", L(steps));
  Head(&o, "opguard_ingest_bytes_total", "counter", "Bytes of accepted batches.");
  Line(&o, "opguard_ingest_bytes_total", "", L(bytes_received));
  Head(&o, "opguard_batches_total", "counter", "Batches acknowledged durable (duplicates: resends already stored).");
  Line(&o, "opguard_batches_total", "{result=\"durable\"}", L(batches_durable));
  Line(&o, "opguard_batches_total", "{result=\"duplicate\"}", L(batches_duplicate));
  Head(&o, "opguard_batches_rejected_total", "counter", "Messages rejected on ingest, by reason.");
  for (int i = 0; i < kRejectReasonCount; ++i) {
    std::string labels = std::string("{reason=\"") + RejectReasonName(static_cast<RejectReason>(i)) + "\"}";
    Line(&o, "opguard_batches_rejected_total", labels.c_str(), L(rejected[i]));
  }
  Head(&o, "opguard_gap_notices_total", "counter", "Gap notices received from shims.");
  Line(&o, "opguard_gap_notices_total", "", L(gap_notices));
  Head(&o, "opguard_gap_records_total", "counter", "Records the shims reported dropped.");
  Line(&o, "opguard_gap_records_total", "", L(gap_records));

  Head(&o, "opguard_ack_latency_seconds", "histogram", "Batch received to durable ack sent.");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kAckBuckets.size(); ++i) {
    cumulative += ack_buckets[i].load(std::memory_order_relaxed);
    char labels[64];
    std::snprintf(labels, sizeof labels, "{le=\"%g\"}", kAckBuckets[i]);
    Line(&o, "opguard_ack_latency_seconds_bucket", labels, static_cast<double>(cumulative));
  }
  cumulative += ack_buckets[kAckBuckets.size()].load(std::memory_order_relaxed);
  Line(&o, "opguard_ack_latency_seconds_bucket", "{le=\"+Inf\"}", static_cast<double>(cumulative));
  Line(&o, "opguard_ack_latency_seconds_sum", "", L(ack_sum_micros) / 1e6);
  Line(&o, "opguard_ack_latency_seconds_count", "", L(ack_count));

  Head(&o, "opguard_commit_groups_total", "counter", "Synced RocksDB writes (group commits).");
  Line(&o, "opguard_commit_groups_total", "", L(commit_groups));
  Head(&o, "opguard_commit_batches_total", "counter", "Batches covered by group commits.");
  Line(&o, "opguard_commit_batches_total", "", L(commit_batches));
  Head(&o, "opguard_commit_seconds_total", "counter", "Time spent in synced writes.");
  Line(&o, "opguard_commit_seconds_total", "", L(commit_seconds_micros) / 1e6);
  Head(&o, "opguard_store_errors_total", "counter", "Failed store writes.");
  Line(&o, "opguard_store_errors_total", "", L(store_errors));
  Head(&o, "opguard_ingest_exceptions_total", "counter",
       "Ingest messages whose handling threw; each got a Rejected ack and the daemon went on.");
  Line(&o, "opguard_ingest_exceptions_total", "", L(ingest_exceptions));
  Head(&o, "opguard_queries_total", "counter", "Queries answered over ZeroMQ.");
  Line(&o, "opguard_queries_total", "", L(queries));
  Head(&o, "opguard_query_errors_total", "counter", "Queries answered with an error.");
  Line(&o, "opguard_query_errors_total", "", L(query_errors));
  Head(&o, "opguard_http_requests_total", "counter", "HTTP requests served.");
  Line(&o, "opguard_http_requests_total", "", L(http_requests));
  Head(&o, "opguard_http_connections", "gauge",
       "Open HTTP connections (at most http.max_connections).");
  Line(&o, "opguard_http_connections", "", L(http_connections));
  Head(&o, "opguard_http_accept_backoffs_total", "counter",
       "Times HTTP stopped accepting for 100 ms: at http.max_connections or out of file "
       "descriptors.");
  Line(&o, "opguard_http_accept_backoffs_total", "", L(http_accept_backoffs));
  Head(&o, "opguard_runs_deleted_total", "counter", "Runs removed (opguard rm and retention).");
  Line(&o, "opguard_runs_deleted_total", "", L(runs_deleted));
  Head(&o, "opguard_queries_denied_total", "counter",
       "Admin requests refused: sent over TCP, or by a uid that neither owns the run nor administers "
       "the daemon.");
  Line(&o, "opguard_queries_denied_total", "", L(queries_denied));
  Head(&o, "opguard_queries_cancelled_total", "counter",
       "Aligner queries (diff, ranks, collectives, alignment) stopped before their answer: the "
       "client went away, or the query ran past query.time_budget.");
  Line(&o, "opguard_queries_cancelled_total", "{reason=\"client_gone\"}", L(queries_client_gone));
  Line(&o, "opguard_queries_cancelled_total", "{reason=\"time_budget\"}", L(queries_over_budget));
  Head(&o, "opguard_explanations_asked_total", "counter",
       "Explanations asked of explain.endpoint (kept ones are answered without a call).");
  Line(&o, "opguard_explanations_asked_total", "", L(explanations_asked));
  Head(&o, "opguard_curve_denied_total", "counter",
       "CURVE handshakes refused: the client's public key is not in curve.authorized_keys.");
  Line(&o, "opguard_curve_denied_total", "", L(curve_denied));
  Head(&o, "opguard_http_evicted_total", "counter",
       "HTTP connections closed at http.max_connections because they had waited longest (over 1 s) for "
       "a request, so that a new client is served (slowloris).");
  Line(&o, "opguard_http_evicted_total", "", L(http_evicted));
  Head(&o, "opguard_http_misdirected_total", "counter",
       "HTTP requests answered 421: their Host header names neither this daemon's address, localhost, "
       "its host name nor http.host_names.");
  Line(&o, "opguard_http_misdirected_total", "", L(http_misdirected));
  Head(&o, "opguard_sources_refused_total", "counter",
       "Source files larger than ingest.max_source_bytes, not stored (the rest of their batch is).");
  Line(&o, "opguard_sources_refused_total", "", L(sources_refused));
  Head(&o, "opguard_http_unauthorized_total", "counter",
       "HTTP requests from off loopback answered 401: no token, or a wrong one.");
  Line(&o, "opguard_http_unauthorized_total", "", L(http_unauthorized));

  Head(&o, "opguard_dedup_deferred_total", "counter",
       "Batches answered \"retry later\" because their session already had the most ranges of "
       "out-of-order seqs the daemon keeps (their senders send them again).");
  Line(&o, "opguard_dedup_deferred_total", "", L(dedup_deferred));
  Head(&o, "opguard_batches_text_repaired_total", "counter",
       "Batches holding text that was not UTF-8 (a setting, an interned string, a communicator name, "
       "a gap reason), stored with each bad byte written as a hex escape.");
  Line(&o, "opguard_batches_text_repaired_total", "", L(text_repaired));
  Head(&o, "opguard_dedup_checked_total", "counter",
       "Batches of a session forgotten and sent again, applied with each record checked against "
       "the store so that counters count distinct records.");
  Line(&o, "opguard_dedup_checked_total", "", L(dedup_checked));
  Head(
      &o, "opguard_ingest_inflight_bytes", "gauge",
      "Bytes of batches received and not yet acknowledged (bounded by ingest.max_inflight_bytes).");
  Line(&o, "opguard_ingest_inflight_bytes", "", L(inflight_bytes));
  Head(&o, "opguard_ingest_paused_seconds_total", "counter",
       "Time ingest stopped reading because ingest.max_inflight_bytes was reached (backpressure).");
  Line(&o, "opguard_ingest_paused_seconds_total", "", L(ingest_paused_micros) / 1e6);

  Head(&o, "opguard_ingest_read_only", "gauge",
       "1 while new records are refused for disk space (storage.reserved_bytes, storage.reserved_inodes, "
       "storage.max_bytes, ENOSPC); queries and rm go on.");
  Line(&o, "opguard_ingest_read_only", "", L(read_only));
  Head(&o, "opguard_ingest_read_only_entered_total", "counter", "Times ingest paused for disk space.");
  Line(&o, "opguard_ingest_read_only_entered_total", "", L(read_only_entered));
  Head(&o, "opguard_batches_deferred_total", "counter",
       "Batches answered \"retry later\" while ingest was paused for disk space (their senders keep them).");
  Line(&o, "opguard_batches_deferred_total", "", L(batches_deferred));
  Head(&o, "opguard_store_resumes_total", "counter",
       "Times the store, stopped by a write that found no space, was resumed once space was back.");
  Line(&o, "opguard_store_resumes_total", "", L(store_resumes));
  Head(&o, "opguard_store_read_errors_total", "counter",
       "Damaged stored values (checksum mismatch, undecodable) answered as gaps.");
  Line(&o, "opguard_store_read_errors_total", "", static_cast<double>(store.read_errors()));
  Head(&o, "opguard_store_free_bytes", "gauge", "Free bytes on the data directory's file system.");
  Line(&o, "opguard_store_free_bytes", "", static_cast<double>(store.FreeBytes()));
  Head(&o, "opguard_store_free_inodes", "gauge",
       "Free inodes on the data directory's file system (-1: no inode limit).");
  const uint64_t inodes = store.FreeInodes();
  Line(&o, "opguard_store_free_inodes", "", inodes == UINT64_MAX ? -1.0 : static_cast<double>(inodes));

  Head(&o, "opguard_runs", "gauge", "Runs stored.");
  Line(&o, "opguard_runs", "", static_cast<double>(runs));
  Head(&o, "opguard_uptime_seconds", "gauge", "Seconds since the daemon started.");
  Line(&o, "opguard_uptime_seconds", "", uptime_s);
  Head(&o, "opguard_store_disk_bytes", "gauge", "Bytes of all files in the data directory.");
  Line(&o, "opguard_store_disk_bytes", "", static_cast<double>(store.DiskBytes()));
  Head(&o, "opguard_rocksdb_sst_bytes", "gauge", "SST bytes per column family.");
  for (int i = 0; i < kCfCount; ++i) {
    std::string labels = std::string("{cf=\"") + CfName(static_cast<Cf>(i)) + "\"}";
    Line(&o, "opguard_rocksdb_sst_bytes", labels.c_str(),
         static_cast<double>(store.CfSstBytes(static_cast<Cf>(i))));
  }
  Head(&o, "opguard_rocksdb_memtable_bytes", "gauge", "Bytes in memtables.");
  Line(&o, "opguard_rocksdb_memtable_bytes", "",
       static_cast<double>(store.IntProperty("rocksdb.cur-size-all-mem-tables")));
  Head(&o, "opguard_rocksdb_estimated_keys", "gauge", "RocksDB's estimate of live keys.");
  Line(&o, "opguard_rocksdb_estimated_keys", "",
       static_cast<double>(store.IntProperty("rocksdb.estimate-num-keys")));
  Head(&o, "opguard_rocksdb_pending_compaction_bytes", "gauge", "Bytes compaction still has to rewrite.");
  Line(&o, "opguard_rocksdb_pending_compaction_bytes", "",
       static_cast<double>(store.IntProperty("rocksdb.estimate-pending-compaction-bytes")));
  return o;
}

}  // namespace opguard::daemon
