#include "query/cluster.h"

#include <algorithm>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "opguard/aligner/cross_rank.h"
#include "opguard/aligner/diff.h"
#include "opguard/daemon/client.h"
#include "opguard/daemon/report_wire.h"
#include "opguard/aligner/preflight.h"
#include "query/plans.h"
#include "query/trace_cache.h"

namespace opguard::daemon {
namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;
using Clock = std::chrono::steady_clock;

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

struct NodeInfo {
  std::string endpoint;
  std::string node;
  std::vector<uint32_t> ranks;
  bool answered = true;
  std::string error;
  double seconds = 0;
};

Offset<flatbuffers::Vector<Offset<wire::NodeAnswer>>> NodesToWire(
    FlatBufferBuilder& b, const std::vector<NodeInfo>& nodes) {
  std::vector<Offset<wire::NodeAnswer>> out;
  for (const auto& n : nodes) {
    auto endpoint = b.CreateString(n.endpoint);
    auto node = b.CreateString(n.node);
    auto ranks = b.CreateVector(n.ranks);
    Offset<flatbuffers::String> error;
    if (!n.error.empty()) error = b.CreateString(n.error);
    out.push_back(wire::CreateNodeAnswer(b, endpoint, node, ranks, n.answered, error, n.seconds));
  }
  return b.CreateVector(out);
}

std::vector<NodeInfo> NodesFromWire(const flatbuffers::Vector<Offset<wire::NodeAnswer>>* v) {
  std::vector<NodeInfo> out;
  if (v == nullptr) return out;
  for (const auto* n : *v) {
    NodeInfo i;
    i.endpoint = Str(n->endpoint());
    i.node = Str(n->node());
    if (n->ranks()) i.ranks.assign(n->ranks()->begin(), n->ranks()->end());
    i.answered = n->answered();
    i.error = Str(n->error());
    i.seconds = n->seconds();
    out.push_back(std::move(i));
  }
  return out;
}

Offset<flatbuffers::Vector<Offset<flatbuffers::String>>> Strings(
    FlatBufferBuilder& b, const std::vector<std::string>& v) {
  std::vector<Offset<flatbuffers::String>> out;
  for (const auto& s : v) out.push_back(b.CreateString(s));
  return b.CreateVector(out);
}

std::string Bytes(const FlatBufferBuilder& b) {
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

std::vector<uint32_t> ExpectedRanks(uint32_t world_size,
                                    const std::map<uint32_t, RankState>& present) {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < world_size; ++r) out.push_back(r);
  for (const auto& [r, s] : present) {
    if (r >= world_size) out.push_back(r);
  }
  return out;
}

// One peer's answer, asked on its own thread: a DaemonClient per call (the
// client is single-threaded), bounded by `timeout`.
struct PeerCall {
  std::string endpoint;
  Clock::time_point started;
  std::future<Result<Answer>> answer;
};

std::vector<PeerCall> AskPeers(const Config& config, const FlatBufferBuilder& request,
                               std::chrono::milliseconds timeout) {
  std::vector<PeerCall> calls;
  auto bytes = std::make_shared<std::string>(Bytes(request));
  for (const std::string& peer : config.peers) {
    // A shared peer list may name this daemon too.
    if (peer == config.listen || peer == config.query_socket) continue;
    PeerCall c;
    c.endpoint = peer;
    c.started = Clock::now();
    // Peers of a cluster share the daemon keypair (docs/operations.md): this
    // daemon's key is both the client key and the peer's server key, so a
    // peer's answer comes through CURVE from a holder of that key.
    CurveClientConfig curve;
    if (!config.curve_key_file.empty()) curve = {config.curve_key_file, config.curve_key_file};
    c.answer = std::async(std::launch::async, [peer, timeout, bytes, curve]() -> Result<Answer> {
      DaemonClient client(peer, timeout, curve);
      flatbuffers::FlatBufferBuilder b;
      b.PushFlatBuffer(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
      return client.Call(b);
    });
    calls.push_back(std::move(c));
  }
  return calls;
}

NodeInfo PeerFailure(const PeerCall& c, const Status& st) {
  NodeInfo n;
  n.endpoint = c.endpoint;
  n.answered = false;
  n.error = st.message();
  n.seconds = std::chrono::duration<double>(Clock::now() - c.started).count();
  return n;
}

// The message of type T in the peer's `answer` (c.answer.get()). No answer,
// or one of another type: the peer's failure goes to `part`'s nodes and notes
// and the result is null.
template <typename T, typename Part>
const T* AnswerOf(const PeerCall& c, Result<Answer>& answer, Part& part) {
  const T* a = nullptr;
  if (answer.ok()) {
    a = answer->envelope()->template message_as<T>();
    if (a == nullptr) answer = DataLoss("unexpected answer type");
  }
  if (!answer.ok()) {
    part.nodes.push_back(PeerFailure(c, answer.status()));
    part.notes.push_back("peer " + c.endpoint + " did not answer: " + answer.status().message());
  }
  return a;
}

// The peer's own entry of an answer's `nodes`, as this receiver saw the call.
NodeInfo AnsweredNode(const PeerCall& c, const flatbuffers::Vector<Offset<wire::NodeAnswer>>* nodes) {
  auto peer_nodes = NodesFromWire(nodes);
  NodeInfo n = peer_nodes.empty() ? NodeInfo{} : peer_nodes.front();
  n.endpoint = c.endpoint;
  n.seconds = std::chrono::duration<double>(Clock::now() - c.started).count();
  return n;
}

std::chrono::milliseconds PeerTimeout(uint32_t ms) {
  return ms == 0 ? kDefaultPeerTimeout : std::chrono::milliseconds(ms);
}

// ---- diff ------------------------------------------------------------------

struct DiffPart {
  std::vector<aligner::RankDiff> ranks;
  std::set<uint32_t> expected;
  std::vector<std::string> notes;
  std::vector<NodeInfo> nodes;
  std::map<uint64_t, aligner::Communicator> communicators;  // the suspect's, for explanations
};

Offset<flatbuffers::Vector<Offset<wire::CommunicatorDef>>> CommunicatorsToWire(
    FlatBufferBuilder& b, const std::map<uint64_t, aligner::Communicator>& communicators) {
  std::vector<Offset<wire::CommunicatorDef>> comms;
  for (const auto& [id, c] : communicators) {
    comms.push_back(wire::CreateCommunicatorDef(b, c.id, b.CreateString(c.name),
                                                static_cast<uint32_t>(c.ranks.size()),
                                                b.CreateVector(c.ranks)));
  }
  return b.CreateVector(comms);
}

void AddCommunicators(const flatbuffers::Vector<Offset<wire::CommunicatorDef>>* defs,
                      std::map<uint64_t, aligner::Communicator>* into) {
  if (defs == nullptr) return;
  for (const auto* c : *defs) into->emplace(c->id(), CommunicatorFromWire(*c));
}

// The ranks this node diffs (held for both runs; only `rank` unless it is
// negative). Adds the expected ranks, and a note for each rank held for one
// run only, to `part`.
std::vector<uint32_t> DiffRanksHere(const RunState& ref, const RunState& sus, int64_t rank,
                                    const std::string& node, DiffPart* part) {
  const uint32_t world = std::max(ref.world_size, sus.world_size);
  std::map<uint32_t, RankState> present = ref.ranks;
  present.insert(sus.ranks.begin(), sus.ranks.end());
  if (rank >= 0) {
    part->expected.insert(static_cast<uint32_t>(rank));
  } else {
    for (uint32_t r : ExpectedRanks(world, present)) part->expected.insert(r);
  }
  auto wanted = [rank](uint32_t r) { return rank < 0 || r == static_cast<uint32_t>(rank); };
  std::vector<uint32_t> local;
  for (const auto& [r, s] : sus.ranks) {
    if (!wanted(r)) continue;
    if (ref.ranks.count(r)) {
      local.push_back(r);
    } else {
      part->notes.push_back("rank " + std::to_string(r) + ": " + node +
                            " holds the suspect run's records but not the reference's");
    }
  }
  for (const auto& [r, s] : ref.ranks) {
    if (wanted(r) && !sus.ranks.count(r)) {
      part->notes.push_back("rank " + std::to_string(r) + ": " + node +
                            " holds the reference run's records but not the suspect's");
    }
  }
  return local;
}

// Aligns `local` ranks of the two runs as stored here, into part->ranks.
// `plan_keys` (ascending): structural keys a preflight found nondeterministic;
// their ops are flagged so the walk skips them (cached traces are copied).
Status DiffHere(const Store& store, TraceCache* traces, const RunState& ref, const RunState& sus,
                const std::vector<uint32_t>& local, const wire::DiffRequest& q,
                const std::vector<uint64_t>& plan_keys, const CancelToken* cancel, DiffPart* part) {
  if (!local.empty()) {
    OPGUARD_ASSIGN_OR_RETURN(auto comms, LoadCommunicators(store, sus.id));
    for (auto& c : comms) part->communicators.emplace(c.id, std::move(c));
  }
  RunReader ref_reader(&store, ref, traces), sus_reader(&store, sus, traces);
  aligner::DiffContext ctx;
  ctx.reference_details = &ref_reader.details();
  ctx.suspect_details = &sus_reader.details();
  ctx.reference_strings = &ref_reader.strings();
  ctx.suspect_strings = &sus_reader.strings();
  ctx.options.tolerate_gaps_older_than = q.tolerate_gaps_older_than();
  ctx.cancel = cancel;
  for (uint32_t r : local) {
    // One rank at a time: two traces of ~80 bytes per op in memory at most
    // (besides the cache). The two runs' scans (read, decompress, verify,
    // reduce to events) are independent: the reference's runs on a second
    // thread.
    auto ref_loading = std::async(std::launch::async, [&ref_reader, r, cancel] {
      return ref_reader.Rank(r, cancel);
    });
    auto sus_loaded = sus_reader.Rank(r, cancel);
    auto ref_loaded = ref_loading.get();
    OPGUARD_ASSIGN_OR_RETURN(SharedTrace ref_trace, std::move(ref_loaded));
    OPGUARD_ASSIGN_OR_RETURN(SharedTrace sus_trace, std::move(sus_loaded));
    if (!plan_keys.empty()) {
      aligner::RankTrace ref_marked = *ref_trace, sus_marked = *sus_trace;
      aligner::MarkNondeterministic(ref_marked, plan_keys);
      aligner::MarkNondeterministic(sus_marked, plan_keys);
      OPGUARD_ASSIGN_OR_RETURN(auto d, aligner::DiffRank(ref_marked, sus_marked, ctx));
      part->ranks.push_back(std::move(d));
      continue;
    }
    OPGUARD_ASSIGN_OR_RETURN(auto d, aligner::DiffRank(*ref_trace, *sus_trace, ctx));
    part->ranks.push_back(std::move(d));
  }
  return Status::Ok();
}

std::string DiffAnswerBytes(const DiffPart& part, const aligner::DiffReport& merged) {
  FlatBufferBuilder b(64 * 1024);
  std::vector<Offset<wire::RankDiff>> ranks;
  for (const auto& r : merged.ranks) ranks.push_back(RankDiffToWire(b, r));
  auto ranks_vec = b.CreateVector(ranks);
  auto expected = b.CreateVector(std::vector<uint32_t>(part.expected.begin(), part.expected.end()));
  auto missing = b.CreateVector(merged.missing_ranks);
  auto diverging = b.CreateVector(merged.diverging_ranks);
  auto nodes = NodesToWire(b, part.nodes);
  auto notes = Strings(b, part.notes);
  auto comms = CommunicatorsToWire(b, part.communicators);
  wire::FinishEnvelope(b, wire::CreateDiffAnswer(b, StatusToWire(merged.status), ranks_vec,
                                                 expected, missing, diverging, nodes, notes, comms));
  return Bytes(b);
}

// ---- collectives -----------------------------------------------------------

struct CollectivesPart {
  std::map<uint32_t, std::vector<aligner::CollectiveEvent>> ranks;
  std::map<uint64_t, aligner::Communicator> communicators;
  std::map<uint64_t, std::string> strings;
  std::map<uint64_t, aligner::StringResolver::Site> sites;
  std::vector<CollectiveGapRange> gaps;
  std::set<uint32_t> expected;
  std::vector<std::string> notes;
  std::vector<NodeInfo> nodes;
  bool knows_run = false;
};

// One record per (communicator, seq): Completed when there is one (it carries
// the outputs), else Entered (a rank still inside the collective).
std::vector<aligner::CollectiveEvent> OnePerCollective(
    std::vector<aligner::CollectiveEvent> events) {
  std::map<std::pair<uint64_t, uint64_t>, aligner::CollectiveEvent> by_key;
  for (auto& e : events) {
    auto key = std::make_pair(e.communicator, e.seq);
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      by_key.emplace(key, std::move(e));
    } else if (e.phase == aligner::CollectivePhase::kCompleted &&
               it->second.phase != aligner::CollectivePhase::kCompleted) {
      // The Entered time says since when a rank waits; keep it on the record.
      uint64_t entered_ns = it->second.time_ns;
      it->second = std::move(e);
      if (entered_ns != 0) it->second.time_ns = entered_ns;
    }
  }
  std::vector<aligner::CollectiveEvent> out;
  out.reserve(by_key.size());
  for (auto& [k, e] : by_key) out.push_back(std::move(e));
  return out;
}

Offset<wire::CollectivesAnswer> CollectivesToWire(FlatBufferBuilder& b, const CollectivesPart& part,
                                                  aligner::DiffStatus status,
                                                  const std::vector<uint32_t>& missing) {
  // Every rank is listed (its presence is what `partial` is decided on); its
  // records travel in the groups.
  std::vector<Offset<wire::RankCollectives>> ranks;
  for (const auto& [rank, events] : part.ranks) ranks.push_back(wire::CreateRankCollectives(b, rank));
  auto ranks_vec = b.CreateVector(ranks);
  auto groups_vec = CollectiveGroupsToWire(b, part.ranks);
  auto comms_vec = CommunicatorsToWire(b, part.communicators);
  std::vector<Offset<wire::StringDef>> strings;
  for (const auto& [id, text] : part.strings)
    strings.push_back(wire::CreateStringDef(b, id, b.CreateString(text)));
  auto strings_vec = b.CreateVector(strings);
  std::vector<Offset<wire::SiteDef>> sites;
  for (const auto& [id, s] : part.sites)
    sites.push_back(wire::CreateSiteDef(b, id, s.file, s.line, s.function));
  auto sites_vec = b.CreateVector(sites);
  std::vector<Offset<wire::CollectiveGap>> gaps;
  for (const auto& g : part.gaps) {
    gaps.push_back(wire::CreateCollectiveGap(b, g.rank, g.communicator, g.first_seq, g.last_seq));
  }
  auto gaps_vec = b.CreateVector(gaps);
  auto expected = b.CreateVector(std::vector<uint32_t>(part.expected.begin(), part.expected.end()));
  auto missing_vec = b.CreateVector(missing);
  auto nodes = NodesToWire(b, part.nodes);
  auto notes = Strings(b, part.notes);
  return wire::CreateCollectivesAnswer(b, StatusToWire(status), ranks_vec, comms_vec, strings_vec,
                                       sites_vec, gaps_vec, expected, missing_vec, nodes, notes,
                                       groups_vec);
}

void MergeCollectives(CollectivesPart* into, const wire::CollectivesAnswer& a) {
  for (auto& rc : CollectivesFromWire(a)) {
    if (into->ranks.count(rc.rank)) {
      into->notes.push_back("rank " + std::to_string(rc.rank) +
                            " answered by two daemons; first answer kept");
      continue;
    }
    into->ranks[rc.rank] = std::move(rc.events);
  }
  if (a.communicators()) {
    AddCommunicators(a.communicators(), &into->communicators);
  }
  if (a.strings()) {
    for (const auto* s : *a.strings()) into->strings.emplace(s->id(), Str(s->text()));
  }
  if (a.sites()) {
    for (const auto* s : *a.sites())
      into->sites.emplace(s->id(),
                          aligner::StringResolver::Site{s->file(), s->line(), s->function()});
  }
  if (a.gaps()) {
    for (const auto* g : *a.gaps())
      into->gaps.push_back({g->rank(), g->communicator(), g->first_seq(), g->last_seq()});
  }
  if (a.expected_ranks())
    into->expected.insert(a.expected_ranks()->begin(), a.expected_ranks()->end());
  if (a.notes()) {
    for (const auto* n : *a.notes()) into->notes.push_back(n->str());
  }
}

// The merged verdict (status, missing ranks) of a collectives part: built
// once, read back through the same code the CLI uses.
std::pair<aligner::DiffStatus, std::vector<uint32_t>> CollectivesVerdict(
    const CollectivesPart& part) {
  FlatBufferBuilder b(64 * 1024);
  b.Finish(CollectivesToWire(b, part, aligner::DiffStatus::kIdentical, {}));
  auto report =
      CheckCollectivesAnswer(*flatbuffers::GetRoot<wire::CollectivesAnswer>(b.GetBufferPointer()));
  return {report.status, report.missing_ranks};
}

}  // namespace

