#include "registry/run_state.h"

#include <algorithm>

namespace opguard::daemon {

bool SessionState::Applied(uint64_t seq) const {
  if (seq < contiguous) return true;
  auto next = above.upper_bound(seq);
  return next != above.begin() && seq < std::prev(next)->second;
}

bool SessionState::Mark(uint64_t seq) {
  if (Applied(seq)) return false;
  auto next = above.upper_bound(seq);
  if (next != above.begin() && std::prev(next)->second == seq) {
    ++std::prev(next)->second;  // extends the range below
  } else {
    next = std::next(above.emplace_hint(next, seq, seq + 1));
  }
  auto range = std::prev(next);
  if (next != above.end() && next->first == range->second) {  // joins the range above
    range->second = next->second;
    above.erase(next);
  }
  bool gave_up = false;
  if (above.size() > kMaxRanges) {
    contiguous = above.begin()->first;
    gave_up = true;
  }
  if (!above.empty() && above.begin()->first == contiguous) {
    contiguous = above.begin()->second;
    above.erase(above.begin());
  }
  return gave_up;
}

void RankState::TrimSessions() {
  while (sessions.size() > kMaxSessions) {
    auto oldest = std::min_element(sessions.begin(), sessions.end(), [](const auto& a, const auto& b) {
      return a.second.last_ns < b.second.last_ns;
    });
    sessions.erase(oldest);
  }
}

uint32_t RunState::WorldSizeVote() const {
  std::map<uint32_t, uint32_t> votes;
  for (const auto& [rank, r] : ranks) {
    if (r.world_size != 0) ++votes[r.world_size];
  }
  uint32_t best = world_size;
  uint32_t best_votes = votes.count(world_size) ? votes[world_size] : 0;
  for (const auto& [size, n] : votes) {
    if (n > best_votes) best = size, best_votes = n;
  }
  return best;
}

uint64_t RunState::MetadataBytes() const {
  uint64_t n = job_id.size() + framework.size();
  for (const auto* list : {&determinism, &versions, &environment}) {
    for (const auto& [k, v] : *list) n += k.size() + v.size();
  }
  return n;
}

uint64_t RunState::LastNs() const {
  uint64_t last = created_ns;
  for (const auto& [rank, r] : ranks) last = std::max(last, r.last_ns);
  return last;
}

}  // namespace opguard::daemon
