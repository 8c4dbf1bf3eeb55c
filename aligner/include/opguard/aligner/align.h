// Structural alignment of one lane of two runs (docs/alignment.md).
//
// Pairs ops whose structural keys are equal, tolerating ops inserted or
// deleted in either run and locally reordered independent ops. Unpaired ops
// are unaligned. Output fingerprints never decide a pairing, so a divergence
// can never make ops unpairable (and an insertion can never look like a
// divergence); input fingerprints do where the structure cannot (see
// PairByData in align.cc): the same op on the same data is the same
// computation, whatever line issued it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opguard/aligner/trace.h"

namespace opguard::aligner {

struct AlignOptions {
  // Anchor = this many consecutive equal keys, starting at a deterministic op.
  uint32_t anchor_length = 8;
  // How far (ops, per run) the anchor search looks past a mismatch before it
  // gives up and matches a bounded window without an anchor.
  uint32_t max_lookahead = 4096;
  // Extra half-width of the DP band around the window's diagonal.
  uint32_t band = 64;
  // DP cells (one byte each) one window may use; larger windows fall back to
  // an O(W log W) occurrence match (noted in the result).
  uint64_t max_window_cells = uint64_t{1} << 24;
  // DP cells all windows of one lane may use together; bounds total time when
  // two runs are very different. Past it, windows use the fallback.
  uint64_t max_total_cells = uint64_t{1} << 28;
  // The rescue pass pairs leftover ops of a window whose relative positions
  // differ by at most this many ops (locally reordered ops).
  uint32_t rescue_distance = 64;
};

// Positions are indices into the two LaneTrace::ops vectors (not op_index).
struct Pair {
  static constexpr uint32_t kReordered = 1u << 0;     // paired by the rescue pass
  static constexpr uint32_t kChangedSite = 1u << 1;   // paired across an edited source line
  static constexpr uint32_t kByData = 1u << 2;        // paired by equal inputs (same computation)
  uint32_t ref = 0;
  uint32_t sus = 0;
  uint32_t flags = 0;
};

struct Alignment {
  std::vector<Pair> pairs;   // ascending `ref`; `sus` ascending except reordered pairs
  uint64_t reordered = 0;    // pairs made by the rescue pass
  uint64_t changed_site = 0; // pairs made across edited source lines
  uint64_t by_data = 0;      // pairs made by equal inputs where the structure disagreed
  uint64_t windows = 0;      // mismatch windows resolved
  uint64_t largest_window = 0;  // max(ref ops, suspect ops) of any window
  uint64_t dp_cells = 0;     // DP cells used in total
  bool degraded = false;     // a bound was hit: some windows used the fallback
  std::vector<std::string> notes;  // why, in a line each (at most a few)
};

// Then the data decides where the structure is ambiguous or silent: an
// unpaired reference op, or one paired with unequal inputs, takes a nearby
// suspect op with the same name and equal input fingerprints (kByData).
//
// Last, ops left unpaired on both sides between the same two consecutive
// pairs (at most rescue_distance per side) are paired in order by loose key
// (same op and shapes on a source line whose text changed between the runs:
// the code was edited there, so their values are evidence), flagged
// kChangedSite and noted.
//
// Aligns one lane. O(n) when the runs are identical; O(n + E·(D + K)) for E
// mismatch windows of resync distance D; DP bounded by the options.
Alignment AlignLane(const std::vector<OpEvent>& ref, const std::vector<OpEvent>& sus,
                    const AlignOptions& options = {});

}  // namespace opguard::aligner
