// The JSON API's parameters: any request target (path, percent escapes,
// query string, numbers) through the router the HTTP server and peers'
// ApiRequests use, over the seed runs. Properties: the route predicates and
// the router agree with themselves, an answer is 2xx-5xx, and every JSON
// answer parses.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_daemon.h"

using opguard::daemon::fuzz::Fail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static opguard::daemon::fuzz::FuzzDaemon daemon;
  const std::string target(reinterpret_cast<const char*>(data), size);
  (void)opguard::daemon::IsAlignerRoute(target);
  (void)opguard::daemon::IsForwardableApiRoute(target);
  auto r = opguard::daemon::RouteHttp("GET", target, &daemon.service(), &daemon.metrics(), &daemon.store());
  if (r.status < 200 || r.status > 599) Fail("HTTP status " + std::to_string(r.status));
  if (r.content_type == "application/json" && !nlohmann::json::accept(r.body)) {
    Fail("a JSON answer that does not parse: " + r.body.substr(0, 200));
  }
  return 0;
}
