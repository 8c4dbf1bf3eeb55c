#include "opguard/common/cancel.h"

#include <cstdio>

namespace opguard {

std::string CancelToken::Message() const {
  switch (reason()) {
    case Reason::kClientGone: return "query cancelled: its client went away";
    case Reason::kStopping: return "daemon is stopping";
    case Reason::kTimeBudget: {
      const double s = std::chrono::duration<double>(budget_).count();
      char text[64];
      if (s < 1) {
        std::snprintf(text, sizeof text, "%.0f ms", s * 1000);
      } else {
        std::snprintf(text, sizeof text, "%g s", s);
      }
      return std::string("query exceeded its time budget of ") + text;
    }
    case Reason::kNone: break;
  }
  return "not cancelled";
}

}  // namespace opguard
