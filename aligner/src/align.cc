#include "opguard/aligner/align.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>

#include "hash.h"

namespace opguard::aligner {
namespace {

constexpr size_t kMaxNotes = 4;
constexpr int64_t kNeg = std::numeric_limits<int64_t>::min() / 2;
// Below this many candidates the anchor search scans vectors; a hash map only
// pays off for long resync distances.
constexpr size_t kLinearScanLimit = 32;
// How much an anchor's skew (implied unaligned ops) outweighs its distance.
// A copy of the k-gram one layer away in one run only has a skew of about a
// layer; the true resync point has the (small) net insert count.
constexpr size_t kSkewWeight = 4;

enum : uint8_t { kStop = 0, kDiag = 1, kUp = 2, kLeft = 3 };

// Positions of one run's ops by computation (op name and input digest),
// ascending, built on first use: where PairByData looks for an op's true
// partner beyond rescue_distance. Preflight-nondeterministic ops are left
// out (they are never evidence).
class ComputationIndex {
 public:
  explicit ComputationIndex(const std::vector<OpEvent>& ops) : ops_(ops) {}

  // The position nearest `expected` (within `reach`) of an op computing
  // what `e` computes for which `accept(position)` holds; -1 when none. At
  // most kCandidates positions are tried, so a computation repeated
  // everywhere costs O(1) per look-up.
  template <class Accept>
  int64_t Nearest(const OpEvent& e, int64_t expected, int64_t reach, Accept accept) {
    if (!built_) Build();
    auto it = at_.find(Key(e));
    if (it == at_.end()) return -1;
    const std::vector<uint32_t>& at = it->second;
    auto hi = std::lower_bound(at.begin(), at.end(), static_cast<uint32_t>(std::max<int64_t>(expected, 0)));
    auto lo = hi;
    for (int tried = 0; tried < kCandidates && (lo != at.begin() || hi != at.end()); ++tried) {
      const int64_t below = lo != at.begin() ? expected - *(lo - 1) : std::numeric_limits<int64_t>::max();
      const int64_t above = hi != at.end() ? *hi - expected : std::numeric_limits<int64_t>::max();
      if (std::min(below, above) > reach) break;
      const uint32_t p = below <= above ? *--lo : *hi++;
      if (accept(size_t{p})) return p;
    }
    return -1;
  }

 private:
  static constexpr int kCandidates = 256;
  static uint64_t Key(const OpEvent& e) { return Mix64(e.name ^ Mix64(e.inputs.lo ^ Mix64(e.inputs.hi))); }
  void Build() {
    built_ = true;
    for (size_t p = 0; p < ops_.size(); ++p) {
      if (!ops_[p].nondeterministic()) at_[Key(ops_[p])].push_back(static_cast<uint32_t>(p));
    }
  }

  const std::vector<OpEvent>& ops_;
  bool built_ = false;
  std::unordered_map<uint64_t, std::vector<uint32_t>> at_;
};

class LaneAligner {
 public:
  LaneAligner(const std::vector<OpEvent>& ref, const std::vector<OpEvent>& sus,
              const AlignOptions& options, Alignment* out)
      : r_(ref), s_(sus), o_(options), out_(out) {
    if (o_.anchor_length == 0) o_.anchor_length = 1;
  }

  void Run() {
    const size_t n = r_.size(), m = s_.size();
    out_->pairs.reserve(std::min(n, m));
    size_t i = 0, j = 0;
    while (i < n && j < m) {
      // Fast path: long identical stretches cost one key compare per op.
      if (r_[i].key == s_[j].key) {
        out_->pairs.push_back(Pair{static_cast<uint32_t>(i), static_cast<uint32_t>(j), 0});
        ++i;
        ++j;
        continue;
      }
      size_t ai = 0, aj = 0;
      // Near the end of either run a true anchor may not fit; a DP over the
      // rest is exact there and small.
      const bool tail = std::min(n - i, m - j) <= 4 * size_t{o_.anchor_length};
      if (!tail && FindAnchor(i, j, &ai, &aj)) {
        MatchWindow(i, ai, j, aj);
        i = ai;
        j = aj;
        continue;
      }
      const size_t span = size_t{o_.max_lookahead} + o_.anchor_length;
      const size_t bi = std::min(n, i + span), bj = std::min(m, j + span);
      if (bi < n && bj < m) {
        Note("no anchor within " + std::to_string(o_.max_lookahead) + " ops after reference op #" +
             std::to_string(r_[i].op_index) + " / suspect op #" + std::to_string(s_[j].op_index) +
             ": matched a bounded window without one");
      }
      MatchWindow(i, bi, j, bj);
      i = bi;
      j = bj;
    }
    PairByData();
    PairChangedSites();
  }

