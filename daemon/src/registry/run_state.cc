#include "registry/run_state.h"

#include <algorithm>

namespace opguard::daemon {

bool SessionState::Applied(uint64_t seq) const {
  if (seq < contiguous) return true;
  auto next = above.upper_bound(seq);
  return next != above.begin() && seq < std::prev(next)->second;
}

bool SessionState::CanMark(uint64_t seq) const {
  if (above.size() < kMaxRanges || seq <= contiguous) return true;  // seq == contiguous extends the prefix
  auto next = above.upper_bound(seq);
  if (next != above.begin() && seq <= std::prev(next)->second) return true;  // in or just after a range
  return next != above.end() && next->first == seq + 1;                     // just before one
}

void SessionState::Mark(uint64_t seq) {
  if (Applied(seq)) return;
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
  if (!above.empty() && above.begin()->first == contiguous) {
    contiguous = above.begin()->second;
    above.erase(above.begin());
  }
}

void RankState::TrimSessions(uint64_t durable_group) {
  while (sessions.size() > kMaxSessions) {
    auto oldest = sessions.end();
    for (auto it = sessions.begin(); it != sessions.end(); ++it) {
      if (it->second.group > durable_group) continue;  // a resend must still find its marks
      if (oldest == sessions.end() || it->second.last_ns < oldest->second.last_ns) oldest = it;
    }
    if (oldest == sessions.end()) return;
    retired.push_back(oldest->first);
    if (retired.size() > kMaxRetired) {
      retired.erase(retired.begin());
      forgot_retired = true;
    }
    sessions.erase(oldest);
  }
}

bool RankState::MaybeSeen(uint64_t session) const {
  return forgot_retired || std::find(retired.begin(), retired.end(), session) != retired.end();
}

SessionState& RankState::Session(uint64_t session) {
  auto found = sessions.find(session);
  if (found != sessions.end()) return found->second;
  SessionState& state = sessions[session];
  if (MaybeSeen(session)) {
    state.revived = true;
    retired.erase(std::remove(retired.begin(), retired.end(), session), retired.end());
  }
  return state;
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