ClusterQueries::ClusterQueries(const Config& config, const Store* store, const RunRegistry* registry,
                               TraceCache* traces, std::string node)
    : config_(config), store_(store), registry_(registry), traces_(traces), node_(std::move(node)) {}

Result<std::string> ClusterQueries::Diff(const wire::DiffRequest& q, const CancelToken* cancel) {
  // A query abandoned while it waited for a worker stops here.
  OPGUARD_RETURN_IF_ERROR(CheckCancel(cancel));
  const std::string ref_name = Str(q.reference()), sus_name = Str(q.suspect());
  if (ref_name.empty() || sus_name.empty())
    return InvalidArgument("diff needs a reference and a suspect run");
  const auto timeout = PeerTimeout(q.peer_timeout_ms());
  auto ref = registry_->Find(ref_name);
  auto sus = registry_->Find(sus_name);
  // A plan is read by the receiver, refused for runs of another
  // configuration (those it holds), and travels to the peers as its keys.
  std::vector<uint64_t> plan_keys;
  std::string plan_note;
  if (const std::string plan_name = Str(q.plan()); !plan_name.empty()) {
    OPGUARD_ASSIGN_OR_RETURN(nlohmann::json plan, LoadPlan(*store_, plan_name));
    OPGUARD_ASSIGN_OR_RETURN(PlanUse use, ReadPlanUse(plan_name, plan));
    for (const auto* run : {&ref, &sus}) {
      if (!*run) continue;
      if (auto why = ConfigMismatch(plan_name, use.config, (*run)->name, PlanConfig::Of(**run))) {
        return InvalidArgument(*why);
      }
    }
    plan_keys = std::move(use.keys);
    plan_note = "plan '" + plan_name + "': " + std::to_string(plan_keys.size()) +
                " boundary(ies) nondeterministic in preflight, skipped as evidence";
  } else if (q.plan_keys()) {
    plan_keys.assign(q.plan_keys()->begin(), q.plan_keys()->end());
    std::sort(plan_keys.begin(), plan_keys.end());
  }
  std::vector<PeerCall> calls;
  if (!q.local_only()) {
    FlatBufferBuilder b;
    wire::FinishEnvelope(
        b, wire::CreateDiffRequest(b, b.CreateString(ref_name), b.CreateString(sus_name), q.rank(),
                                   true, q.peer_timeout_ms(), q.tolerate_gaps_older_than(), 0,
                                   plan_keys.empty() ? 0 : b.CreateVector(plan_keys)));
    calls = AskPeers(config_, b, timeout);
  }

  // This node's ranks, while the peers work on theirs.
  const auto started = Clock::now();
  DiffPart part;
  if (!plan_note.empty()) part.notes.push_back(plan_note);
  NodeInfo self;
  self.endpoint = config_.listen;
  self.node = node_;
  if (ref && sus) {
    const std::vector<uint32_t> local = DiffRanksHere(*ref, *sus, q.rank(), node_, &part);
    OPGUARD_RETURN_IF_ERROR(DiffHere(*store_, traces_, *ref, *sus, local, q, plan_keys, cancel, &part));
    self.ranks = local;
  } else if (!q.local_only()) {
    if (!ref && !sus) {
      part.notes.push_back(node_ + " holds neither run");
    } else {
      part.notes.push_back(node_ + " holds run '" + (ref ? ref_name : sus_name) + "' but not '" +
                           (ref ? sus_name : ref_name) + "'");
    }
  }
  self.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  part.nodes.push_back(self);

  for (auto& c : calls) {
    auto answer = c.answer.get();
    const auto* a = AnswerOf<wire::DiffAnswer>(c, answer, part);
    if (a == nullptr) continue;
    part.nodes.push_back(AnsweredNode(c, a->nodes()));
    if (a->ranks()) {
      for (const auto* r : *a->ranks()) part.ranks.push_back(RankDiffFromWire(*r));
    }
    if (a->expected_ranks())
      part.expected.insert(a->expected_ranks()->begin(), a->expected_ranks()->end());
    if (a->notes()) {
      for (const auto* note : *a->notes()) part.notes.push_back(note->str());
    }
    AddCommunicators(a->communicators(), &part.communicators);
  }
  if (!q.local_only() && part.ranks.empty() && part.expected.empty()) {
    std::string why;
    for (const auto& n : part.notes) why += "; " + n;
    return NotFound("runs '" + ref_name + "' and '" + sus_name + "' are not both stored on " +
                    node_ + (config_.peers.empty() ? std::string() : " or its peers") + why +
                    " (see `opguard runs`)");
  }
  // Missing peers' ranks are exactly expected - answered: MergeRankDiffs
  // names them and makes the answer partial.
  std::vector<uint32_t> expected(part.expected.begin(), part.expected.end());
  aligner::DiffReport merged = aligner::MergeRankDiffs(part.ranks, expected);
  return DiffAnswerBytes(part, merged);
}

