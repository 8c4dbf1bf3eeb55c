// The two-lane alignment the web viewer pages through (GET /api/alignment):
// one lane of one rank of two runs, aligned by aligner::AlignLane exactly as
// `diff` aligns it, flattened into rows (a pair, or an op of one run without
// a partner) and kept for the next pages. A viewer scrolling a million-op
// lane asks for a few hundred rows at a time; aligning per page would cost
// seconds each, so the last few alignments are cached, keyed by the runs'
// ids and op counts (a run still recording gets a fresh alignment).
//
// Threads: Get blocks for as long as loading and aligning take; aligner
// worker threads only. The cache is shared and locked; views are immutable.
//
// Private to the query room (QueryService owns one).
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "opguard/aligner/trace.h"
#include "opguard/common/status.h"
#include "query/trace_cache.h"
#include "registry/run_state.h"
#include "storage/store.h"

namespace opguard::daemon {

struct AlignmentView {
  // Row flags: aligner::Pair's (reordered, changed site, by data) and ours.
  static constexpr uint32_t kDiffers = 1u << 8;  // a pair whose output fingerprints differ
  struct Row {
    int64_t ref = -1;  // position in ref.ops, -1: the suspect's op has no partner
    int64_t sus = -1;
    uint32_t flags = 0;
  };
  AlignmentView(const Store* store, uint64_t ref_run, uint64_t sus_run)
      : ref_strings(store, ref_run), sus_strings(store, sus_run) {}
  aligner::LaneTrace ref, sus;
  std::vector<Row> rows;
  std::vector<uint32_t> lanes;       // every lane of the rank, in either run
  int64_t first_differing_row = -1;  // first pair with differing outputs, neither nondeterministic
  uint64_t pairs = 0;
  StoreStrings ref_strings, sus_strings;
};

class AlignmentViews {
 public:
  AlignmentViews(const Store* store, TraceCache* traces) : store_(store), traces_(traces) {}
  Result<std::shared_ptr<const AlignmentView>> Get(const RunState& ref, const RunState& sus,
                                                   uint32_t rank, uint32_t lane,
                                                   const CancelToken* cancel);

 private:
  const Store* store_;
  TraceCache* traces_;  // may be null
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const AlignmentView>>>
      cache_;  // most recent first
};

// Rows [from, from + count) of `view` as JSON (docs/viewer.md); `locate_sus`
// set: also the row of that suspect op index ("located", null if absent).
nlohmann::json AlignmentPageJson(const AlignmentView& view, uint64_t from, uint64_t count,
                                 std::optional<uint64_t> locate_sus);

}  // namespace opguard::daemon
