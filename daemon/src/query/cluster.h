// The aligner next to the data, and the cluster fan-out (docs/daemon.md,
// "Cluster queries").
//
// ClusterQueries answers DiffRequest, RanksRequest and CollectivesRequest.
// A request with local_only = false (from the CLI or HTTP) makes this daemon
// the receiver: it asks every peer the same question with local_only = true,
// in parallel and bounded by the request's peer timeout, while it aligns the
// ranks it holds itself; then it merges the small per-rank answers
// (aligner::MergeRankDiffs, CheckCollectives). Peers answer with RankDiffs
// (pivots with their collective positions) and one summary record per
// collective and rank; no trace ever leaves its node. A peer that does not
// answer in time leaves its ranks missing: the answer is `partial` and names
// them (expected ranks come from the runs' world size).
//
// Threads: every method blocks for as long as the alignment takes and is
// called on an aligner worker thread (QueryService's pools), never on the
// ZeroMQ or Asio threads. Methods are safe to call concurrently.
//
// Private to the query room (QueryService owns one).
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "opguard/common/cancel.h"
#include "opguard/daemon/config.h"
#include "opguard/idl/envelope.h"
#include "registry/run_registry.h"
#include "storage/store.h"

namespace opguard::daemon {

class TraceCache;

inline constexpr std::chrono::milliseconds kDefaultPeerTimeout{10000};

class ClusterQueries {
 public:
  // `traces` (may be null: no cache) keeps rank traces between queries.
  ClusterQueries(const Config& config, const Store* store, const RunRegistry* registry, TraceCache* traces,
                 std::string node);

  // Each returns a finished answer envelope (DiffAnswer, RanksAnswer,
  // CollectivesAnswer) or an error Status (unknown runs, store errors, a
  // cancelled query: `cancel` is checked while this node reads and aligns;
  // peers' answers are bounded by the peer timeout).
  Result<std::string> Diff(const wire::DiffRequest& q, const CancelToken* cancel = nullptr);
  Result<std::string> Ranks(const wire::RanksRequest& q, const CancelToken* cancel = nullptr);
  Result<std::string> Collectives(const wire::CollectivesRequest& q,
                                  const CancelToken* cancel = nullptr);

  // A JSON API GET this node answered 404 (it does not hold the run or rank
  // the target names), asked of every peer in parallel (ApiRequest): the
  // first peer answer in the peers' order that is not a 404, as {HTTP status,
  // JSON body}; nullopt when every peer answered 404 or failed to answer
  // within `timeout`.
  std::optional<std::pair<int, std::string>> ForwardApi(const std::string& target,
                                                        std::chrono::milliseconds timeout);
  bool HasPeers() const;

 private:
  const Config config_;
  const Store* store_;
  const RunRegistry* registry_;
  TraceCache* traces_;
  const std::string node_;
};

}  // namespace opguard::daemon
