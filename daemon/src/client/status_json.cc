#include "opguard/daemon/status_json.h"

#include <string>

namespace opguard::daemon {
namespace {

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

nlohmann::json Pairs(const flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>* kv) {
  nlohmann::json j = nlohmann::json::object();
  if (kv) {
    for (const auto* e : *kv) j[Str(e->key())] = Str(e->value());
  }
  return j;
}

}  // namespace

nlohmann::json StatusJson(const wire::StatusAnswer& a) {
  nlohmann::json peers = nlohmann::json::array();
  if (a.peers()) {
    for (const auto* p : *a.peers()) peers.push_back(p->str());
  }
  nlohmann::json paused = nlohmann::json::array();
  if (a.ingest_paused()) {
    for (const auto* p : *a.ingest_paused()) {
      paused.push_back(nlohmann::json{
          {"cause", Str(p->cause())}, {"reason", Str(p->reason())}, {"since_ns", p->since_ns()}});
    }
  }
  return {{"version", Str(a.version())},
          {"node", Str(a.node())},
          {"data_dir", Str(a.data_dir())},
          {"uptime_s", a.uptime_s()},
          {"runs", a.runs()},
          {"records_ingested", a.records_ingested()},
          {"batches_rejected", a.batches_rejected()},
          {"disk_bytes", a.disk_bytes()},
          {"http", Str(a.http())},
          {"ingest", Str(a.ingest())},
          {"listen", Str(a.listen())},
          {"peers", peers},
          {"healthy", a.healthy()},
          {"ingest_paused", paused}};
}

nlohmann::json RunJson(const wire::RunSummary& run) {
  nlohmann::json ranks = nlohmann::json::array();
  uint64_t ops = 0;
  if (run.ranks()) {
    for (const auto* s : *run.ranks()) {
      ops += s->ops();
      ranks.push_back({{"rank", s->rank()},
                       {"ops", s->ops()},
                       {"collectives", s->collectives()},
                       {"steps", s->steps()},
                       {"gaps", s->gaps()},
                       {"collective_gaps", s->collective_gaps()},
                       {"gap_notices", s->gap_notices()},
                       {"batches", s->batches()},
                       {"bytes", s->bytes()},
                       {"node", Str(s->node())},
                       {"local_rank", s->local_rank()},
                       {"pid", s->pid()},
                       {"ended", s->ended()},
                       {"first_ns", s->first_ns()},
                       {"last_ns", s->last_ns()}});
    }
  }
  return {{"name", Str(run.name())},
          {"job_id", Str(run.job_id())},
          {"world_size", run.world_size()},
          {"framework", Str(run.framework())},
          {"owner_uid", run.owner_uid() >= 0 ? nlohmann::json(run.owner_uid()) : nlohmann::json()},
          {"owner", run.owner_uid() >= 0 && run.owner() && run.owner()->size() != 0
                        ? nlohmann::json(Str(run.owner())) : nlohmann::json()},
          {"start_ns", run.start_ns()},
          {"end_ns", run.end_ns()},
          {"ops", ops},
          {"ranks", ranks},
          {"determinism", Pairs(run.determinism())},
          {"versions", Pairs(run.versions())},
          {"environment", Pairs(run.environment())}};
}

nlohmann::json RunsJson(const wire::ListRunsAnswer& a) {
  nlohmann::json runs = nlohmann::json::array();
  if (a.runs()) {
    for (const auto* run : *a.runs()) runs.push_back(RunJson(*run));
  }
  return {{"runs", runs}};
}

}  // namespace opguard::daemon