 private:
  uint64_t GramHash(const std::vector<OpEvent>& v, size_t p) const {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (size_t k = 0; k < o_.anchor_length; ++k) {
      h = (h ^ v[p + k].key) * 0xff51afd7ed558ccdULL;
      h ^= h >> 32;
    }
    return Mix64(h);
  }

  bool GramEqual(size_t p, size_t q) const {
    for (size_t k = 0; k < o_.anchor_length; ++k) {
      if (r_[p + k].key != s_[q + k].key) return false;
    }
    return true;
  }

  // Resync point after a mismatch at (i, j): a pair (p, q) where
  // anchor_length keys starting at p and q are equal and p is a deterministic
  // op. Candidates are ranked by max(d1, d2) + |d1 - d2| for d1 = p - i,
  // d2 = q - j: the skew |d1 - d2| is a lower bound on the ops the window
  // leaves unaligned, the max is how far away the anchor is. Plain nearest
  // distance would be wrong with repeated identical layers: the same k-gram
  // one layer further in one run only is "near" but shifts every later pair
  // by a layer. The search expands both runs one op at a time and stops once
  // no unseen candidate can score better (anything first seen at step s
  // scores >= s), so a small edit costs a small search.
  bool FindAnchor(size_t i, size_t j, size_t* ai, size_t* aj) {
    const size_t k = o_.anchor_length, n = r_.size(), m = s_.size();
    if (n - i < k || m - j < k) return false;
    const size_t lim_r = std::min<size_t>(o_.max_lookahead, n - k - i);
    const size_t lim_s = std::min<size_t>(o_.max_lookahead, m - k - j);
    seen_r_.clear();
    seen_s_.clear();
    map_r_.clear();
    map_s_.clear();
    bool use_map = false;
    constexpr size_t kNone = std::numeric_limits<size_t>::max();
    size_t best_score = kNone;
    cands_.clear();  // best candidate per diagonal (q - j) - (p - i)
    auto consider = [&](size_t p, size_t q) {
      if (!GramEqual(p, q)) return;  // hash collision
      size_t d1 = p - i, d2 = q - j;
      size_t skew = d1 > d2 ? d1 - d2 : d2 - d1;
      size_t score = std::max(d1, d2) + kSkewWeight * skew;
      best_score = std::min(best_score, score);
      int64_t diag = static_cast<int64_t>(d2) - static_cast<int64_t>(d1);
      for (Candidate& c : cands_) {
        if (c.diag == diag) {
          if (score < c.score) c = Candidate{diag, score, p, q};
          return;
        }
      }
      cands_.push_back(Candidate{diag, score, p, q});
    };
    // Every occurrence is kept: with repeated layers the right partner is
    // usually not the first copy.
    auto for_each = [&](bool in_ref, uint64_t h, auto&& fn) {
      if (use_map) {
        auto& mp = in_ref ? map_r_ : map_s_;
        auto it = mp.find(h);
        if (it != mp.end()) {
          for (uint32_t pos : it->second) fn(pos);
        }
        return;
      }
      for (const auto& [hh, pos] : in_ref ? seen_r_ : seen_s_) {
        if (hh == h) fn(pos);
      }
    };
    auto add = [&](bool in_ref, uint64_t h, size_t pos) {
      if (use_map) {
        (in_ref ? map_r_ : map_s_)[h].push_back(static_cast<uint32_t>(pos));
      } else {
        (in_ref ? seen_r_ : seen_s_).emplace_back(h, pos);
      }
    };
    // Search a little past the best score: a farther anchor on another
    // diagonal may be the true one (see ChooseAnchor).
    for (size_t s = 0; s <= std::max(lim_r, lim_s); ++s) {
      if (best_score != kNone && s >= 2 * best_score + 2) break;
      if (!use_map && s == kLinearScanLimit) {
        use_map = true;
        for (const auto& [h, pos] : seen_r_) map_r_[h].push_back(static_cast<uint32_t>(pos));
        for (const auto& [h, pos] : seen_s_) map_s_[h].push_back(static_cast<uint32_t>(pos));
      }
      if (s <= lim_r && !r_[i + s].nondeterministic()) {
        uint64_t h = GramHash(r_, i + s);
        add(true, h, i + s);
        for_each(false, h, [&](size_t q) { consider(i + s, q); });
      }
      if (s <= lim_s) {
        uint64_t h = GramHash(s_, j + s);
        add(false, h, j + s);
        for_each(true, h, [&](size_t p) { consider(p, j + s); });
      }
    }
    if (cands_.empty()) return false;
    ChooseAnchor(i, j, ai, aj);
    return true;
  }

