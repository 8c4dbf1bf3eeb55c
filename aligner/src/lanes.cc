#include "lanes.h"

#include <set>
#include <string>

namespace opguard::aligner {

const LaneTrace* FindLane(const RankTrace& t, uint32_t lane) {
  for (const LaneTrace& l : t.lanes) {
    if (l.lane == lane) return &l;
  }
  return nullptr;
}

Status ValidateLanes(const RankTrace& t, const char* which) {
  std::set<uint32_t> lanes;
  for (const LaneTrace& l : t.lanes) {
    if (!lanes.insert(l.lane).second) {
      return InvalidArgument(std::string(which) + " rank " + std::to_string(t.rank) + ": lane " +
                             std::to_string(l.lane) + " appears twice");
    }
    if (l.ops.size() >= (uint64_t{1} << 32)) {
      return InvalidArgument(std::string(which) + " rank " + std::to_string(t.rank) + " lane " +
                             std::to_string(l.lane) + ": more than 2^32 ops");
    }
  }
  return Status::Ok();
}

Status ValidateOrder(const RankTrace& t, const char* which) {
  for (const LaneTrace& l : t.lanes) {
    for (size_t k = 1; k < l.ops.size(); ++k) {
      if (l.ops[k].op_index <= l.ops[k - 1].op_index) {
        return InvalidArgument(std::string(which) + " rank " + std::to_string(t.rank) + " lane " +
                               std::to_string(l.lane) + ": op indices not ascending at op #" +
                               std::to_string(l.ops[k].op_index));
      }
    }
  }
  return Status::Ok();
}

}  // namespace opguard::aligner
