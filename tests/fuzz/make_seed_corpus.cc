// Writes the seed corpus of every fuzz harness (tests/fuzz/corpus/<harness>/)
// from real messages: the batches the seed runs are made of, every query
// request, the answers a daemon really sends its peers (asked of an
// in-process daemon holding the seed runs), HTTP requests of each route.
// Also the inputs of problems found before (one per file, named after what
// they caught). Usage: make_seed_corpus OUT_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_daemon.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace {

namespace fs = std::filesystem;
namespace wire = opguard::wire;
using opguard::daemon::testing::BatchOptions;
using opguard::daemon::testing::MakeBatch;

fs::path g_out;

void Write(const std::string& harness, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_out / harness);
  std::ofstream(g_out / harness / name, std::ios::binary) << bytes;
}

std::string Bytes(flatbuffers::FlatBufferBuilder& b) {
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

// A batch with one announce, built field by field (what MakeBatch does not
// vary): node, world size, rank, gap counts.
std::string AnnounceBatch(const std::string& run, uint32_t rank, uint32_t world_size, const std::string& node,
                          uint64_t gap_dropped) {
  flatbuffers::FlatBufferBuilder b;
  auto announce = wire::CreateRunAnnounce(b, b.CreateString("job"), 0, world_size, b.CreateString(node), 1,
                                          b.CreateString("pytorch"));
  std::vector<flatbuffers::Offset<wire::GapNotice>> gaps;
  if (gap_dropped != 0) gaps.push_back(wire::CreateGapNotice(b, 0, 0, 3, gap_dropped, b.CreateString("queue full")));
  auto run_s = b.CreateString(run);
  auto gaps_v = gaps.empty() ? 0 : b.CreateVector(gaps);
  wire::BatchBuilder bb(b);
  bb.add_run(run_s);
  bb.add_rank(rank);
  bb.add_session(11);
  bb.add_seq(0);
  bb.add_announce(announce);
  if (!gaps_v.IsNull()) bb.add_gaps(gaps_v);
  wire::FinishEnvelope(b, bb.Finish());
  return Bytes(b);
}

void IngestSeeds() {
  int i = 0;
  for (const std::string& batch : opguard::daemon::fuzz::SeedBatches()) {
    Write("ingest_batch", "seed-run-batch-" + std::to_string(i++), batch);
  }
  BatchOptions all;
  all.announce = all.definitions = true;
  all.steps_every = 2;
  all.collectives_every = 3;
  all.gaps = {{1, 2}};
  all.sources = {{"model.py", "def f():\n  return 1\n"}};
  Write("ingest_batch", "new-run-everything", MakeBatch("fresh", 0, 3, 0, 0, 6, all));
  Write("ingest_batch", "resend-of-seed", MakeBatch("ref", 0, 7, 0, 0, 16, all));
  Write("ingest_batch", "not-opguard", "GET / HTTP/1.1\r\n\r\n");
  flatbuffers::FlatBufferBuilder q;
  wire::FinishEnvelope(q, wire::CreateStatusRequest(q));
  Write("ingest_batch", "wrong-message-type", Bytes(q));
  // Problems of the past: a non-UTF-8 node name aborted the daemon; a huge
  // world size sized its memory; a gap count of 2^64-1 sent twice wrapped.
  Write("ingest_batch", "regression-node-not-utf8", AnnounceBatch("latin", 0, 2, "n\xff" "de", 0));
  Write("ingest_batch", "regression-world-size-2e7", AnnounceBatch("wide", 0, 20000000, "n", 0));
  Write("ingest_batch", "regression-rank-outside-world", AnnounceBatch("outside", 5, 2, "n", 0));
  Write("ingest_batch", "regression-gap-count-max", AnnounceBatch("gaps", 0, 2, "n", UINT64_MAX));
}

void QuerySeeds() {
  auto write = [](const std::string& name, auto make) {
    flatbuffers::FlatBufferBuilder b;
    wire::FinishEnvelope(b, make(b));
    Write("query_request", name, Bytes(b));
  };
  using B = flatbuffers::FlatBufferBuilder;
  write("status", [](B& b) { return wire::CreateStatusRequest(b); });
  write("list-runs", [](B& b) { return wire::CreateListRunsRequest(b); });
  write("read-trace", [](B& b) { return wire::CreateReadTraceRequest(b, b.CreateString("ref"), 1, 0, 4, 10); });
  write("delete-run", [](B& b) { return wire::CreateDeleteRunRequest(b, b.CreateString("ref")); });
  write("diff", [](B& b) {
    return wire::CreateDiffRequest(b, b.CreateString("ref"), b.CreateString("sus"), -1, false, 1000, 0);
  });
  write("diff-rank-local", [](B& b) {
    return wire::CreateDiffRequest(b, b.CreateString("ref"), b.CreateString("sus"), 1, true, 0, 5);
  });
  write("ranks", [](B& b) {
    std::vector<uint32_t> replicas = {0, 1};
    return wire::CreateRanksRequest(b, b.CreateString("sus"), false, 1000, b.CreateVector(replicas));
  });
  write("collectives", [](B& b) { return wire::CreateCollectivesRequest(b, b.CreateString("solo"), true, 0); });
  write("api-request", [](B& b) { return wire::CreateApiRequest(b, b.CreateString("/api/runs/ref/ranks/0/lanes")); });
}

// What a peer holding the seed runs answers (local_only requests), each
// behind the byte that picks the query the harness fans out.
void PeerSeeds() {
  opguard::daemon::fuzz::FuzzDaemon daemon;
  auto ask = [&daemon](flatbuffers::FlatBufferBuilder& b) { return daemon.service().Answer(b.GetBufferPointer(), b.GetSize()); };
  std::string diff, ranks, collectives, api;
  {
    flatbuffers::FlatBufferBuilder b;
    wire::FinishEnvelope(b, wire::CreateDiffRequest(b, b.CreateString("ref"), b.CreateString("sus"), -1, true, 0, 0));
    diff = ask(b);
  }
  {
    flatbuffers::FlatBufferBuilder b;
    std::vector<uint32_t> replicas = {0, 1};
    wire::FinishEnvelope(b, wire::CreateRanksRequest(b, b.CreateString("ref"), true, 0, b.CreateVector(replicas)));
    ranks = ask(b);
  }
  {
    flatbuffers::FlatBufferBuilder b;
    wire::FinishEnvelope(b, wire::CreateCollectivesRequest(b, b.CreateString("solo"), true, 0));
    collectives = ask(b);
  }
  {
    flatbuffers::FlatBufferBuilder b;
    wire::FinishEnvelope(b, wire::CreateApiRequest(b, b.CreateString("/api/runs/ref")));
    api = ask(b);
  }
  Write("peer_answer", "diff", std::string(1, '\0') + diff);
  Write("peer_answer", "ranks", std::string(1, '\1') + ranks);
  Write("peer_answer", "collectives", std::string(1, '\2') + collectives);
  Write("peer_answer", "http-diff", std::string(1, '\3') + diff);
  Write("peer_answer", "http-ranks", std::string(1, '\4') + ranks);
  Write("peer_answer", "http-collectives", std::string(1, '\5') + collectives);
  Write("peer_answer", "forward-api", std::string(1, '\6') + api);
  Write("peer_answer", "wrong-answer-type", std::string(1, '\0') + collectives);
}

const std::vector<std::pair<std::string, std::string>> kTargets = {
    {"status", "/api/status"},
    {"runs", "/api/runs"},
    {"run", "/api/runs/ref"},
    {"trace", "/api/runs/ref/ranks/0/trace?lane=0&from=3&max=5"},
    {"trace-count", "/api/runs/sus/ranks/1/trace?count=2&from=18446744073709551615"},
    {"lanes", "/api/runs/sus/ranks/1/lanes"},
    {"diff", "/api/diff?reference=ref&suspect=sus&rank=1&timeout=2"},
    {"ranks", "/api/runs/ref/ranks?replicas=0,1"},
    {"collectives", "/api/runs/solo/collectives"},
    {"alignment", "/api/alignment?reference=ref&suspect=sus&rank=1&lane=0&from=0&count=20&op=5"},
    {"source", "/api/source?run=ref&file=train.py"},
    {"metrics", "/metrics"},
    {"healthz", "/healthz"},
    {"viewer", "/diff?reference=ref"},
    {"escapes", "/api/runs/r%65f?x=a+b%20c"},
    {"regression-percent-zz", "/api/runs/a%zz"},
    {"regression-percent-00", "/api/runs/a%00"},
};

void HttpSeeds() {
  for (const auto& [name, target] : kTargets) {
    Write("api_target", name, target);
    Write("http_request", name, "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  }
  Write("http_request", "keep-alive-two",
        "GET /api/status HTTP/1.1\r\nHost: x\r\n\r\nGET /api/runs/ref HTTP/1.1\r\nHost: x\r\n\r\n");
  Write("http_request", "post-chunked",
        "POST /api/runs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  Write("http_request", "bearer-http10",
        "GET /api/runs HTTP/1.0\r\nAuthorization: Bearer 0123456789abcdef0123\r\nCookie: opguard_token=x\r\n\r\n");
  Write("http_request", "head-content-length", "HEAD /healthz HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  IngestSeeds();
  QuerySeeds();
  HttpSeeds();
  PeerSeeds();
  std::printf("seed corpus written under %s\n", argv[1]);
  return 0;
}