  // With repeated identical layers, k-grams one layer apart are equal, so
  // several diagonals offer an anchor. The window each implies is matched
  // (DP + rescue, as it would be for real) and the one leaving the fewest ops
  // unaligned wins; ties go to the better score. Only the few best-scored
  // diagonals are tried, so the cost stays a small multiple of one window.
  void ChooseAnchor(size_t i, size_t j, size_t* ai, size_t* aj) {
    std::sort(cands_.begin(), cands_.end(),
              [](const Candidate& x, const Candidate& y) { return x.score < y.score; });
    if (cands_.size() > kMaxCandidates) cands_.resize(kMaxCandidates);
    size_t best = 0, best_unaligned = std::numeric_limits<size_t>::max();
    if (cands_.size() > 1) {
      for (size_t k = 0; k < cands_.size(); ++k) {
        size_t na = cands_[k].p - i, nc = cands_[k].q - j;
        size_t paired = na == 0 || nc == 0 ? 0 : TryWindow(i, cands_[k].p, j, cands_[k].q);
        size_t unaligned = na + nc - 2 * paired;
        if (unaligned < best_unaligned) {
          best_unaligned = unaligned;
          best = k;
        }
      }
    }
    *ai = cands_[best].p;
    *aj = cands_[best].q;
  }

  // Pairs the window would get (no side effects on the result).
  size_t TryWindow(size_t a, size_t b, size_t c, size_t d) {
    const size_t na = b - a, nc = d - c;
    if (uint64_t(na + 1) * (nc + 1) > o_.max_window_cells) return 0;
    local_.clear();
    BandedDp(a, na, c, nc, nc);
    count_only_ = true;
    Rescue(a, na, c, nc);
    count_only_ = false;
    return local_.size();
  }

  void MatchWindow(size_t a, size_t b, size_t c, size_t d) {
    const size_t na = b - a, nc = d - c;
    ++out_->windows;
    out_->largest_window = std::max<uint64_t>(out_->largest_window, std::max(na, nc));
    if (na == 0 || nc == 0) return;
    local_.clear();
    // Full DP when it fits the budget (exact for any path shape, e.g. a long
    // insertion at one end of an unanchored tail window); otherwise a band
    // wide enough that consecutive rows' bands overlap.
    size_t w = o_.band + (nc + na - 1) / na;
    if (uint64_t(na + 1) * (nc + 1) <= o_.max_window_cells) w = nc;
    const uint64_t cells = uint64_t(na + 1) * std::min<uint64_t>(nc + 1, 2 * w + 1);
    if (cells <= o_.max_window_cells && out_->dp_cells + cells <= o_.max_total_cells) {
      out_->dp_cells += cells;
      BandedDp(a, na, c, nc, w);
    } else {
      out_->degraded = true;
      Note("window of " + std::to_string(na) + " x " + std::to_string(nc) +
           " ops at reference op #" + std::to_string(r_[a].op_index) +
           " exceeds the DP budget: matched by key occurrence (monotone, not optimal)");
      OccurrenceMatch(a, na, c, nc);
    }
    Rescue(a, na, c, nc);
    std::sort(local_.begin(), local_.end(), [](const Pair& x, const Pair& y) { return x.ref < y.ref; });
    out_->pairs.insert(out_->pairs.end(), local_.begin(), local_.end());
  }

