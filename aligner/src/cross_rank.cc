#include "opguard/aligner/cross_rank.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "view.h"

namespace opguard::aligner {
namespace {

bool OutputsMustAgree(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kAllGather ||
         k == CollectiveKind::kBroadcast;
}

bool PointToPoint(CollectiveKind k) { return k == CollectiveKind::kSend || k == CollectiveKind::kRecv; }

CollectiveMember MakeMember(uint32_t rank, const CollectiveEvent& e, const StringResolver* strings) {
  CollectiveMember m;
  m.rank = rank;
  m.kind = CollectiveKindName(e.kind);
  m.dtype = DTypeName(e.dtype);
  m.count = e.count;
  m.root = e.root;
  m.step = e.step;
  m.lane = e.lane;
  m.op_index = e.op_index;
  m.site = ResolveSite(strings, e.site);
  m.outputs = e.outputs;
  return m;
}

// One rank's view of one (communicator, seq): the Completed record when there
// is one (it carries outputs), else the Entered one.
struct Slot {
  const CollectiveEvent* event = nullptr;
  bool completed = false;
};

}  // namespace

CollectivesReport CheckCollectives(const std::vector<RankCollectives>& ranks,
                                   const std::vector<Communicator>& communicators,
                                   const StringResolver* strings,
                                   const std::vector<uint32_t>& expected_ranks) {
  CollectivesReport out;
  std::map<uint64_t, const Communicator*> defs;
  for (const Communicator& c : communicators) defs[c.id] = &c;

  // (communicator, seq) -> rank -> slot. Ordered maps: reports list
  // communicators and sequence numbers in a stable order.
  std::map<std::pair<uint64_t, uint64_t>, std::map<uint32_t, Slot>> table;
  std::map<uint64_t, std::map<uint32_t, RankProgress>> progress;
  std::map<uint64_t, std::map<uint32_t, const CollectiveEvent*>> last_entered_event;
  std::set<uint32_t> present;
  for (const RankCollectives& rc : ranks) {
    present.insert(rc.rank);
    for (const CollectiveEvent& e : rc.events) {
      Slot& s = table[{e.communicator, e.seq}][rc.rank];
      bool completed = e.phase == CollectivePhase::kCompleted;
      if (s.event == nullptr || (completed && !s.completed)) s = Slot{&e, completed};
      RankProgress& p = progress[e.communicator][rc.rank];
      p.rank = rc.rank;
      int64_t seq = static_cast<int64_t>(e.seq);
      if (seq > p.last_entered) {
        p.last_entered = seq;  // completion implies entry
        last_entered_event[e.communicator][rc.rank] = &e;
      }
      if (completed) p.last_completed = std::max(p.last_completed, seq);
    }
  }
  for (uint32_t r : std::set<uint32_t>(expected_ranks.begin(), expected_ranks.end())) {
    if (!present.count(r)) out.missing_ranks.push_back(r);
  }
  out.collectives = table.size();

  auto comm_name = [&](uint64_t id) -> std::string {
    auto it = defs.find(id);
    return it != defs.end() ? CommunicatorLabel(*it->second) : std::string();
  };

  for (const auto& [key, members] : table) {
    const auto& [comm, seq] = key;
    // Compare every member with the first one; the union of differing fields
    // names the desync.
    const CollectiveEvent* first = members.begin()->second.event;
    std::set<std::string> fields;
    bool p2p = true;
    for (const auto& [rank, slot] : members) p2p = p2p && PointToPoint(slot.event->kind);
    for (const auto& [rank, slot] : members) {
      const CollectiveEvent* e = slot.event;
      // Send/Recv pairs differ in kind and peer by design; only the payload
      // must agree.
      if (!p2p && e->kind != first->kind) fields.insert("kind");
      if (e->dtype != first->dtype) fields.insert("dtype");
      if (e->count != first->count) fields.insert("count");
      if (!p2p && e->root != first->root) fields.insert("root");
    }
    if (!fields.empty()) {
      CollectiveDesync d;
      d.communicator = comm;
      d.communicator_name = comm_name(comm);
      d.seq = seq;
      d.fields.assign(fields.begin(), fields.end());
      for (const auto& [rank, slot] : members) d.members.push_back(MakeMember(rank, *slot.event, strings));
      out.desyncs.push_back(std::move(d));
      continue;  // outputs of a desynced collective say nothing more
    }
    if (!OutputsMustAgree(first->kind)) continue;
    std::map<std::vector<std::pair<uint64_t, uint64_t>>, std::vector<uint32_t>> groups;
    for (const auto& [rank, slot] : members) {
      if (!slot.completed || slot.event->outputs.empty()) continue;
      std::vector<std::pair<uint64_t, uint64_t>> k;
      for (const Fp128& f : slot.event->outputs) k.emplace_back(f.lo, f.hi);
      groups[k].push_back(rank);
    }
    if (groups.size() <= 1) continue;
    CollectiveMismatch mm;
    mm.communicator = comm;
    mm.communicator_name = comm_name(comm);
    mm.seq = seq;
    mm.kind = CollectiveKindName(first->kind);
    for (auto& [k, rs] : groups) mm.groups.push_back(rs);
    std::stable_sort(mm.groups.begin(), mm.groups.end(),
                     [](const auto& a, const auto& b) { return a.size() > b.size(); });
    if (mm.groups[0].size() > mm.groups[1].size()) {
      for (size_t g = 1; g < mm.groups.size(); ++g) {
        mm.minority_ranks.insert(mm.minority_ranks.end(), mm.groups[g].begin(), mm.groups[g].end());
      }
      std::sort(mm.minority_ranks.begin(), mm.minority_ranks.end());
    }
    for (const auto& [rank, slot] : members) mm.members.push_back(MakeMember(rank, *slot.event, strings));
    out.mismatches.push_back(std::move(mm));
  }

  // Live view. A member without any record of a communicator has entered
  // nothing (-1), which is exactly the rank everyone else waits for.
  for (auto& [comm, by_rank] : progress) {
    CommunicatorLive live;
    live.communicator = comm;
    live.name = comm_name(comm);
    std::set<uint32_t> members;
    if (auto it = defs.find(comm); it != defs.end()) {
      members.insert(it->second->ranks.begin(), it->second->ranks.end());
    }
    for (const auto& [rank, p] : by_rank) members.insert(rank);
    int64_t all_completed = INT64_MAX;
    for (uint32_t r : members) {
      RankProgress p;
      p.rank = r;
      if (auto it = by_rank.find(r); it != by_rank.end()) p = it->second;
      if (auto it = last_entered_event[comm].find(r); it != last_entered_event[comm].end()) {
        p.last_step = it->second->step;
        p.last_site = ResolveSite(strings, it->second->site);
      }
      all_completed = std::min(all_completed, p.last_completed);
      live.ranks.push_back(p);
    }
    int64_t pending = all_completed + 1;
    bool someone_entered = false;
    for (const RankProgress& p : live.ranks) someone_entered = someone_entered || p.last_entered >= pending;
    if (someone_entered) {
      live.pending_seq = static_cast<uint64_t>(pending);
      auto slot_it = table.find({comm, static_cast<uint64_t>(pending)});
      for (const RankProgress& p : live.ranks) {
        if (p.last_entered < pending) {
          live.not_joined.push_back(p.rank);
        } else if (p.last_completed < pending) {
          live.waiting.push_back(p.rank);
          if (slot_it != table.end()) {
            if (auto s = slot_it->second.find(p.rank); s != slot_it->second.end()) {
              live.pending_kind = CollectiveKindName(s->second.event->kind);
              uint64_t t = s->second.event->time_ns;
              if (t != 0 && (live.waiting_since_ns == 0 || t < live.waiting_since_ns)) live.waiting_since_ns = t;
            }
          }
        }
      }
      out.waiting = out.waiting || (!live.not_joined.empty() && !live.waiting.empty());
    }
    for (auto it = table.lower_bound({comm, 0}); it != table.end() && it->first.first == comm; ++it) {
      const std::string kind = CollectiveKindName(it->second.begin()->second.event->kind);
      const uint64_t seq = it->first.second;
      if (!live.kinds.empty() && live.kinds.back().kind == kind && live.kinds.back().last_seq + 1 == seq) {
        live.kinds.back().last_seq = seq;
      } else {
        live.kinds.push_back({seq, seq, kind});
      }
    }
    out.live.push_back(std::move(live));
  }

  if (!out.missing_ranks.empty()) {
    out.status = DiffStatus::kPartial;
  } else if (!out.desyncs.empty() || !out.mismatches.empty()) {
    out.status = DiffStatus::kDiverged;
  } else {
    out.status = DiffStatus::kIdentical;
  }
  return out;
}

namespace {

bool AnyReplicated(const RankTrace& t) {
  for (const LaneTrace& lane : t.lanes) {
    for (const OpEvent& e : lane.ops) {
      if (e.replicated()) return true;
    }
  }
  return false;
}

// The trace restricted to its replicated ops. Op indices stay those of the
// full trace (so reports and gaps keep pointing at real positions).
RankTrace ReplicatedOnly(const RankTrace& t) {
  RankTrace out;
  out.rank = t.rank;
  out.gaps = t.gaps;
  for (const LaneTrace& lane : t.lanes) {
    LaneTrace kept;
    kept.lane = lane.lane;
    for (const OpEvent& e : lane.ops) {
      if (e.replicated()) kept.ops.push_back(e);
    }
    if (!kept.ops.empty()) out.lanes.push_back(std::move(kept));
  }
  return out;
}

uint64_t OpCount(const RankTrace& t) {
  uint64_t n = 0;
  for (const LaneTrace& lane : t.lanes) n += lane.ops.size();
  return n;
}

}  // namespace

Result<ReplicaReport> CompareReplicas(const std::vector<const RankTrace*>& replicas, const DiffContext& ctx) {
  ReplicaReport out;
  if (replicas.size() < 2) return InvalidArgument("replica comparison needs at least two ranks");
  std::vector<const RankTrace*> sorted = replicas;
  std::sort(sorted.begin(), sorted.end(), [](const RankTrace* a, const RankTrace* b) { return a->rank < b->rank; });
  for (const RankTrace* t : sorted) out.ranks.push_back(t->rank);

  // Replicas train on different data: their forward and backward ops differ by
  // design. What must agree is what they compute from the reduced gradients
  // (the optimizer's step) and whatever the program marked replicated; when
  // the traces carry such marks, only those ops are compared.
  out.replicated_only = std::any_of(sorted.begin(), sorted.end(),
                                    [](const RankTrace* t) { return AnyReplicated(*t); });
  std::vector<RankTrace> restricted;
  if (out.replicated_only) {
    restricted.reserve(sorted.size());
    for (const RankTrace* t : sorted) restricted.push_back(ReplicatedOnly(*t));
    for (size_t k = 0; k < sorted.size(); ++k) sorted[k] = &restricted[k];
    for (const RankTrace* t : sorted) {
      if (t->lanes.empty()) {
        out.notes.push_back("rank " + std::to_string(t->rank) +
                            " recorded no op marked replicated: is it a replica of the others?");
      }
    }
  } else {
    out.notes.push_back(
        "no op is marked replicated (the optimizer's step, opguard.replicated()): whole traces "
        "compared; replicas that train on different data differ from their first op");
  }
  out.compared_ops = OpCount(*sorted[0]);
  const RankTrace& base = *sorted[0];
  bool incomplete = false;
  const RankDiff* earliest = nullptr;
  for (size_t k = 1; k < sorted.size(); ++k) {
    OPGUARD_ASSIGN_OR_RETURN(RankDiff d, DiffRank(base, *sorted[k], ctx));
    out.pairs.push_back(std::move(d));
  }
  for (const RankDiff& d : out.pairs) {
    incomplete = incomplete || d.status == DiffStatus::kIncomplete;
    if (d.status != DiffStatus::kDiverged) continue;
    const FirstDivergence& fd = *d.first_divergence;
    if (earliest == nullptr || fd.reference.step < earliest->first_divergence->reference.step ||
        (fd.reference.step == earliest->first_divergence->reference.step &&
         fd.reference.lane == earliest->first_divergence->reference.lane &&
         fd.reference.op_index < earliest->first_divergence->reference.op_index)) {
      earliest = &d;
    }
  }
  if (earliest != nullptr) {
    out.first_divergence = earliest->first_divergence;
    // Majority vote at the pivot: the base's output digest against every
    // other rank's output at the op it paired with there. A rank that agrees
    // with the base at this op votes with it; one that diverged here votes
    // with its own digest.
    const FirstDivergence& fd = *earliest->first_divergence;
    std::map<std::pair<uint64_t, uint64_t>, std::vector<uint32_t>> votes;
    votes[{fd.reference.output_digest.lo, fd.reference.output_digest.hi}].push_back(base.rank);
    for (const RankDiff& d : out.pairs) {
      if (d.status == DiffStatus::kDiverged && d.first_divergence->lane == fd.lane &&
          d.first_divergence->reference.op_index == fd.reference.op_index) {
        const Fp128& f = d.first_divergence->suspect.output_digest;
        votes[{f.lo, f.hi}].push_back(d.rank);
      } else if (d.status == DiffStatus::kDiverged || d.status == DiffStatus::kIdentical) {
        votes[{fd.reference.output_digest.lo, fd.reference.output_digest.hi}].push_back(d.rank);
      }
    }
    size_t top = 0, top_count = 0;
    std::vector<std::vector<uint32_t>> groups;
    for (auto& [k, v] : votes) groups.push_back(v);
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].size() > top) {
        top = groups[g].size();
        top_count = 1;
      } else if (groups[g].size() == top) {
        ++top_count;
      }
    }
    if (top_count == 1) {
      for (const auto& g : groups) {
        if (g.size() == top) continue;
        out.odd_ranks.insert(out.odd_ranks.end(), g.begin(), g.end());
      }
      std::sort(out.odd_ranks.begin(), out.odd_ranks.end());
    } else {
      out.notes.push_back("no majority at the pivot: cannot tell which replica is wrong");
    }
  }
  out.status = incomplete ? DiffStatus::kIncomplete
               : earliest  ? DiffStatus::kDiverged
                           : DiffStatus::kIdentical;
  return out;
}

}  // namespace opguard::aligner
