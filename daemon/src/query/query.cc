#include "query/query.h"

#include <pthread.h>
#include <pwd.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <cstdio>
#include <set>

#include "opguard/aligner/render.h"
#include "opguard/common/hex.h"
#include "opguard/daemon/report_wire.h"
#include "opguard/daemon/status_json.h"
#include "opguard/idl/envelope.h"
#include "storage/record_copy.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace opguard::daemon {
namespace {

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

const char* DTypeName(wire::DType d) { return wire::EnumNameDType(d); }

std::string ToHex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

nlohmann::json StatsJson(const wire::TensorStats* s) {
  if (s == nullptr) return nullptr;
  return {{"nan_count", s->nan_count()}, {"inf_count", s->inf_count()}, {"min", s->min()},
          {"max", s->max()},             {"sum", s->sum()},             {"l2", s->l2()}};
}

nlohmann::json TensorJson(const wire::TensorSig* t) {
  if (t == nullptr) return nullptr;
  nlohmann::json shape = nlohmann::json::array();
  if (t->shape()) {
    for (int64_t d : *t->shape()) shape.push_back(d);
  }
  return {{"fingerprint", t->fingerprint() ? FingerprintHex(t->fingerprint()) : std::string()},
          {"dtype", DTypeName(t->dtype())},
          {"shape", shape},
          {"device", t->device()},
          {"stats", StatsJson(t->stats())}};
}

nlohmann::json TensorsJson(const flatbuffers::Vector<flatbuffers::Offset<wire::TensorSig>>* v) {
  nlohmann::json out = nlohmann::json::array();
  if (v) {
    for (const auto* t : *v) out.push_back(TensorJson(t));
  }
  return out;
}

}  // namespace

std::string FingerprintHex(const void* fp128) {
  // Fp128 is stored little-endian (lo, then hi), i.e. digest bytes 0..15 in order.
  return ToHex(fp128, 16);
}

QueryService::QueryService(const Config& config, Store* store, const RunRegistry* registry,
                           RunWriter* writer, Metrics* metrics)
    : config_(config),
      store_(store),
      registry_(registry),
      writer_(writer),
      metrics_(metrics),
      admin_(config.admin_group),
      started_(std::chrono::steady_clock::now()),
      traces_(config.query_trace_cache_bytes),
      plans_(store),
      cluster_(config, store, registry, &traces_, Hostname()),
      alignments_(store, &traces_),
      explainer_(config) {}

bool QueryService::IsAlignerRequest(const void* data, size_t size, bool* local_only) {
  *local_only = false;
  wire::AlignedStorage storage;
  auto opened = wire::OpenEnvelope(data, size, storage);
  if (!opened.ok()) return false;
  const wire::Envelope* env = *opened;
  switch (env->message_type()) {
    case wire::Message::DiffRequest: *local_only = env->message_as_DiffRequest()->local_only(); return true;
    case wire::Message::RanksRequest: *local_only = env->message_as_RanksRequest()->local_only(); return true;
    case wire::Message::CollectivesRequest:
      *local_only = env->message_as_CollectivesRequest()->local_only();
      return true;
    case wire::Message::ApiRequest: *local_only = true; return true;  // may align: a peer's request
    case wire::Message::PreflightRequest: return true;
    default: return false;
  }
}

std::shared_ptr<CancelToken> QueryService::NewQueryToken() {
  return std::make_shared<CancelToken>(config_.query_time_budget, &aligner_stopped_);
}

void QueryService::RunAligner(bool local_only, std::shared_ptr<const CancelToken> token,
                              std::function<void()> job) {
  auto wrapped = [this, token = std::move(token), job = std::move(job)] {
    pthread_setname_np(pthread_self(), "og-align");
    job();
    switch (token->reason()) {
      case CancelToken::Reason::kClientGone:
        metrics_->queries_client_gone.fetch_add(1, std::memory_order_relaxed);
        break;
      case CancelToken::Reason::kTimeBudget:
        metrics_->queries_over_budget.fetch_add(1, std::memory_order_relaxed);
        break;
      default: break;
    }
  };
  if (local_only) {
    boost::asio::post(peer_pool_, std::move(wrapped));
  } else {
    boost::asio::post(align_pool_, std::move(wrapped));
  }
}

