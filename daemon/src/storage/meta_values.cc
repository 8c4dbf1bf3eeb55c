#include "storage/meta_values.h"

namespace opguard::daemon {

nlohmann::json RankToJson(const RankState& r) {
  nlohmann::json sessions = nlohmann::json::array();
  for (const auto& [id, s] : r.sessions) {
    nlohmann::json ranges = nlohmann::json::array();
    for (const auto& [first, end] : s.above) ranges.push_back({first, end});
    nlohmann::json session = {{"id", id}, {"contiguous", s.contiguous}, {"ranges", ranges}, {"last_ns", s.last_ns}};
    if (s.revived) session["revived"] = true;
    sessions.push_back(std::move(session));
  }
  return {{"ops", r.ops},
          {"collectives", r.collectives},
          {"steps", r.steps},
          {"gap_records", r.gap_records},
          {"collective_gap_records", r.collective_gap_records},
          {"gap_notices", r.gap_notices},
          {"batches", r.batches},
          {"bytes", r.bytes},
          {"first_ns", r.first_ns},
          {"last_ns", r.last_ns},
          {"node", r.node},
          {"local_rank", r.local_rank},
          {"pid", r.pid},
          {"world_size", r.world_size},
          {"ended", r.ended},
          {"sessions", sessions},
          {"retired_sessions", r.retired},
          {"forgot_retired_sessions", r.forgot_retired}};
}

RankState RankFromJson(const nlohmann::json& j) {
  RankState r;
  r.ops = j.value("ops", uint64_t{0});
  r.collectives = j.value("collectives", uint64_t{0});
  r.steps = j.value("steps", uint64_t{0});
  r.gap_records = j.value("gap_records", uint64_t{0});
  r.collective_gap_records = j.value("collective_gap_records", uint64_t{0});
  r.gap_notices = j.value("gap_notices", uint64_t{0});
  r.batches = j.value("batches", uint64_t{0});
  r.bytes = j.value("bytes", uint64_t{0});
  r.first_ns = j.value("first_ns", uint64_t{0});
  r.last_ns = j.value("last_ns", uint64_t{0});
  r.node = j.value("node", std::string());
  r.local_rank = j.value("local_rank", uint32_t{0});
  r.pid = j.value("pid", uint64_t{0});
  r.world_size = j.value("world_size", uint32_t{0});
  r.ended = j.value("ended", false);
  if (j.contains("sessions")) {
    for (const auto& s : j["sessions"]) {
      SessionState state;
      state.contiguous = s.value("contiguous", uint64_t{0});
      state.last_ns = s.value("last_ns", uint64_t{0});
      state.revived = s.value("revived", false);
      if (s.contains("ranges")) {
        for (const auto& range : s["ranges"])
          state.above.emplace(range.at(0).get<uint64_t>(), range.at(1).get<uint64_t>());
      }
      if (s.contains("above")) {  // before ranges: every applied seq above contiguous
        for (uint64_t seq : s["above"].get<std::vector<uint64_t>>()) state.Mark(seq);
      }
      r.sessions[s.value("id", uint64_t{0})] = std::move(state);
    }
  }
  r.retired = j.value("retired_sessions", std::vector<uint64_t>());
  // Before retired ids were kept, a forgotten session left no trace: a rank
  // stored then with a full set of sessions may have forgotten some.
  r.forgot_retired = j.value("forgot_retired_sessions", r.sessions.size() >= RankState::kMaxSessions &&
                                                            !j.contains("retired_sessions"));
  return r;
}

namespace {
nlohmann::json PairsToJson(const std::vector<std::pair<std::string, std::string>>& kv) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : kv) j[k] = v;
  return j;
}
std::vector<std::pair<std::string, std::string>> PairsFromJson(const nlohmann::json& j,
                                                               const char* key) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!j.contains(key) || !j[key].is_object()) return out;
  for (const auto& [k, v] : j[key].items()) out.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}
}  // namespace

nlohmann::json RunMetaToJson(const RunState& r) {
  return {{"id", r.id},
          {"name", r.name},
          {"owner_uid", r.owner_uid},
          {"job_id", r.job_id},
          {"world_size", r.world_size},
          {"framework", r.framework},
          {"start_ns", r.start_ns},
          {"created_ns", r.created_ns},
          {"determinism", PairsToJson(r.determinism)},
          {"versions", PairsToJson(r.versions)},
          {"environment", PairsToJson(r.environment)}};
}

RunState RunMetaFromJson(const nlohmann::json& j) {
  RunState r;
  r.id = j.value("id", uint64_t{0});
  r.name = j.value("name", std::string());
  r.owner_uid = j.value("owner_uid", kUnknownOwner);  // absent: stored before runs had owners
  r.job_id = j.value("job_id", std::string());
  r.world_size = j.value("world_size", uint32_t{0});
  r.framework = j.value("framework", std::string());
  r.start_ns = j.value("start_ns", uint64_t{0});
  r.created_ns = j.value("created_ns", uint64_t{0});
  r.determinism = PairsFromJson(j, "determinism");
  r.versions = PairsFromJson(j, "versions");
  r.environment = PairsFromJson(j, "environment");
  return r;
}

}  // namespace opguard::daemon
