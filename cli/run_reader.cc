#include "cli/run_reader.h"

#include "opguard/common/hex.h"
#include "opguard/daemon/report_wire.h"

namespace opguard::cli {

Result<daemon::Answer> RunReader::Page(uint32_t rank, uint32_t lane, uint64_t from_op,
                                       uint32_t max_ops) {
  auto answer = client_->ReadTrace(run_, rank, lane, from_op, max_ops);
  if (!answer.ok()) return answer.status();
  const auto* page = answer->envelope()->message_as_ReadTraceAnswer();
  if (page == nullptr) return DataLoss("unexpected answer from " + client_->endpoint());
  if (page->strings()) {
    for (const auto* s : *page->strings())
      strings_.try_emplace(s->id(), s->text() ? s->text()->str() : "");
  }
  if (page->sites()) {
    for (const auto* s : *page->sites()) {
      sites_.try_emplace(s->id(), Site{String(s->file()), s->line(), String(s->function())});
    }
  }
  return answer;
}

Result<std::vector<RunReader::LaneStart>> RunReader::Lanes(uint32_t rank) {
  std::vector<LaneStart> lanes;
  int64_t lane = 0;
  while (lane >= 0) {
    OPGUARD_ASSIGN_OR_RETURN(auto answer, Page(rank, static_cast<uint32_t>(lane), 0, 1));
    const auto* page = answer.envelope()->message_as_ReadTraceAnswer();
    if (page->ops() && page->ops()->size() > 0) {
      const auto* op = page->ops()->Get(0);
      lanes.push_back({static_cast<uint32_t>(lane), op->start_ns(), op->duration_ns()});
    }
    if (page->next_lane() >= 0 && page->next_lane() <= lane) {
      return DataLoss("daemon at " + client_->endpoint() + " answered lanes out of order");
    }
    lane = page->next_lane();
  }
  return lanes;
}

Result<std::vector<aligner::OpDetail>> RunReader::ReadLane(
    uint32_t rank, uint32_t lane, const std::function<void(size_t)>& progress) {
  std::vector<aligner::OpDetail> ops;
  uint64_t from = 0;
  while (true) {
    // The daemon caps a page (config max_trace_page) and its bytes.
    OPGUARD_ASSIGN_OR_RETURN(auto answer, Page(rank, lane, from, 10000));
    const auto* page = answer.envelope()->message_as_ReadTraceAnswer();
    if (page->ops()) {
      for (const auto* op : *page->ops()) daemon::OpDetailFromRecord(*op, &ops.emplace_back());
    }
    if (progress) progress(ops.size());
    if (page->done()) return ops;
    if (page->next_op() <= from) {
      return DataLoss("daemon at " + client_->endpoint() + " did not advance the trace of rank " +
                      std::to_string(rank) + " lane " + std::to_string(lane));
    }
    from = page->next_op();
  }
}

std::string RunReader::String(uint64_t id) const {
  if (auto it = strings_.find(id); it != strings_.end()) return it->second;
  return "#" + ToHex(&id, sizeof id);
}

const RunReader::Site* RunReader::SiteOf(uint64_t id) const {
  auto it = sites_.find(id);
  return it == sites_.end() ? nullptr : &it->second;
}

uint64_t RunReader::Boundary(uint64_t site) const {
  const Site* s = SiteOf(site);
  return s == nullptr ? 0 : aligner::BoundaryId(s->file, s->function, s->line, "");
}

}  // namespace opguard::cli