void QueryService::StopAligner() {
  if (aligner_stopped_.exchange(true)) return;  // every query's token sees it
  align_pool_.stop();
  peer_pool_.stop();
  align_pool_.join();
  peer_pool_.join();
}

namespace {

Result<std::string> Unwrap(Result<std::string> answer) {
  if (!answer.ok()) return answer.status();
  wire::AlignedStorage storage;
  auto opened = wire::OpenEnvelope(answer->data(), answer->size(), storage);
  if (!opened.ok()) return Internal("aligner answer: " + opened.status().message());
  return answer;
}

}  // namespace

Result<nlohmann::json> QueryService::DiffJson(const std::string& reference, const std::string& suspect,
                                              int64_t rank, uint32_t peer_timeout_ms,
                                              const CancelToken* cancel) {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateDiffRequest(b, b.CreateString(reference), b.CreateString(suspect), rank, false,
                                   peer_timeout_ms, 0));
  OPGUARD_ASSIGN_OR_RETURN(std::string bytes,
                           Unwrap(cluster_.Diff(*flatbuffers::GetRoot<wire::DiffRequest>(b.GetBufferPointer()), cancel)));
  const auto* a = wire::GetEnvelope(bytes.data())->message_as_DiffAnswer();
  auto j = aligner::ToJson(MergeDiffAnswer(*a));
  j["nodes"] = NodesJson(a->nodes());
  return j;
}

Result<nlohmann::json> QueryService::RanksJson(const std::string& run, const std::vector<uint32_t>& replicas,
                                               uint32_t peer_timeout_ms, const CancelToken* cancel) {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateRanksRequest(b, b.CreateString(run), false, peer_timeout_ms, b.CreateVector(replicas)));
  OPGUARD_ASSIGN_OR_RETURN(std::string bytes,
                           Unwrap(cluster_.Ranks(*flatbuffers::GetRoot<wire::RanksRequest>(b.GetBufferPointer()), cancel)));
  return daemon::RanksJson(*wire::GetEnvelope(bytes.data())->message_as_RanksAnswer());
}

Result<nlohmann::json> QueryService::CollectivesJson(const std::string& run, uint32_t peer_timeout_ms,
                                                     const CancelToken* cancel) {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(wire::CreateCollectivesRequest(b, b.CreateString(run), false, peer_timeout_ms));
  OPGUARD_ASSIGN_OR_RETURN(
      std::string bytes,
      Unwrap(cluster_.Collectives(*flatbuffers::GetRoot<wire::CollectivesRequest>(b.GetBufferPointer()),
                                  cancel)));
  const auto* a = wire::GetEnvelope(bytes.data())->message_as_CollectivesAnswer();
  auto j = aligner::ToJson(CheckCollectivesAnswer(*a));
  j["nodes"] = NodesJson(a->nodes());
  return j;
}

Result<nlohmann::json> QueryService::AlignmentJson(const std::string& reference, const std::string& suspect,
                                                   uint32_t rank, uint32_t lane, uint64_t from, uint64_t count,
                                                   std::optional<uint64_t> locate_sus,
                                                   const CancelToken* cancel) {
  OPGUARD_ASSIGN_OR_RETURN(RunState ref, GetRun(reference));
  OPGUARD_ASSIGN_OR_RETURN(RunState sus, GetRun(suspect));
  OPGUARD_ASSIGN_OR_RETURN(auto view, alignments_.Get(ref, sus, rank, lane, cancel));
  auto j = AlignmentPageJson(*view, from, count, locate_sus);
  j["reference"] = reference;
  j["suspect"] = suspect;
  j["rank"] = rank;
  return j;
}

