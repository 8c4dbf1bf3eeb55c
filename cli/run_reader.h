// Reads one run's stored ops back from a daemon, lane by lane, through the
// paged ReadTrace query (idl/query.fbs), with the strings and call sites they
// name. The Perfetto export uses it; it holds one lane's records at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "opguard/aligner/trace.h"
#include "opguard/common/status.h"
#include "opguard/daemon/client.h"

namespace opguard::cli {

class RunReader {
 public:
  struct LaneStart {
    uint32_t lane = 0;
    uint64_t start_ns = 0;     // of the lane's first op
    uint64_t duration_ns = 0;  // of the lane's first op
  };
  struct Site {
    std::string file;
    uint32_t line = 0;
    std::string function;
  };

  RunReader(daemon::DaemonClient* client, std::string run)
      : client_(client), run_(std::move(run)) {}

  const std::string& run() const { return run_; }
  // The lanes of `rank` that hold ops, ascending, each with its first op's
  // time: one small page per lane.
  Result<std::vector<LaneStart>> Lanes(uint32_t rank);
  // Every op of (rank, lane), in op order; `progress` is told the count so far.
  Result<std::vector<aligner::OpDetail>> ReadLane(uint32_t rank, uint32_t lane,
                                                  const std::function<void(size_t)>& progress);

  // Text of a string id the ops read so far named; hex when unknown.
  std::string String(uint64_t id) const;
  // A site the ops read so far named; null when unknown (or id 0).
  const Site* SiteOf(uint64_t id) const;
  // The line-shift-tolerant identity the aligner keys on (aligner::BoundaryId),
  // with the line number standing in for the line's text: the CLI does not
  // fetch source files. 0 for an unknown site.
  uint64_t Boundary(uint64_t site) const;

 private:
  // One ReadTrace page; records strings and sites; *next_lane set from the answer.
  Result<daemon::Answer> Page(uint32_t rank, uint32_t lane, uint64_t from_op, uint32_t max_ops);

  daemon::DaemonClient* client_;
  std::string run_;
  std::unordered_map<uint64_t, std::string> strings_;
  std::unordered_map<uint64_t, Site> sites_;
};

}  // namespace opguard::cli
