#include "registry/run_state.h"

#include <algorithm>

namespace opguard::daemon {

void SessionState::Mark(uint64_t seq) {
  if (seq < contiguous) return;
  if (seq == contiguous) {
    ++contiguous;
    while (!above.empty() && *above.begin() == contiguous) {
      above.erase(above.begin());
      ++contiguous;
    }
  } else {
    above.insert(seq);
  }
}

void RankState::TrimSessions() {
  while (sessions.size() > kMaxSessions) {
    auto oldest = std::min_element(sessions.begin(), sessions.end(), [](const auto& a, const auto& b) {
      return a.second.last_ns < b.second.last_ns;
    });
    sessions.erase(oldest);
  }
}

uint64_t RunState::LastNs() const {
  uint64_t last = created_ns;
  for (const auto& [rank, r] : ranks) last = std::max(last, r.last_ns);
  return last;
}

}  // namespace opguard::daemon