Result<nlohmann::json> QueryService::SourceJson(const std::string& name, const std::string& file) const {
  OPGUARD_ASSIGN_OR_RETURN(RunState run, GetRun(name));
  // Files are stored under the string id of their path (the shim's XXH64);
  // the run's own string table must name the same path, so a hash collision
  // cannot serve another file.
  const uint64_t id = XXH64(file.data(), file.size(), 0);
  auto names = store_->GetStrings(run.id, {id});
  auto content = store_->GetSource(run.id, id);
  if (!content || names[id] != file) {
    return NotFound("run '" + name + "' did not send a source file '" + file + "'");
  }
  return nlohmann::json{{"run", name}, {"file", file}, {"text", *content}};
}

Result<nlohmann::json> QueryService::VerifyJson(const std::string& name, const CancelToken* cancel) const {
  uint64_t run_id = 0;
  if (!name.empty()) {
    OPGUARD_ASSIGN_OR_RETURN(RunState run, GetRun(name));
    run_id = run.id;
  }
  OPGUARD_ASSIGN_OR_RETURN(Store::ScrubResult scrub, store_->Scrub(run_id, cancel));
  std::map<uint64_t, std::string> names;
  for (const auto& r : ListRuns()) names[r.id] = r.name;
  nlohmann::json damaged = nlohmann::json::array();
  for (const auto& [key, ranges] : store_->AllKnownDamage()) {
    const auto [id, rank] = key;
    if (run_id != 0 && id != run_id) continue;
    auto found = names.find(id);
    if (found == names.end()) continue;  // removed since
    for (const auto& d : ranges) {
      damaged.push_back({{"run", found->second}, {"rank", rank}, {"lane", d.lane}, {"first_op", d.first_op},
                         {"last_op", d.last_op}});
    }
  }
  const bool clean = scrub.errors == 0 && damaged.empty();
  return nlohmann::json{{"status", clean ? "ok" : "damaged"},
                        {"scope", name.empty() ? nlohmann::json(nullptr) : nlohmann::json(name)},
                        {"values_read", scrub.values},
                        {"ops_read", scrub.ops},
                        {"read_errors", scrub.errors},
                        {"damaged_ops", damaged}};
}

Result<nlohmann::json> QueryService::LanesJson(const std::string& name, uint32_t rank) const {
  OPGUARD_ASSIGN_OR_RETURN(RunState run, GetRun(name));
  if (run.ranks.count(rank) == 0) return NotFound("run '" + name + "' has no rank " + std::to_string(rank));
  nlohmann::json lanes = nlohmann::json::array();
  for (const auto& l : store_->OpLanes(run.id, rank)) lanes.push_back({{"lane", l.lane}, {"last_op", l.last_op}});
  return nlohmann::json{{"run", name}, {"rank", rank}, {"lanes", lanes}};
}

Result<nlohmann::json> QueryService::ExplainJson(const std::string& reference, const std::string& suspect,
                                                bool ask, const CancelToken* cancel) {
  if (!explainer_.configured()) {
    return InvalidArgument("no explain.endpoint is configured: the daemon sends evidence nowhere");
  }
  OPGUARD_ASSIGN_OR_RETURN(nlohmann::json report, DiffJson(reference, suspect, -1, 0, cancel));
  nlohmann::json answer = {{"reference", reference},
                           {"suspect", suspect},
                           {"status", report["status"]},
                           {"diagnosis", report["diagnosis"]},
                           {"model", explainer_.model()},
                           {"generated", nullptr}};
  const nlohmann::json& first = report["first_divergence"];
  if (first.is_null()) return answer;  // nothing to explain
  // The source around the pivot as each run sent it (this node's copy).
  auto excerpt = [this](const std::string& run, const nlohmann::json& site) -> std::string {
    if (!site.is_object() || !site["file"].is_string() || !site["line"].is_number_unsigned()) return {};
    auto source = SourceJson(run, site["file"].get<std::string>());
    return source.ok() ? SourceExcerpt((*source)["text"].get<std::string>(), site["line"].get<uint32_t>()) : "";
  };
  nlohmann::json runs = nlohmann::json::object();
  for (const std::string& name : {reference, suspect}) {
    auto run = GetRun(name);
    if (run.ok()) runs[name] = RunJson(*run);
  }
  const std::string prompt = ExplainPrompt(report, excerpt(reference, first["site"]["reference"]),
                                           excerpt(suspect, first["site"]["suspect"]), runs);
  const std::string hash = explainer_.EvidenceHash(prompt);
  answer["evidence_hash"] = hash;
  std::optional<nlohmann::json> kept = explainer_.Cached(hash);
  answer["cached"] = kept.has_value();
  if (!kept && ask) {
    metrics_->explanations_asked.fetch_add(1, std::memory_order_relaxed);
    OPGUARD_ASSIGN_OR_RETURN(nlohmann::json fresh, explainer_.Ask(hash, prompt, cancel));
    kept = std::move(fresh);
  }
  if (kept) answer["generated"] = *kept;
  return answer;
}

