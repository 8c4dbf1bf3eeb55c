// Ingest: any bytes a sender can put in one frame of the ingest socket. The
// message goes through the real pipeline (verifier, limits, dedup, apply,
// group commit into RocksDB); then the run it named is read back as the
// query side serves it (registry JSON, a trace page from the store).
// Properties: every message gets an ack, nothing throws on the ingest thread,
// the store stays healthy, and whatever was accepted renders as strict UTF-8
// JSON.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_daemon.h"
#include "opguard/idl/envelope.h"

using opguard::daemon::fuzz::Fail;
using opguard::daemon::fuzz::FuzzDaemon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static FuzzDaemon daemon;
  namespace wire = opguard::wire;
  const uint64_t exceptions = daemon.metrics().ingest_exceptions.load();
  auto ack = daemon.SendBatch(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!ack) Fail("no ack for an ingest message");
  if (daemon.metrics().ingest_exceptions.load() != exceptions) Fail("handling an ingest message threw");
  if (daemon.ingest().Failed()) Fail("the store failed");
  auto opened = wire::OpenEnvelope(ack->data(), ack->size());
  if (!opened.ok() || (*opened)->message_as_Ack() == nullptr) Fail("the ack is not an Ack envelope");
  const auto* a = (*opened)->message_as_Ack();
  if (a->code() != wire::AckCode::Durable) return 0;

  // Accepted: the query side serves it. dump() throws on invalid UTF-8.
  const std::string run = a->run() ? a->run()->str() : std::string();
  auto state = daemon.service().GetRun(run);
  if (!state.ok()) Fail("an acknowledged run is not in the registry: " + state.status().message());
  (void)daemon.service().RunJson(*state).dump();
  for (const auto& [rank, unused] : state->ranks) {
    auto page = daemon.service().ReadTrace(run, rank, 0, 0, 64);
    if (page.ok()) (void)daemon.service().TraceJson(run, rank, 0, *page).dump();
  }
  // Other runs are removed again (through the pipeline, as `opguard rm`
  // does), so the daemon's state stays that of the seed runs.
  if (!opguard::daemon::fuzz::IsSeedRun(run)) {
    if (auto st = daemon.DeleteRun(run); !st.ok()) Fail("removing run '" + run + "': " + st.message());
  }
  return 0;
}