  // Longest common subsequence of keys inside a band around the window's
  // diagonal. Among equally long ones, the one whose matches stay closest to
  // the window's entry offset wins ("closeness in op index"): with repeated
  // layers the same number of matches is often available one layer off.
  void BandedDp(size_t a, size_t na, size_t c, size_t nc, size_t w) {
    lo_.resize(na + 1);
    hi_.resize(na + 1);
    base_.resize(na + 2);
    base_[0] = 0;
    for (size_t x = 0; x <= na; ++x) {
      size_t center = x * nc / na;
      lo_[x] = center > w ? center - w : 0;
      hi_[x] = std::min(nc, center + w);
      base_[x + 1] = base_[x] + (hi_[x] - lo_[x] + 1);
    }
    dir_.assign(base_[na + 1], kStop);
    prev_.assign(nc + 1, kNeg);
    cur_.assign(nc + 1, kNeg);
    for (size_t y = lo_[0]; y <= hi_[0]; ++y) {
      prev_[y] = 0;
      dir_[base_[0] + y - lo_[0]] = y == 0 ? kStop : kLeft;
    }
    // Lexicographic (matches, -deviation) packed into one integer: one match
    // is worth more than any total deviation the window can accumulate.
    const int64_t match = static_cast<int64_t>((na + nc + 1) * std::min(na, nc) + 1);
    for (size_t x = 1; x <= na; ++x) {
      const uint64_t rkey = r_[a + x - 1].key;
      const size_t plo = lo_[x - 1], phi = hi_[x - 1];
      for (size_t y = lo_[x]; y <= hi_[x]; ++y) {
        int64_t up = (y >= plo && y <= phi) ? prev_[y] : kNeg;
        int64_t left = y > lo_[x] ? cur_[y - 1] : kNeg;
        int64_t diag = kNeg;
        if (y >= 1 && y - 1 >= plo && y - 1 <= phi && s_[c + y - 1].key == rkey && prev_[y - 1] > kNeg) {
          int64_t dev = static_cast<int64_t>(x > y ? x - y : y - x);
          diag = prev_[y - 1] + match - dev;
        }
        uint8_t dir;
        int64_t best;
        if (diag > kNeg && diag >= up && diag >= left) {
          dir = kDiag;
          best = diag;
        } else if (up >= left) {
          dir = kUp;
          best = up;
        } else {
          dir = kLeft;
          best = left;
        }
        if (best <= kNeg) dir = kStop;
        cur_[y] = best;
        dir_[base_[x] + y - lo_[x]] = dir;
      }
      // Cells of the previous band outside this one must read as unreachable.
      for (size_t y = plo; y <= phi; ++y) prev_[y] = kNeg;
      std::swap(prev_, cur_);
    }
    size_t x = na, y = nc;
    while (x > 0 || y > 0) {
      if (y < lo_[x] || y > hi_[x]) break;  // cannot happen: bands overlap
      uint8_t dir = dir_[base_[x] + y - lo_[x]];
      if (dir == kDiag) {
        local_.push_back(Pair{static_cast<uint32_t>(a + x - 1), static_cast<uint32_t>(c + y - 1), 0});
        --x;
        --y;
      } else if (dir == kUp) {
        --x;
      } else if (dir == kLeft) {
        --y;
      } else {
        break;
      }
    }
  }