void QueryService::SetApiRouter(ApiRouter router) { api_router_ = std::move(router); }

std::optional<std::pair<int, std::string>> QueryService::ForwardApi(const std::string& target) {
  return cluster_.ForwardApi(target, kDefaultPeerTimeout);
}

void QueryService::SetHttpAddress(std::string address) {
  std::lock_guard<std::mutex> lock(mu_);
  http_address_ = std::move(address);
}

std::vector<RunState> QueryService::ListRuns() const {
  auto runs = registry_->Runs();
  std::sort(runs.begin(), runs.end(),
            [](const RunState& a, const RunState& b) { return a.id < b.id; });
  return runs;
}

Result<RunState> QueryService::GetRun(const std::string& name) const {
  auto run = registry_->Find(name);
  if (!run) return NotFound("no run named '" + name + "'");
  return *run;
}

Result<TracePage> QueryService::ReadTrace(const std::string& name, uint32_t rank, uint32_t lane,
                                          uint64_t from_op, uint32_t max_ops) const {
  auto run = registry_->Find(name);
  if (!run) return NotFound("no run named '" + name + "'");
  if (run->ranks.count(rank) == 0) {
    return NotFound("run '" + name + "' has no rank " + std::to_string(rank));
  }
  max_ops = std::clamp<uint32_t>(max_ops, 1, config_.max_trace_page);
  TracePage page;
  page.next_op = from_op;
  std::set<uint64_t> string_ids, site_ids;
  size_t bytes = 0;
  bool more = false;
  // Keep an answer well inside the message limit whatever the record sizes.
  const size_t byte_budget = config_.max_message_bytes / 2;
  Status st = store_->ScanOps(run->id, rank, lane, from_op, max_ops,
                              [&](uint64_t op_index, const rocksdb::Slice& value) {
                                if (bytes > byte_budget) return;
                                auto op = wire::OpenStored<wire::OpRecord>(value.data(), value.size());
                                if (!op.ok()) return;  // skip a corrupt record, keep paging
                                string_ids.insert((*op)->name());
                                if ((*op)->site()) site_ids.insert((*op)->site());
                                if ((*op)->forward_site()) site_ids.insert((*op)->forward_site());
                                if (const auto* k = (*op)->kernels()) string_ids.insert(k->begin(), k->end());
                                page.ops.emplace_back(value.data(), value.size());
                                bytes += value.size();
                                page.next_op = op_index + 1;
                              },
                              &more);
  OPGUARD_RETURN_IF_ERROR(st);
  page.done = !more && bytes <= byte_budget;
  if (auto next = store_->NextLane(run->id, rank, lane)) page.next_lane = *next;
  page.sites = store_->GetSites(run->id, {site_ids.begin(), site_ids.end()});
  for (const auto& [id, s] : page.sites) {
    string_ids.insert(s.file);
    string_ids.insert(s.function);
  }
  page.strings = store_->GetStrings(run->id, {string_ids.begin(), string_ids.end()});
  return page;
}

