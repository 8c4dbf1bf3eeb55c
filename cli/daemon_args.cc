#include "cli/daemon_args.h"

#include <cstdio>
#include <cstdlib>

#include "opguard/daemon/client.h"

namespace opguard::cli {

bool ParseDaemonArgs(int argc, char** argv, const char* usage, bool allow_json, DaemonArgs* out,
                     const ExtraOptions& extra) {
  out->endpoint = daemon::kDefaultQueryEndpoint;
  if (const char* env = std::getenv("OPGUARD_DAEMON"); env && *env) out->endpoint = env;
  const std::string cmd = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string option = a;
    const std::function<const char*()> value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "opguard %s: %s needs a value\n", cmd.c_str(), option.c_str());
        return nullptr;
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf("usage: opguard %s\n", usage);
      std::exit(0);
    } else if (a == "--daemon") {
      const char* v = value();
      if (!v) return false;
      out->endpoint = v;
    } else if (a.rfind("--daemon=", 0) == 0) {
      out->endpoint = a.substr(9);
    } else if (a == "--timeout") {
      const char* v = value();
      if (!v) return false;
      char* end = nullptr;
      out->timeout_s = std::strtod(v, &end);
      if (end == v || *end || out->timeout_s <= 0 || out->timeout_s > 3600) {
        std::fprintf(stderr, "opguard %s: --timeout wants seconds (0 < S <= 3600)\n", cmd.c_str());
        return false;
      }
    } else if (allow_json && a == "--json") {
      out->json = true;
    } else if (a.rfind("--", 0) == 0) {
      int handled = extra ? extra(a, value) : 0;
      if (handled < 0) return false;
      if (handled == 0) {
        std::fprintf(stderr, "opguard %s: unknown option %s (usage: opguard %s)\n", cmd.c_str(),
                     a.c_str(), usage);
        return false;
      }
    } else {
      out->positional.push_back(a);
    }
  }
  return true;
}

void PrintJson(const nlohmann::json& j) {
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace opguard::cli