  // Fallback for windows over budget: pair the k-th occurrence of each key in
  // both runs, then keep the longest increasing subsequence (monotone).
  void OccurrenceMatch(size_t a, size_t na, size_t c, size_t nc) {
    std::unordered_map<uint64_t, std::vector<uint32_t>> by_key;
    std::unordered_map<uint64_t, size_t> used;
    for (size_t y = 0; y < nc; ++y) by_key[s_[c + y].key].push_back(static_cast<uint32_t>(c + y));
    std::vector<Pair> cand;
    for (size_t x = 0; x < na; ++x) {
      auto it = by_key.find(r_[a + x].key);
      if (it == by_key.end()) continue;
      size_t& u = used[it->first];
      if (u < it->second.size()) cand.push_back(Pair{static_cast<uint32_t>(a + x), it->second[u++], 0});
    }
    // Patience sorting on cand[].sus.
    std::vector<size_t> tails, prev(cand.size(), SIZE_MAX);
    for (size_t k = 0; k < cand.size(); ++k) {
      auto pos = std::lower_bound(tails.begin(), tails.end(), cand[k].sus,
                                  [&](size_t t, uint32_t v) { return cand[t].sus < v; });
      if (pos != tails.begin()) prev[k] = *(pos - 1);
      if (pos == tails.end()) {
        tails.push_back(k);
      } else {
        *pos = k;
      }
    }
    for (size_t k = tails.empty() ? SIZE_MAX : tails.back(); k != SIZE_MAX; k = prev[k]) {
      local_.push_back(cand[k]);
    }
  }

  // Conservative rescue: leftover ops of the window with the same key, in
  // order, whose relative positions are within rescue_distance, are the same
  // op locally reordered (K before V in one run, V before K in the other).
  void Rescue(size_t a, size_t na, size_t c, size_t nc) {
    used_r_.assign(na, 0);
    used_s_.assign(nc, 0);
    for (const Pair& p : local_) {
      used_r_[p.ref - a] = 1;
      used_s_[p.sus - c] = 1;
    }
    left_r_.clear();
    left_s_.clear();
    for (size_t x = 0; x < na; ++x) {
      if (!used_r_[x]) left_r_.push_back(x);
    }
    for (size_t y = 0; y < nc; ++y) {
      if (!used_s_[y]) left_s_.push_back(y);
    }
    if (left_r_.empty() || left_s_.empty()) return;
    auto close = [&](size_t x, size_t y) {
      return (x > y ? x - y : y - x) <= o_.rescue_distance;
    };
    auto emit = [&](size_t x, size_t y) {
      local_.push_back(Pair{static_cast<uint32_t>(a + x), static_cast<uint32_t>(c + y), Pair::kReordered});
      if (!count_only_) ++out_->reordered;
    };
    if (left_r_.size() * left_s_.size() <= 4096) {
      std::vector<uint8_t> taken(left_s_.size(), 0);
      for (size_t x : left_r_) {
        for (size_t t = 0; t < left_s_.size(); ++t) {
          size_t y = left_s_[t];
          if (!taken[t] && s_[c + y].key == r_[a + x].key && close(x, y)) {
            taken[t] = 1;
            emit(x, y);
            break;
          }
        }
      }
      return;
    }
    std::unordered_map<uint64_t, std::vector<size_t>> by_key;
    std::unordered_map<uint64_t, size_t> next;
    for (size_t y : left_s_) by_key[s_[c + y].key].push_back(y);
    for (size_t x : left_r_) {
      auto it = by_key.find(r_[a + x].key);
      if (it == by_key.end()) continue;
      size_t& u = next[it->first];
      // Skip candidates left too far behind; they cannot match later x.
      while (u < it->second.size() && it->second[u] + o_.rescue_distance < x) ++u;
      if (u < it->second.size() && close(x, it->second[u])) emit(x, it->second[u++]);
    }
  }

  void Note(std::string note) {
    out_->degraded = true;
    if (out_->notes.size() < kMaxNotes) {
      out_->notes.push_back(std::move(note));
    } else if (out_->notes.size() == kMaxNotes) {
      out_->notes.push_back("(further alignment notes omitted)");
    }
  }

