// Queries: one service, several faces. QueryService computes answers from
// the durable run registry and the store; QueryServer (query_server.h)
// answers FlatBuffers envelopes on the ZeroMQ query endpoint (CLI, peer
// daemons); the HTTP server renders the same answers as JSON, through the
// renderers the CLI uses (report_wire.h, status_json.h). Every method is
// safe from any thread.
//
// Included by daemon.cc and the rest of the query room.
#pragma once

#include <utility>  // before Boost.Asio: GCC 12 + C++20 needs it first

#include <boost/asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "access/access.h"
#include "metrics.h"
#include "opguard/daemon/config.h"
#include "query/alignment_view.h"
#include "query/cluster.h"
#include "query/explain.h"
#include "query/plans.h"
#include "query/trace_cache.h"
#include "registry/run_registry.h"
#include "storage/store.h"

namespace opguard::daemon {

struct TracePage {
  std::vector<std::string> ops;  // stored OpRecord buffers, in op order
  std::map<uint64_t, std::string> strings;
  std::map<uint64_t, SiteDef> sites;
  uint64_t next_op = 0;
  bool done = true;
  int64_t next_lane = -1;  // the rank's next lane with ops, -1: none
};

// Who sent a query (query_server.cc): admin requests (DeleteRunRequest)
// are taken only from a unix query socket, from a uid allowed to change the
// run (access/access.h). HTTP and TCP callers carry no uid.
struct Caller {
  bool unix_socket = false;
  std::optional<uint32_t> uid;  // SO_PEERCRED, through ZeroMQ's Peer-Address
};

class QueryService {
 public:
  // `writer` carries out deletions and says whether the store failed.
  const Config& config() const { return config_; }
  QueryService(const Config& config, Store* store, const RunRegistry* registry, RunWriter* writer,
               Metrics* metrics);

  // The bound HTTP address, once known (main thread, before serving).
  void SetHttpAddress(std::string address);

  std::vector<RunState> ListRuns() const;
  Result<RunState> GetRun(const std::string& name) const;
  Result<TracePage> ReadTrace(const std::string& run, uint32_t rank, uint32_t lane, uint64_t from_op,
                              uint32_t max_ops) const;
  // Removes a run for `caller` when it may (access/access.h); refusals are
  // counted in opguard_queries_denied_total.
  Status DeleteRun(const std::string& name, const Caller& caller);
  // Preflight plans (query/plans.h). Preflight compares two runs' ranks held
  // here and stores the plan: an aligner request (RunAligner). Deleting
  // follows DeleteRun's rules, against the uid that made the plan.
  Result<nlohmann::json> Preflight(const std::string& run_a, const std::string& run_b, const std::string& name,
                                   uint64_t max_steps, bool replace, const Caller& caller,
                                   const CancelToken* cancel);
  Result<std::vector<nlohmann::json>> Plans(const std::string& name) const;
  Status DeletePlan(const std::string& name, const Caller& caller);
  // A run is gone (rm, retention): its cached traces are dropped. Any thread.
  void ForgetRun(uint64_t run_id) { traces_.Forget(run_id); }

  // A verified request envelope in, an answer envelope out (ErrorAnswer on
  // any failure, never throws). Aligner requests block for as long as the
  // alignment takes: callers run those through RunAligner, with the query's
  // token as `cancel`.
  std::string Answer(const void* data, size_t size, const Caller& caller = {},
                     const CancelToken* cancel = nullptr);

  // Whether `data` is an aligner request (diff, ranks, collectives), which
  // must not run on the ZeroMQ or Asio threads; *local_only is set for a
  // peer's request.
  static bool IsAlignerRequest(const void* data, size_t size, bool* local_only);
  // A new aligner query's token: query.time_budget from now, and the
  // daemon's shutdown. The thread serving its client cancels it when the
  // client goes away (HTTP: the connection closes; ZeroMQ: query_server.h).
  std::shared_ptr<CancelToken> NewQueryToken();
  // Runs `job` on an aligner worker thread ("og-align"). Peers' requests
  // (local_only) get their own pool, so a daemon whose workers all wait for
  // peers still answers the peers that wait for it. A job whose `token` was
  // cancelled is counted in opguard_queries_cancelled_total; a job still
  // queued when it is cancelled stops at its first check point. Any thread.
  void RunAligner(bool local_only, std::shared_ptr<const CancelToken> token, std::function<void()> job);
  // Cancels running alignments and joins the workers (shutdown, main thread,
  // before the query server and the store stop).
  void StopAligner();