Result<std::string> ClusterQueries::Collectives(const wire::CollectivesRequest& q,
                                                const CancelToken* cancel) {
  OPGUARD_RETURN_IF_ERROR(CheckCancel(cancel));
  const std::string name = Str(q.run());
  if (name.empty()) return InvalidArgument("collectives needs a run name");
  std::vector<PeerCall> calls;
  if (!q.local_only()) {
    FlatBufferBuilder b;
    wire::FinishEnvelope(
        b, wire::CreateCollectivesRequest(b, b.CreateString(name), true, q.peer_timeout_ms()));
    calls = AskPeers(config_, b, PeerTimeout(q.peer_timeout_ms()));
  }
  const auto started = Clock::now();
  CollectivesPart part;
  NodeInfo self;
  self.endpoint = config_.listen;
  self.node = node_;
  if (auto run = registry_->Find(name)) {
    part.knows_run = true;
    for (uint32_t r : ExpectedRanks(run->world_size, run->ranks)) part.expected.insert(r);
    OPGUARD_RETURN_IF_ERROR(CheckCancel(cancel));
    OPGUARD_ASSIGN_OR_RETURN(auto all, LoadCollectives(*store_, run->id));
    OPGUARD_RETURN_IF_ERROR(CheckCancel(cancel));
    std::set<uint64_t> site_ids;
    std::vector<uint32_t> local;
    for (const auto& [r, s] : run->ranks) local.push_back(r);
    for (uint32_t r : local) {
      auto it = all.find(r);
      auto events = it == all.end() ? std::vector<aligner::CollectiveEvent>()
                                    : OnePerCollective(std::move(it->second));
      for (const auto& e : events) {
        if (e.site != 0) site_ids.insert(e.site);
      }
      // A rank with records but no collective: present, entered nothing.
      part.ranks[r] = std::move(events);
      self.ranks.push_back(r);
    }
    OPGUARD_ASSIGN_OR_RETURN(auto comms, LoadCommunicators(*store_, run->id));
    for (auto& c : comms) part.communicators.emplace(c.id, std::move(c));
    OPGUARD_ASSIGN_OR_RETURN(part.gaps, LoadCollectiveGaps(*store_, run->id, local));
    std::set<uint64_t> string_ids;
    for (const auto& [id, s] : store_->GetSites(run->id, {site_ids.begin(), site_ids.end()})) {
      string_ids.insert(s.file);
      string_ids.insert(s.function);
      part.sites[id] = {s.file, s.line, s.function};
    }
    part.strings = store_->GetStrings(run->id, {string_ids.begin(), string_ids.end()});
  } else if (!q.local_only()) {
    part.notes.push_back(node_ + " holds no records of run '" + name + "'");
  }
  self.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  part.nodes.push_back(self);
  bool anyone_knows = part.knows_run;
  for (auto& c : calls) {
    auto answer = c.answer.get();
    const auto* a = AnswerOf<wire::CollectivesAnswer>(c, answer, part);
    if (a == nullptr) continue;
    part.nodes.push_back(AnsweredNode(c, a->nodes()));
    anyone_knows = anyone_knows || (a->ranks() && a->ranks()->size() != 0);
    MergeCollectives(&part, *a);
  }
  if (!q.local_only() && !anyone_knows && part.expected.empty()) {
    return NotFound("no run named '" + name + "' on " + node_ +
                    (config_.peers.empty() ? std::string() : " or its peers"));
  }
  auto [status, missing] = CollectivesVerdict(part);
  FlatBufferBuilder b(64 * 1024);
  wire::FinishEnvelope(b, CollectivesToWire(b, part, status, missing));
  return Bytes(b);
}

