// opguardd: the OpGuard node daemon. See `opguardd --help` and docs/daemon.md.
#include <cstdio>

#include "opguard/common/log.h"
#include "opguard/daemon/config.h"
#include "opguard/daemon/daemon.h"

int main(int argc, char** argv) {
  opguard::SetLogComponent("opguardd");
  bool help = false;
  auto config = opguard::daemon::ParseCommandLine(argc, argv, &help);
  if (help) {
    std::fputs(opguard::daemon::HelpText().c_str(), stdout);
    return 0;
  }
  if (!config.ok()) {
    std::fprintf(stderr, "opguardd: %s\n", config.status().message().c_str());
    return 2;
  }
  opguard::SetLogLevel(config->log_level);
  opguard::daemon::Daemon daemon(std::move(config).value());
  return daemon.Run();
}
