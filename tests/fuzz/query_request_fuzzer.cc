// Query requests: any bytes a client can send to the query socket, answered
// by the real QueryService over the seed runs (as the og-query thread and
// the aligner workers do). The caller is a local user who owns none of the
// runs. Property: the answer is always an envelope, and nothing crashes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_daemon.h"
#include "opguard/idl/envelope.h"

using opguard::daemon::fuzz::Fail;
using opguard::daemon::fuzz::FuzzDaemon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static FuzzDaemon daemon;
  opguard::daemon::Caller caller;
  caller.unix_socket = true;
  caller.uid = ::getuid() + 4242;  // not root, not the daemon's user
  bool local_only = false;
  (void)opguard::daemon::QueryService::IsAlignerRequest(data, size, &local_only);
  const std::string answer = daemon.service().Answer(data, size, caller);
  if (!opguard::wire::OpenEnvelope(answer.data(), answer.size()).ok()) Fail("the answer is not an envelope");
  for (const char* run : opguard::daemon::fuzz::kSeedRuns) {
    if (!daemon.service().GetRun(run).ok()) Fail(std::string("seed run '") + run + "' is gone");
  }
  return 0;
}
