#include "opguard/common/status.h"

namespace opguard {

std::string Status::ToString() const {
  switch (code_) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument: " + message_;
    case StatusCode::kNotFound: return "not found: " + message_;
    case StatusCode::kUnavailable: return "unavailable: " + message_;
    case StatusCode::kDataLoss: return "data loss: " + message_;
    case StatusCode::kInternal: return "internal: " + message_;
  }
  return message_;
}

}  // namespace opguard
