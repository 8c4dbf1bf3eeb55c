// `opguard keygen [BASE]`: a CURVE keypair for the daemon's TCP endpoints
// (opguard/daemon/curve_keys.h, docs/operations.md "Keys"). Writes BASE.key
// (the keypair) and BASE.pub (the public key line for curve.authorized_keys),
// both mode 0600; BASE defaults to ~/.config/opguard/client, where the other
// commands look for their key.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/command.h"
#include "opguard/daemon/curve_keys.h"

namespace opguard::cli {
namespace {

struct KeygenArgs {
  std::string base;
  std::string comment;
  bool force = false;
};

std::string DefaultBase() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) return std::string(xdg) + "/opguard/client";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.config/opguard/client";
}

std::string DefaultComment() {
  char host[256] = "localhost";
  (void)::gethostname(host, sizeof host - 1);
  const char* user = std::getenv("USER");
  return std::string(user && *user ? user : "opguard") + "@" + host;
}

int KeygenMain(const KeygenArgs& args) {
  const std::string base = args.base.empty() ? DefaultBase() : args.base;
  auto keys = daemon::GenerateKeyPair();
  if (!keys.ok()) return Fail("keygen", keys.status());
  Status st = daemon::WriteKeyPair(base, *keys, args.comment.empty() ? DefaultComment() : args.comment, args.force);
  if (!st.ok()) return Fail("keygen", st);
  std::printf("wrote %s.key (keep it secret) and %s.pub\npublic key: %s\n", base.c_str(), base.c_str(),
              keys->public_key.c_str());
  return kExitOk;
}

std::function<int()> AddKeygen(CLI::App& cmd, const DaemonArgs&) {
  auto args = std::make_shared<KeygenArgs>();
  cmd.add_option("BASE", args->base,
                 "writes BASE.key and BASE.pub (default\n~/.config/opguard/client)");
  cmd.add_option("--comment", args->comment, "text after the key in BASE.pub (default USER@HOST)");
  cmd.add_flag("--force", args->force, "replace existing files");
  cmd.footer(
      "A daemon: `opguard keygen /etc/opguard/opguardd`, then curve.key_file =\n"
      "/etc/opguard/opguardd.key (readable by the opguard user only). A user: `opguard keygen`,\n"
      "then the line of ~/.config/opguard/client.pub goes into the daemon's\n"
      "curve.authorized_keys and the daemon's .pub into ~/.config/opguard/server.pub.\n"
      "Exit codes: 0 written; 2 an error (the files exist, cannot write, usage).");
  return [args] { return KeygenMain(*args); };
}

}  // namespace

OPGUARD_CLI_COMMAND(keygen, "keygen", "make a CURVE keypair for TCP queries (daemon or client)", &AddKeygen);

}  // namespace opguard::cli