  // JSON faces of the aligner queries (docs/report-format.md); they fan out
  // to the peers like the ZeroMQ requests and stop when `cancel` (may be
  // null) is cancelled. Aligner worker threads only.
  Result<nlohmann::json> DiffJson(const std::string& reference, const std::string& suspect, int64_t rank,
                                  uint32_t peer_timeout_ms, const CancelToken* cancel);
  Result<nlohmann::json> RanksJson(const std::string& run, const std::vector<uint32_t>& replicas,
                                   uint32_t peer_timeout_ms, const CancelToken* cancel);
  Result<nlohmann::json> CollectivesJson(const std::string& run, uint32_t peer_timeout_ms,
                                         const CancelToken* cancel);
  // Rows [from, from + count) of one lane's two-run alignment, for the
  // viewer (alignment_view.h); this daemon's ranks only. Aligner workers only.
  Result<nlohmann::json> AlignmentJson(const std::string& reference, const std::string& suspect,
                                       uint32_t rank, uint32_t lane, uint64_t from, uint64_t count,
                                       std::optional<uint64_t> locate_sus, const CancelToken* cancel);
  // A source file `run` sent, by the path its call sites name; NotFound for
  // any file the run did not send (nothing is read from this machine's disk).
  Result<nlohmann::json> SourceJson(const std::string& run, const std::string& file) const;
  // Scrubs run `name` ("": the whole store) and answers what is damaged,
  // found now or by any read since the daemon started (Store::Scrub).
  Result<nlohmann::json> VerifyJson(const std::string& name, const CancelToken* cancel) const;
  // The lanes of a rank with their last op index (the viewer sizes its lists).
  Result<nlohmann::json> LanesJson(const std::string& run, uint32_t rank) const;
  // An explanation in prose of a diff's evidence (query/explain.h): the kept
  // one, or with `ask` a new one from explain.endpoint when none is kept.
  // NotFound-free: an unconfigured endpoint is InvalidArgument, so HTTP
  // never forwards it to peers. Aligner worker threads only.
  Result<nlohmann::json> ExplainJson(const std::string& reference, const std::string& suspect, bool ask,
                                     const CancelToken* cancel);

  // The HTTP JSON API without forwarding, as a peer's ApiRequest gets it:
  // {HTTP status, JSON body} for a target IsForwardableApiRoute accepts. Set
  // once by the daemon before serving; without it peers' requests fail.
  using ApiRouter =
      std::function<std::pair<int, std::string>(const std::string& target, const CancelToken* cancel)>;
  void SetApiRouter(ApiRouter router);
  // Whether peers are configured, and the first peer answer to a forwardable
  // JSON API target this node answered 404 (ClusterQueries::ForwardApi,
  // bounded by the default peer timeout). Aligner worker threads only.
  bool HasPeers() const { return cluster_.HasPeers(); }
  std::optional<std::pair<int, std::string>> ForwardApi(const std::string& target);

  // JSON faces (docs/daemon.md documents the fields), rendered from the
  // answers below.
  nlohmann::json RunJson(const RunState& run) const;
  nlohmann::json RunsJson() const;
  nlohmann::json StatusJson() const;
  nlohmann::json TraceJson(const std::string& run, uint32_t rank, uint32_t lane,
                           const TracePage& page) const;

 private:
  flatbuffers::Offset<wire::ListRunsAnswer> ListRunsAnswer(flatbuffers::FlatBufferBuilder& b) const;
  flatbuffers::Offset<wire::StatusAnswer> StatusAnswer(flatbuffers::FlatBufferBuilder& b) const;

  const Config config_;
  Store* store_;
  const RunRegistry* registry_;
  RunWriter* writer_;
  Metrics* metrics_;
  const AdminPolicy admin_;
  const std::chrono::steady_clock::time_point started_;
  mutable std::mutex mu_;
  std::string http_address_;
  ApiRouter api_router_;  // set before serving, read-only after
  TraceCache traces_;     // before its users
  PlanStore plans_;
  ClusterQueries cluster_;
  AlignmentViews alignments_;
  Explainer explainer_;
  boost::asio::thread_pool align_pool_{2};  // requests from the CLI and HTTP
  boost::asio::thread_pool peer_pool_{2};   // local_only requests from peer daemons
  std::atomic<bool> aligner_stopped_{false};
};

// Hex of a fingerprint as 32 digits: bytes 0..15 of the digest in order.
std::string FingerprintHex(const void* fp128);

}  // namespace opguard::daemon