Result<std::string> ClusterQueries::Ranks(const wire::RanksRequest& q, const CancelToken* cancel) {
  OPGUARD_RETURN_IF_ERROR(CheckCancel(cancel));
  const std::string name = Str(q.run());
  if (name.empty()) return InvalidArgument("ranks needs a run name");
  std::vector<uint32_t> replicas;
  if (q.replicas()) replicas.assign(q.replicas()->begin(), q.replicas()->end());
  std::vector<PeerCall> calls;
  if (!q.local_only()) {
    FlatBufferBuilder b;
    wire::FinishEnvelope(
        b, wire::CreateRanksRequest(b, b.CreateString(name), true, q.peer_timeout_ms(),
                                    b.CreateVector(replicas)));
    calls = AskPeers(config_, b, PeerTimeout(q.peer_timeout_ms()));
  }
  // The collectives part (this node only; peers' parts arrive in their answers).
  FlatBufferBuilder cq;
  cq.Finish(wire::CreateCollectivesRequest(cq, cq.CreateString(name), true, q.peer_timeout_ms()));
  OPGUARD_ASSIGN_OR_RETURN(
      std::string local_bytes,
      Collectives(*flatbuffers::GetRoot<wire::CollectivesRequest>(cq.GetBufferPointer()), cancel));
  CollectivesPart part;
  const auto* local = wire::GetEnvelope(local_bytes.data())->message_as_CollectivesAnswer();
  MergeCollectives(&part, *local);
  part.nodes = NodesFromWire(local->nodes());
  bool anyone_knows = local->ranks() && local->ranks()->size() != 0;

  // Replicas held here are compared here, against the lowest of them.
  std::vector<aligner::ReplicaReport> groups;
  std::vector<std::string> group_nodes;
  auto run = registry_->Find(name);
  if (run && !replicas.empty()) {
    std::vector<uint32_t> held;
    for (uint32_t r : std::set<uint32_t>(replicas.begin(), replicas.end())) {
      if (run->ranks.count(r)) held.push_back(r);
    }
    if (held.size() >= 2) {
      std::vector<SharedTrace> traces;
      RunReader reader(store_, *run, traces_);
      for (uint32_t r : held) {
        OPGUARD_ASSIGN_OR_RETURN(auto t, reader.Rank(r, cancel));
        traces.push_back(std::move(t));
      }
      std::vector<const aligner::RankTrace*> ptrs;
      for (const auto& t : traces) ptrs.push_back(t.get());
      aligner::DiffContext ctx;
      ctx.reference_details = ctx.suspect_details = &reader.details();
      ctx.reference_strings = ctx.suspect_strings = &reader.strings();
      ctx.cancel = cancel;
      OPGUARD_ASSIGN_OR_RETURN(auto report, aligner::CompareReplicas(ptrs, ctx));
      groups.push_back(std::move(report));
      group_nodes.push_back(node_);
    } else if (held.size() == 1) {
      part.notes.push_back("replica rank " + std::to_string(held[0]) + " is the only one on " +
                           node_ + ": compared with the others through collective outputs only");
    }
  }
  for (auto& c : calls) {
    auto answer = c.answer.get();
    const auto* a = AnswerOf<wire::RanksAnswer>(c, answer, part);
    if (a == nullptr) continue;
    if (a->collectives()) {
      part.nodes.push_back(AnsweredNode(c, a->collectives()->nodes()));
      anyone_knows =
          anyone_knows || (a->collectives()->ranks() && a->collectives()->ranks()->size() != 0);
      MergeCollectives(&part, *a->collectives());
    }
    if (a->replicas()) {
      for (const auto* g : *a->replicas()) {
        groups.push_back(ReplicaGroupFromWire(*g));
        group_nodes.push_back(Str(g->node()));
      }
    }
  }
  if (!q.local_only() && !anyone_knows && part.expected.empty()) {
    return NotFound("no run named '" + name + "' on " + node_ +
                    (config_.peers.empty() ? std::string() : " or its peers"));
  }
  auto [status, missing] = CollectivesVerdict(part);
  FlatBufferBuilder b(64 * 1024);
  auto collectives = CollectivesToWire(b, part, status, missing);
  std::vector<Offset<wire::ReplicaGroup>> replica_groups;
  for (size_t i = 0; i < groups.size(); ++i)
    replica_groups.push_back(ReplicaGroupToWire(b, groups[i], group_nodes[i]));
  wire::FinishEnvelope(b, wire::CreateRanksAnswer(b, collectives, b.CreateVector(replica_groups)));
  return Bytes(b);
}

bool ClusterQueries::HasPeers() const {
  return std::any_of(config_.peers.begin(), config_.peers.end(),
                     [this](const std::string& peer) { return peer != config_.listen; });
}

std::optional<std::pair<int, std::string>> ClusterQueries::ForwardApi(const std::string& target,
                                                                      std::chrono::milliseconds timeout) {
  FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateApiRequest(b, b.CreateString(target)));
  std::optional<std::pair<int, std::string>> found;
  for (PeerCall& c : AskPeers(config_, b, timeout)) {
    Result<Answer> answer = c.answer.get();  // every call is joined, also after a find
    if (found || !answer.ok()) continue;
    const auto* a = answer->envelope()->message_as_ApiAnswer();
    if (a == nullptr || a->status() == 404) continue;
    found.emplace(a->status(), a->body() ? a->body()->str() : std::string("{}"));
  }
  return found;
}

}  // namespace opguard::daemon