Status QueryService::DeleteRun(const std::string& name, const Caller& caller) {
  auto denied = [this](const std::string& why) {
    metrics_->queries_denied.fetch_add(1, std::memory_order_relaxed);
    return InvalidArgument("permission denied: " + why);
  };
  if (!caller.unix_socket || !caller.uid) {
    return denied("runs are removed only through the daemon's unix query socket (query_socket, " +
                  (config_.query_socket.empty() ? std::string("off") : config_.query_socket) + ")");
  }
  OPGUARD_ASSIGN_OR_RETURN(RunState run, GetRun(name));
  if (!admin_.MayChange(*caller.uid, run.owner_uid)) {
    return denied("run '" + name + "' belongs to " +
                  (run.owner_uid == kUnknownOwner ? std::string("no known uid")
                                                  : "uid " + std::to_string(run.owner_uid)) +
                  "; only its owner, root or the admin group (" + admin_.group() + ") may remove it");
  }
  return writer_->DeleteRun(name, std::chrono::seconds(30));
}

Result<nlohmann::json> QueryService::Preflight(const std::string& run_a, const std::string& run_b,
                                               const std::string& name, uint64_t max_steps, bool replace,
                                               const Caller& caller, const CancelToken* cancel) {
  OPGUARD_RETURN_IF_ERROR(CheckPlanName(name));
  if (run_a == run_b) return InvalidArgument("preflight needs two runs, not '" + run_a + "' twice");
  OPGUARD_ASSIGN_OR_RETURN(RunState a, GetRun(run_a));
  OPGUARD_ASSIGN_OR_RETURN(RunState b, GetRun(run_b));
  // Two runs of one configuration, or their differences are the settings'.
  if (auto difference = ConfigDifference(PlanConfig::Of(a), run_b, PlanConfig::Of(b))) {
    return InvalidArgument("runs '" + run_a + "' and '" + run_b +
                           "' are not self-replays of one configuration: '" + run_a + "' has " + *difference);
  }
  if (!replace && plans_.Get(name).ok()) {
    return InvalidArgument("a plan named '" + name + "' exists (--replace overwrites it; `opguard rm --plan " +
                           name + "` removes it)");
  }
  OPGUARD_ASSIGN_OR_RETURN(auto report, PreflightHere(*store_, &traces_, a, b, max_steps, cancel));
  PlanInputs in;
  in.name = name;
  in.run_a = &a;
  in.run_b = &b;
  in.max_steps = max_steps;
  in.owner_uid = caller.uid ? static_cast<int64_t>(*caller.uid) : kUnknownOwner;
  in.created_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  nlohmann::json plan = MakePlan(in, report);
  OPGUARD_RETURN_IF_ERROR(plans_.Put(plan, /*replace=*/true));
  return plan;
}

Result<std::vector<nlohmann::json>> QueryService::Plans(const std::string& name) const {
  if (name.empty()) return plans_.List();
  OPGUARD_ASSIGN_OR_RETURN(nlohmann::json plan, plans_.Get(name));
  return std::vector<nlohmann::json>{std::move(plan)};
}

Status QueryService::DeletePlan(const std::string& name, const Caller& caller) {
  if (!caller.unix_socket || !caller.uid) {
    metrics_->queries_denied.fetch_add(1, std::memory_order_relaxed);
    return InvalidArgument("permission denied: plans are removed only through the daemon's unix query socket");
  }
  OPGUARD_ASSIGN_OR_RETURN(nlohmann::json plan, plans_.Get(name));
  const int64_t owner = plan.value("owner_uid", kUnknownOwner);
  if (!admin_.MayChange(*caller.uid, owner)) {
    metrics_->queries_denied.fetch_add(1, std::memory_order_relaxed);
    return InvalidArgument("permission denied: plan '" + name + "' belongs to uid " + std::to_string(owner) +
                           "; only its owner, root or the admin group (" + admin_.group() + ") may remove it");
  }
  return plans_.Delete(name);
}

