#include "cli/daemon_args.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <unistd.h>

#include "opguard/daemon/client.h"
#include "opguard/daemon/user_daemon.h"

namespace opguard::cli {

// Set as soon as parsed (trigger_on_parse), so a command's preparse callback
// sees what the top level got before the command name.
void AddSharedOptions(CLI::App& app, DaemonArgs& args, bool json) {
  app.add_option_function<std::string>(
         "--daemon",
         [&args](const std::string& endpoint) {
           args.endpoint = endpoint;
           args.why = "--daemon";
           args.user_daemon = false;
         },
         "the daemon's query endpoint (default $OPGUARD_DAEMON,\n"
         "else ipc:///run/opguard/query.sock if present, else\n"
         "this user's daemon, started when needed); `rm`\n"
         "needs an ipc:// one")
      ->option_text("ENDPOINT")
      ->trigger_on_parse();
  app.add_option("--key", args.curve.key_file,
                 "your CURVE keypair for tcp:// (opguard keygen; default\n"
                 "$OPGUARD_KEY, else ~/.config/opguard/client.key)")
      ->option_text("FILE")
      ->trigger_on_parse();
  app.add_option("--server-key", args.curve.server_key,
                 "the daemon's public key, or its .pub file (default\n"
                 "$OPGUARD_SERVER_KEY, else ~/.config/opguard/server.pub)")
      ->option_text("KEY")
      ->trigger_on_parse();
  if (json) app.add_flag("--json", args.json, "print JSON instead of text")->trigger_on_parse();
}

void AddDaemonOptions(CLI::App& cmd, DaemonArgs& args, const DaemonArgs& top, bool json) {
  AddSharedOptions(cmd, args, json);
  char text[32];
  std::snprintf(text, sizeof text, "S (default %g)", args.timeout_s);
  cmd.add_option("--timeout", args.timeout_s, "bound on every call, in seconds")
      ->option_text(text)
      ->check([](const std::string& s) {
        const double v = std::strtod(s.c_str(), nullptr);
        return v > 0 && v <= 3600 ? std::string() : "wants seconds (0 < S <= 3600)";
      });
  // Runs when the command's own words start, after the top level's.
  cmd.preparse_callback([&args, &top](size_t) {
    args.endpoint = top.endpoint;
    args.why = top.why;
    args.user_daemon = top.user_daemon;
    args.curve = top.curve;
    args.json = top.json;
  });
}

std::function<int()> AddDaemonCommand(CLI::App& cmd, const DaemonArgs& top,
                                      int (*main)(const DaemonArgs&), double timeout_s, bool json,
                                      const char* run_help) {
  auto args = std::make_shared<DaemonArgs>();
  args->timeout_s = timeout_s;
  AddDaemonOptions(cmd, *args, top, json);
  if (run_help) cmd.add_option("RUN", args->positional, run_help)->required()->expected(1);
  return [args, main] {
    StartUserDaemonIfChosen(*args);
    return main(*args);
  };
}

void SetDefaults(DaemonArgs& args) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const char* daemon_env = std::getenv("OPGUARD_DAEMON");
  const char* ingest_env = std::getenv("OPGUARD_ENDPOINT");
  auto user = daemon::UserDaemonDirs();
  args.user_daemon = false;
  if (daemon_env && *daemon_env) {
    args.endpoint = daemon_env;
    args.why = "$OPGUARD_DAEMON";
  } else if (fs::exists(std::string(daemon::kDefaultQuerySocket).substr(6), ec)) {
    args.endpoint = daemon::kDefaultQuerySocket;
    args.why = "the node's daemon: its socket exists";
  } else if ((ingest_env && *ingest_env) || !user.ok()) {
    args.endpoint = daemon::kDefaultQueryEndpoint;
    args.why = ingest_env && *ingest_env
                   ? "the default query endpoint ($OPGUARD_ENDPOINT is set, so no daemon of your own)"
                   : "the default query endpoint (" + user.status().message() + ")";
  } else {
    args.endpoint = user->query();
    args.user_daemon = true;
    args.why = "your own daemon (no node daemon at " + std::string(daemon::kDefaultQuerySocket) +
               ", no $OPGUARD_DAEMON), data in " + user->state_dir;
  }
  std::string config_dir;
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) {
    config_dir = std::string(xdg) + "/opguard";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    config_dir = std::string(home) + "/.config/opguard";
  }
  auto from = [&](const char* env, const char* file) {
    if (const char* v = std::getenv(env); v && *v) return std::string(v);
    const std::string path = config_dir.empty() ? std::string() : config_dir + "/" + file;
    return !path.empty() && fs::exists(path, ec) ? path : std::string();
  };
  args.curve.key_file = from("OPGUARD_KEY", "client.key");
  args.curve.server_key = from("OPGUARD_SERVER_KEY", "server.pub");
}

void StartUserDaemonIfChosen(const DaemonArgs& args) {
  namespace fs = std::filesystem;
  if (!args.user_daemon) return;
  auto dirs = daemon::UserDaemonDirs();
  if (!dirs.ok() || daemon::SocketAnswers(dirs->ingest().substr(6))) return;
  std::error_code ec;
  const fs::path bin = fs::read_symlink("/proc/self/exe", ec).parent_path();
  std::string opguardd;
  for (const fs::path& candidate : {bin / "opguardd", bin / ".." / "sbin" / "opguardd"}) {
    if (opguardd.empty() && ::access(candidate.c_str(), X_OK) == 0) opguardd = candidate.lexically_normal();
  }
  if (opguardd.empty()) return;  // a build tree's CLI: finds a running one only
  auto started = daemon::EnsureUserDaemon(*dirs, opguardd, daemon::UserDaemonIdleExit(), std::chrono::seconds(60));
  if (!started.ok()) std::fprintf(stderr, "opguard: cannot start your daemon: %s\n", started.status().message().c_str());
}

int Fail(std::string_view command, const Status& st) {
  const char* hint = "";
  if (st.code() == StatusCode::kUnavailable) {
    hint =
        " · start one with `opguardd --local DIR`, or point at a running one with --daemon ENDPOINT"
        " or $OPGUARD_DAEMON";
  }
  std::fprintf(stderr, "opguard %.*s: %s%s\n", static_cast<int>(command.size()), command.data(),
               st.message().c_str(), hint);
  return 2;  // kExitError
}

void PrintJson(const nlohmann::json& j) {
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace opguard::cli