  // Structure alone is ambiguous where source lines repeat (a helper called
  // from one line for several independent computations, identical lines in
  // two branches) and silent where the code differs; the data decides there:
  // an op with the same name applied to inputs with equal fingerprints is the
  // same computation. Every reference op that is unpaired, or paired with a
  // suspect op that differs from it in both inputs and outputs (the pivot the
  // structure would report), takes the suspect op nearest its expected
  // position (within rescue_distance) that has its name and inputs and is
  // itself unpaired or in such a pair; the partners it displaces are left to
  // PairChangedSites. Loops over parameters issue one op on same-shaped
  // tensors from one line, and a benign change nearby (a gradient-norm log
  // over every parameter, other FSDP splits) shifts the structural pairs by
  // hundreds of such ops: a pair that disagrees finds its partner further
  // away, out to max_lookahead ops, in an index of the suspect's ops by name
  // and inputs; failing that, its suspect op looks for a partner in the
  // reference the same way, and the reference op is left unpaired (an op
  // the suspect did not run: the loop's line ran fewer times there). A pair that agrees on its inputs or on its outputs is
  // never undone (in-place initialisers read uninitialised memory: their
  // inputs differ from run to run, their outputs do not).
  // The scan stops at the first pair it cannot repair whose outputs differ:
  // that pair is the pivot, and nothing after it changes the report.
  void PairByData() {
    const size_t n = r_.size(), m = s_.size();
    if (n == 0 || m == 0) return;
    constexpr int64_t kNone = -1;
    // Partners by position, built only when a repair is first considered:
    // until then the pairs (ascending `ref`, each ref once) are read with a
    // cursor. Most traces need no repair, and three arrays of the traces'
    // length would cost a page fault per 4 KiB and a pass of their own.
    std::vector<int64_t> of_r, of_s;
    std::vector<uint32_t> flags;
    size_t cursor = 0;
    auto indexed = [&] { return !of_r.empty(); };
    auto index = [&] {
      if (indexed()) return;
      of_r.assign(n, kNone);
      of_s.assign(m, kNone);
      flags.assign(n, 0);
      for (const Pair& p : out_->pairs) {
        of_r[p.ref] = p.sus;
        of_s[p.sus] = p.ref;
        flags[p.ref] = p.flags;
      }
    };
    auto partner_of = [&](size_t r) -> int64_t {
      if (indexed()) return of_r[r];
      const std::vector<Pair>& pairs = out_->pairs;
      while (cursor < pairs.size() && pairs[cursor].ref < r) ++cursor;
      return cursor < pairs.size() && pairs[cursor].ref == r ? int64_t{pairs[cursor].sus} : kNone;
    };
    auto same_computation = [&](size_t r, size_t q) {
      return r_[r].name == s_[q].name && r_[r].inputs == s_[q].inputs && !s_[q].nondeterministic();
    };
    // Trusted ops carry no fingerprints: they never disagree.
    auto disagree = [&](size_t r, size_t q) {
      return !r_[r].trusted() && !s_[q].trusted() && !(r_[r].inputs == s_[q].inputs) &&
             !(r_[r].outputs == s_[q].outputs);
    };
    auto repairable = [&](size_t q) {
      index();
      return of_s[q] == kNone || disagree(static_cast<size_t>(of_s[q]), q);
    };
    auto ref_repairable = [&](size_t r) {
      index();
      return of_r[r] == kNone || disagree(r, static_cast<size_t>(of_r[r]));
    };
    const int64_t reach = std::max<int64_t>(o_.rescue_distance, o_.max_lookahead);
    ComputationIndex sus_index(s_), ref_index(r_);
    int64_t last_r = -1, last_s = -1;  // the latest pair met, for expected positions
    uint64_t repaired = 0;
    for (size_t r = 0; r < n; ++r) {
      const int64_t paired = partner_of(r);
      if (paired != kNone && !disagree(r, static_cast<size_t>(paired))) {
        last_r = static_cast<int64_t>(r);
        last_s = paired;
        continue;
      }
      if (r_[r].nondeterministic()) continue;
      const int64_t expected = paired != kNone ? paired
                               : last_s >= 0   ? last_s + (static_cast<int64_t>(r) - last_r)
                                               : static_cast<int64_t>(r);
      int64_t best = kNone;
      for (int64_t d = 0; d <= o_.rescue_distance && best == kNone; ++d) {
        for (int64_t q : {expected - d, expected + d}) {
          if (q >= 0 && q < static_cast<int64_t>(m) && q != paired &&
              same_computation(r, static_cast<size_t>(q)) && repairable(static_cast<size_t>(q))) {
            best = q;
            break;
          }
        }
      }
      // A pair that disagrees in everything is the pivot unless its true
      // partner is further away: then look it up (an op only one run has
      // keeps the near scan alone, so traces with scattered inserts build
      // no index).
      if (best == kNone && paired != kNone) {
        best = sus_index.Nearest(r_[r], expected, reach, [&](size_t q) {
          return static_cast<int64_t>(q) != paired && same_computation(r, q) && repairable(q);
        });
      }
      // Or the suspect's op has its partner elsewhere in the reference, and
      // this reference op is one the suspect did not run (a benign change
      // that runs a loop's line fewer times: FSDP's other splits).
      if (best == kNone && paired != kNone) {
        const auto q = static_cast<size_t>(paired);
        const int64_t other = ref_index.Nearest(s_[q], static_cast<int64_t>(r), reach, [&](size_t r2) {
          return r2 != r && same_computation(r2, q) && ref_repairable(r2);
        });
        if (other != kNone) {
          const int64_t displaced = of_r[static_cast<size_t>(other)];
          if (displaced != kNone) of_s[static_cast<size_t>(displaced)] = kNone;
          of_r[r] = kNone;
          of_r[static_cast<size_t>(other)] = paired;
          of_s[q] = other;
          flags[static_cast<size_t>(other)] = Pair::kByData;
          ++repaired;
          continue;
        }
      }
      if (best != kNone) {
        if (paired != kNone) of_s[static_cast<size_t>(paired)] = kNone;
        const int64_t displaced = of_s[static_cast<size_t>(best)];
        if (displaced != kNone) of_r[static_cast<size_t>(displaced)] = kNone;
        of_r[r] = best;
        of_s[static_cast<size_t>(best)] = static_cast<int64_t>(r);
        flags[r] = Pair::kByData;
        ++repaired;
        last_r = static_cast<int64_t>(r);
        last_s = best;
        continue;
      }
      if (paired == kNone) continue;
      last_r = static_cast<int64_t>(r);
      last_s = paired;
      if (!s_[static_cast<size_t>(paired)].nondeterministic() &&
          !(r_[r].outputs == s_[static_cast<size_t>(paired)].outputs)) {
        break;
      }
    }
    if (repaired == 0) return;
    out_->pairs.clear();
    int64_t last_in_order = -1;
    for (size_t r = 0; r < n; ++r) {
      if (of_r[r] == kNone) continue;
      Pair p{static_cast<uint32_t>(r), static_cast<uint32_t>(of_r[r]), flags[r]};
      // Pairs out of the suspect's order are reordered ones (see Pair).
      if (of_r[r] < last_in_order) {
        if (!(p.flags & Pair::kReordered)) ++out_->reordered;
        p.flags |= Pair::kReordered;
      } else if (!(p.flags & Pair::kReordered)) {
        last_in_order = of_r[r];
      }
      out_->pairs.push_back(p);
    }
    out_->by_data = repaired;
    // Not a degradation (no bound was hit): said, not flagged.
    if (out_->notes.size() < kMaxNotes) {
      out_->notes.push_back(std::to_string(repaired) +
                            " op pair(s) made by equal inputs where the structure disagreed (same "
                            "op on the same data)");
    }
  }