std::string QueryService::Answer(const void* data, size_t size, const Caller& caller,
                                 const CancelToken* cancel) {
  flatbuffers::FlatBufferBuilder b(4096);
  auto error = [&](const std::string& message) {
    metrics_->query_errors.fetch_add(1, std::memory_order_relaxed);
    b.Clear();
    wire::FinishEnvelope(b, wire::CreateErrorAnswer(b, b.CreateString(message)));
  };
  // A received frame may start at any address; FlatBuffers needs alignment.
  wire::AlignedStorage storage;
  auto opened = wire::OpenEnvelope(data, size, storage, config_.max_message_bytes);
  if (!opened.ok()) {
    error(opened.status().message());
  } else {
    const wire::Envelope* env = *opened;
    switch (env->message_type()) {
      case wire::Message::ListRunsRequest:
        wire::FinishEnvelope(b, ListRunsAnswer(b));
        break;
      case wire::Message::ApiRequest: {
        const auto* target = env->message_as_ApiRequest()->target();
        if (!api_router_ || target == nullptr) {
          error("this daemon does not answer JSON API requests");
          break;
        }
        auto [status, body] = api_router_(target->str(), cancel);
        wire::FinishEnvelope(b, wire::CreateApiAnswer(b, static_cast<uint16_t>(status), b.CreateString(body)));
        break;
      }
      case wire::Message::ReadTraceRequest: {
        const auto* q = env->message_as_ReadTraceRequest();
        auto page = ReadTrace(q->run() ? q->run()->str() : "", q->rank(), q->lane(), q->from_op(),
                              q->max_ops());
        if (!page.ok()) {
          error(page.status().message());
          break;
        }
        std::vector<flatbuffers::Offset<wire::OpRecord>> ops;
        ops.reserve(page->ops.size());
        for (const auto& value : page->ops) {
          ops.push_back(CopyOpRecord(b, flatbuffers::GetRoot<wire::OpRecord>(value.data())));
        }
        std::vector<flatbuffers::Offset<wire::StringDef>> strings;
        for (const auto& [id, text] : page->strings) {
          strings.push_back(wire::CreateStringDef(b, id, b.CreateString(text)));
        }
        std::vector<flatbuffers::Offset<wire::SiteDef>> sites;
        for (const auto& [id, s] : page->sites) {
          sites.push_back(wire::CreateSiteDef(b, id, s.file, s.line, s.function));
        }
        wire::FinishEnvelope(b, wire::CreateReadTraceAnswer(b, b.CreateVector(ops), b.CreateVector(strings),
                                                            b.CreateVector(sites), page->next_op,
                                                            page->done, page->next_lane));
        break;
      }
      case wire::Message::DeleteRunRequest: {
        const auto* q = env->message_as_DeleteRunRequest();
        Status st = DeleteRun(q->run() ? q->run()->str() : "", caller);
        if (!st.ok()) {
          error(st.message());
        } else {
          wire::FinishEnvelope(b, wire::CreateOkAnswer(b));
        }
        break;
      }
      case wire::Message::StatusRequest:
        wire::FinishEnvelope(b, StatusAnswer(b));
        break;
      case wire::Message::PreflightRequest:
      case wire::Message::PlansRequest: {
        auto str = [](const flatbuffers::String* s) { return s ? s->str() : std::string(); };
        Result<std::vector<nlohmann::json>> plans = std::vector<nlohmann::json>{};
        if (env->message_type() == wire::Message::PreflightRequest) {
          const auto* q = env->message_as_PreflightRequest();
          auto plan = Preflight(str(q->run_a()), str(q->run_b()), str(q->name()), q->max_steps(), q->replace(),
                                caller, cancel);
          plans = plan.ok() ? Result<std::vector<nlohmann::json>>(std::vector<nlohmann::json>{*plan})
                            : Result<std::vector<nlohmann::json>>(plan.status());
        } else {
          plans = Plans(str(env->message_as_PlansRequest()->name()));
        }
        if (!plans.ok()) {
          error(plans.status().message());
          break;
        }
        std::vector<flatbuffers::Offset<flatbuffers::String>> documents;
        for (const auto& p : *plans) {
          documents.push_back(b.CreateString(p.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
        }
        wire::FinishEnvelope(b, wire::CreatePlansAnswer(b, b.CreateVector(documents)));
        break;
      }
      case wire::Message::DeletePlanRequest: {
        const auto* name = env->message_as_DeletePlanRequest()->name();
        Status st = DeletePlan(name ? name->str() : "", caller);
        if (!st.ok()) {
          error(st.message());
        } else {
          wire::FinishEnvelope(b, wire::CreateOkAnswer(b));
        }
        break;
      }
      case wire::Message::DiffRequest:
      case wire::Message::RanksRequest:
      case wire::Message::CollectivesRequest: {
        Result<std::string> answer =
            env->message_type() == wire::Message::DiffRequest
                ? cluster_.Diff(*env->message_as_DiffRequest(), cancel)
            : env->message_type() == wire::Message::RanksRequest
                ? cluster_.Ranks(*env->message_as_RanksRequest(), cancel)
                : cluster_.Collectives(*env->message_as_CollectivesRequest(), cancel);
        if (!answer.ok()) {
          error(answer.status().message());
          break;
        }
        return std::move(answer).value();
      }
      default:
        error(std::string("unsupported request ") + wire::EnumNameMessage(env->message_type()) +
              " on the query endpoint");
    }
  }
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

namespace {

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::KeyValue>>> PairsToWire(
    flatbuffers::FlatBufferBuilder& b, const std::vector<std::pair<std::string, std::string>>& kv) {
  std::vector<flatbuffers::Offset<wire::KeyValue>> out;
  for (const auto& [k, v] : kv) out.push_back(wire::CreateKeyValue(b, b.CreateString(k), b.CreateString(v)));
  return b.CreateVectorOfSortedTables(&out);
}

// The user name of `uid` on this host; empty for an unknown owner or a uid
// without a passwd entry.
std::string UserName(int64_t uid) {
  if (uid < 0) return {};
  struct passwd pw {};
  struct passwd* found = nullptr;
  std::vector<char> buf(4096);
  if (getpwuid_r(static_cast<uid_t>(uid), &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return {};
  }
  return pw.pw_name;
}

flatbuffers::Offset<wire::RunSummary> RunSummaryToWire(flatbuffers::FlatBufferBuilder& b, const RunState& run) {
  std::vector<flatbuffers::Offset<wire::RankSummary>> ranks;
  for (const auto& [r, s] : run.ranks) {
    ranks.push_back(wire::CreateRankSummary(b, r, s.ops, s.collectives, s.steps, s.gap_records,
                                            b.CreateString(s.node), s.ended, s.collective_gap_records,
                                            s.gap_notices, s.batches, s.bytes, s.local_rank, s.pid,
                                            s.first_ns, s.last_ns));
  }
  auto name = b.CreateString(run.name);
  auto job_id = b.CreateString(run.job_id);
  auto ranks_vec = b.CreateVector(ranks);
  auto determinism = PairsToWire(b, run.determinism);
  auto framework = b.CreateString(run.framework);
  auto versions = PairsToWire(b, run.versions);
  auto environment = PairsToWire(b, run.environment);
  auto owner = b.CreateString(UserName(run.owner_uid));
  return wire::CreateRunSummary(b, name, job_id, run.world_size, ranks_vec, run.start_ns, run.LastNs(),
                                determinism, framework, versions, environment, run.owner_uid, owner);
}

template <typename T>
const T& Root(const flatbuffers::FlatBufferBuilder& b) {
  return *flatbuffers::GetRoot<T>(b.GetBufferPointer());
}

}  // namespace

flatbuffers::Offset<wire::ListRunsAnswer> QueryService::ListRunsAnswer(flatbuffers::FlatBufferBuilder& b) const {
  std::vector<flatbuffers::Offset<wire::RunSummary>> runs;
  for (const auto& run : ListRuns()) runs.push_back(RunSummaryToWire(b, run));
  return wire::CreateListRunsAnswer(b, b.CreateVector(runs));
}

flatbuffers::Offset<wire::StatusAnswer> QueryService::StatusAnswer(flatbuffers::FlatBufferBuilder& b) const {
  std::string http;
  {
    std::lock_guard<std::mutex> lock(mu_);
    http = http_address_;
  }
  const auto uptime = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now() - started_)
                          .count();
  std::vector<flatbuffers::Offset<flatbuffers::String>> peers;
  for (const auto& p : config_.peers) peers.push_back(b.CreateString(p));
  std::vector<flatbuffers::Offset<wire::IngestPause>> pauses;
  for (const auto& p : writer_->Pauses()) {
    pauses.push_back(wire::CreateIngestPause(b, b.CreateString(p.cause), b.CreateString(p.reason),
                                             static_cast<uint64_t>(p.since_unix_ns)));
  }
  return wire::CreateStatusAnswer(b, b.CreateString(OPGUARD_VERSION), b.CreateString(Hostname()),
                                  b.CreateString(config_.data_dir), static_cast<uint64_t>(uptime),
                                  static_cast<uint64_t>(registry_->Count()),
                                  metrics_->ops.load() + metrics_->collectives.load(),
                                  metrics_->RejectedTotal(), store_->DiskBytes(),
                                  b.CreateString(http), b.CreateString(config_.ingest),
                                  b.CreateString(config_.listen), b.CreateVector(peers),
                                  !writer_->Failed(), b.CreateVector(pauses));
}

nlohmann::json QueryService::RunJson(const RunState& run) const {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(RunSummaryToWire(b, run));
  return daemon::RunJson(Root<wire::RunSummary>(b));
}

nlohmann::json QueryService::RunsJson() const {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(ListRunsAnswer(b));
  return daemon::RunsJson(Root<wire::ListRunsAnswer>(b));
}

nlohmann::json QueryService::StatusJson() const {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(StatusAnswer(b));
  return daemon::StatusJson(Root<wire::StatusAnswer>(b));
}

nlohmann::json QueryService::TraceJson(const std::string& run, uint32_t rank, uint32_t lane,
                                       const TracePage& page) const {
  auto str = [&](uint64_t id) -> nlohmann::json {
    auto it = page.strings.find(id);
    if (it == page.strings.end()) return nullptr;
    return it->second;
  };
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& value : page.ops) {
    const auto* op = flatbuffers::GetRoot<wire::OpRecord>(value.data());
    nlohmann::json inputs = nlohmann::json::array();
    if (op->inputs()) {
      for (const auto* v : *op->inputs()) {
        switch (v->kind()) {
          case wire::ValueKind::Tensor:
            inputs.push_back({{"kind", "tensor"}, {"tensor", TensorJson(v->tensor())}});
            break;
          case wire::ValueKind::Scalar:
            // bits_hex: JavaScript numbers cannot hold every 64-bit pattern.
            inputs.push_back({{"kind", "scalar"}, {"bits", v->scalar_bits()},
                              {"bits_hex", ToHex16(v->scalar_bits())},
                              {"dtype", DTypeName(v->scalar_dtype())}});
            break;
          case wire::ValueKind::TensorList:
            inputs.push_back({{"kind", "tensor_list"}, {"tensors", TensorsJson(v->tensors())}});
            break;
          default:
            inputs.push_back({{"kind", "none"}});
        }
      }
    }
    auto site_json = [&](uint64_t id) -> nlohmann::json {
      auto it = page.sites.find(id);
      if (it == page.sites.end()) return nullptr;
      return {{"file", str(it->second.file)}, {"line", it->second.line},
              {"function", str(it->second.function)}};
    };
    nlohmann::json kernels = nlohmann::json::array();
    if (op->kernels()) {
      for (uint64_t k : *op->kernels()) kernels.push_back(str(k));
    }
    ops.push_back({{"op_index", op->op_index()},
                   {"lane", op->lane()},
                   {"step", op->step()},
                   {"name", str(op->name())},
                   {"site", site_json(op->site())},
                   {"forward_site", site_json(op->forward_site())},
                   {"seq_nr", op->seq_nr()},
                   {"backward", op->backward()},
                   {"nondeterministic", op->nondeterministic()},
                   {"trusted", op->trusted()},
                   {"inputs", inputs},
                   {"outputs", TensorsJson(op->outputs())},
                   {"kernels", kernels},
                   {"start_ns", op->start_ns()},
                   {"duration_ns", op->duration_ns()}});
  }
  return {{"run", run}, {"rank", rank}, {"lane", lane}, {"ops", ops},
          {"next_op", page.next_op}, {"done", page.done}};
}

}  // namespace opguard::daemon
