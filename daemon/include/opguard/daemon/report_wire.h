// Aligner answers on the wire (idl/query.fbs, "Aligner queries"): the
// conversions between opguard::aligner's report structures and their
// FlatBuffers tables, and the merges every receiver of a cluster answer runs.
//
// Shared by the daemon (a peer builds these tables, the receiving daemon reads
// and merges them) and the CLI (it renders the merged answer), so that both
// sides produce the same report from the same bytes. Pure functions, any
// thread.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "opguard/aligner/cross_rank.h"
#include "opguard/aligner/diff.h"
#include "opguard/aligner/report.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {

flatbuffers::Offset<wire::RankDiff> RankDiffToWire(flatbuffers::FlatBufferBuilder& b,
                                                   const aligner::RankDiff& d);
aligner::RankDiff RankDiffFromWire(const wire::RankDiff& w);

flatbuffers::Offset<wire::ReplicaGroup> ReplicaGroupToWire(flatbuffers::FlatBufferBuilder& b,
                                                           const aligner::ReplicaReport& r,
                                                           const std::string& node);
aligner::ReplicaReport ReplicaGroupFromWire(const wire::ReplicaGroup& w);

// The summary record of one collective on one rank: no input tensors, output
// fingerprints only (what CheckCollectives compares).
flatbuffers::Offset<wire::CollectiveRecord> CollectiveToWire(flatbuffers::FlatBufferBuilder& b,
                                                             const aligner::CollectiveEvent& e);
aligner::CollectiveEvent CollectiveFromWire(const wire::CollectiveRecord& w);

// Many ranks' collective summaries as CollectiveGroups: one group per distinct
// record (every field but time_ns, which becomes the earliest of the ranks')
// naming the ranks that recorded it. Ranks of one job mostly record identical
// collectives, so an answer shrinks by about the number of ranks it covers.
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::CollectiveGroup>>>
CollectiveGroupsToWire(flatbuffers::FlatBufferBuilder& b,
                       const std::map<uint32_t, std::vector<aligner::CollectiveEvent>>& by_rank);
// Every rank listed in `a.ranks` (first listing wins) with its summaries from
// both `ranks[].events` and `groups`, in the order of `a.ranks`; each rank's
// records ordered by (communicator, seq).
std::vector<aligner::RankCollectives> CollectivesFromWire(const wire::CollectivesAnswer& a);
aligner::Communicator CommunicatorFromWire(const wire::CommunicatorDef& w);

// The full record as the aligner models it (wire::OpRecord one-to-one):
// the daemon's trace scans and the CLI's export read stored records with it.
void OpDetailFromRecord(const wire::OpRecord& r, aligner::OpDetail* out);

wire::DiffStatus StatusToWire(aligner::DiffStatus s);
aligner::DiffStatus StatusFromWire(wire::DiffStatus s);

// The cluster answer of `opguard diff`: MergeRankDiffs over every rank in the
// answer against its expected ranks, plus the answer's own notes (peers that
// did not answer, runs absent from a node).
aligner::DiffReport MergeDiffAnswer(const wire::DiffAnswer& a);

// The cluster answer of `opguard collectives`: CheckCollectives over every
// rank's collective summaries, with the answer's notes and collective gaps.
aligner::CollectivesReport CheckCollectivesAnswer(const wire::CollectivesAnswer& a);

// `opguard ranks` JSON ("kind": "ranks", docs/report-format.md) and text.
nlohmann::json RanksJson(const wire::RanksAnswer& a);
std::string RanksText(const wire::RanksAnswer& a);

// "nodes": who answered a cluster query, for the JSON reports.
nlohmann::json NodesJson(const flatbuffers::Vector<flatbuffers::Offset<wire::NodeAnswer>>* nodes);

}  // namespace opguard::daemon
