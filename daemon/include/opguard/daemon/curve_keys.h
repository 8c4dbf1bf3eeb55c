// CURVE keys for the daemon's TCP endpoints (ZeroMQ's CurveZMQ: Curve25519
// keys, written as 40 Z85 characters). `opguard keygen BASE` writes
//   BASE.key  the keypair, mode 0600:  "public-key = Z85" and "secret-key = Z85"
//   BASE.pub  the public key, one line "Z85 COMMENT" (an authorized_keys line)
// The daemon serves TCP queries with its keypair (curve.key_file) to the
// clients whose public keys are listed in curve.authorized_keys; the CLI and
// peer daemons connect with their own keypair and the daemon's public key.
// Shared by the CLI, the daemon and tests (docs/operations.md, "Keys").
#pragma once

#include <string>
#include <vector>

#include "opguard/common/status.h"

namespace opguard::daemon {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

// A fresh keypair from libzmq (libsodium); Unavailable when libzmq was built
// without CURVE.
Result<CurveKeyPair> GenerateKeyPair();
// Writes BASE.key and BASE.pub (both mode 0600, parent dirs made 0700);
// refuses to replace existing files unless `overwrite`.
Status WriteKeyPair(const std::string& base, const CurveKeyPair& keys, const std::string& comment,
                    bool overwrite);
// Reads a BASE.key file; checks that its public key belongs to its secret key.
Result<CurveKeyPair> ReadKeyPair(const std::string& path);
// A public key given as its 40 Z85 characters, or as a file holding it (a
// .pub line or a .key file).
Result<std::string> ReadPublicKey(const std::string& key_or_path);
// An authorized_keys file: one public key per line (the first word; the rest
// is a comment), blank lines and lines starting with "# " ignored.
Result<std::vector<std::string>> ReadAuthorizedKeys(const std::string& path);

// How a client authenticates to a daemon on tcp:// endpoints (ipc:// ones
// use the socket's permissions and never CURVE). Both empty: plain TCP.
struct CurveClientConfig {
  std::string key_file;    // the client's keypair (BASE.key)
  std::string server_key;  // the daemon's public key: Z85, or a .pub/.key file
  bool empty() const { return key_file.empty() && server_key.empty(); }
};

}  // namespace opguard::daemon