  // Between consecutive in-order pairs, the ops left on both sides are what
  // an edit of the code there produced: pair them by loose key, in order
  // (longest common subsequence over at most rescue_distance ops a side).
  void PairChangedSites() {
    const size_t n = r_.size(), m = s_.size();
    if (out_->pairs.size() == n || out_->pairs.size() == m) return;
    used_r_.assign(n, 0);
    used_s_.assign(m, 0);
    for (const Pair& p : out_->pairs) used_r_[p.ref] = used_s_[p.sus] = 1;
    std::vector<Pair> added;
    size_t from_r = 0, from_s = 0;
    auto gap = [&](size_t to_r, size_t to_s) {
      left_r_.clear();
      left_s_.clear();
      for (size_t k = from_r; k < to_r; ++k)
        if (!used_r_[k]) left_r_.push_back(k);
      for (size_t k = from_s; k < to_s; ++k)
        if (!used_s_[k]) left_s_.push_back(k);
      const size_t a = left_r_.size(), b = left_s_.size();
      if (a == 0 || b == 0 || a > o_.rescue_distance || b > o_.rescue_distance) return;
      // lcs[x][y]: LCS length of left_r_[x..] and left_s_[y..].
      std::vector<uint16_t> lcs((a + 1) * (b + 1), 0);
      auto at = [&](size_t x, size_t y) -> uint16_t& { return lcs[x * (b + 1) + y]; };
      for (size_t x = a; x-- > 0;) {
        for (size_t y = b; y-- > 0;) {
          at(x, y) = r_[left_r_[x]].loose_key == s_[left_s_[y]].loose_key
                         ? static_cast<uint16_t>(at(x + 1, y + 1) + 1)
                         : std::max(at(x + 1, y), at(x, y + 1));
        }
      }
      for (size_t x = 0, y = 0; x < a && y < b;) {
        if (r_[left_r_[x]].loose_key == s_[left_s_[y]].loose_key) {
          added.push_back(Pair{static_cast<uint32_t>(left_r_[x]), static_cast<uint32_t>(left_s_[y]),
                               Pair::kChangedSite});
          ++x;
          ++y;
        } else if (at(x + 1, y) >= at(x, y + 1)) {
          ++x;
        } else {
          ++y;
        }
      }
    };
    for (const Pair& p : out_->pairs) {
      if (p.flags & Pair::kReordered) continue;
      gap(p.ref, p.sus);
      from_r = p.ref + 1;
      from_s = p.sus + 1;
    }
    gap(n, m);
    if (added.empty()) return;
    out_->changed_site = added.size();
    Note(std::to_string(added.size()) +
         " op pair(s) made across edited source lines (same op and shapes, other line text)");
    out_->pairs.insert(out_->pairs.end(), added.begin(), added.end());
    std::sort(out_->pairs.begin(), out_->pairs.end(),
              [](const Pair& x, const Pair& y) { return x.ref < y.ref; });
  }

  const std::vector<OpEvent>& r_;
  const std::vector<OpEvent>& s_;
  AlignOptions o_;
  Alignment* out_;
  // Scratch reused across windows so that thousands of tiny windows cost no
  // allocations.
  std::vector<std::pair<uint64_t, size_t>> seen_r_, seen_s_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> map_r_, map_s_;
  std::vector<Pair> local_;
  struct Candidate {
    int64_t diag;
    size_t score;
    size_t p, q;
  };
  static constexpr size_t kMaxCandidates = 4;
  std::vector<Candidate> cands_;
  bool count_only_ = false;
  std::vector<size_t> lo_, hi_, base_, left_r_, left_s_;
  std::vector<uint8_t> dir_, used_r_, used_s_;
  std::vector<int64_t> prev_, cur_;
};

}  // namespace

Alignment AlignLane(const std::vector<OpEvent>& ref, const std::vector<OpEvent>& sus,
                    const AlignOptions& options) {
  Alignment out;
  LaneAligner(ref, sus, options, &out).Run();
  return out;
}

}  // namespace opguard::aligner
