#include "opguard/daemon/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace opguard::daemon {
namespace {

constexpr size_t kZ85KeyChars = 40;

bool IsZ85Key(const std::string& s) {
  if (s.size() != kZ85KeyChars) return false;
  uint8_t bytes[32];
  return zmq_z85_decode(bytes, s.c_str()) != nullptr;
}

std::string FirstWord(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  in >> word;
  return word;
}

Result<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read key file " + path + ": " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().size() > (1u << 20)) return InvalidArgument(path + ": not a key file (too large)");
  return text.str();
}

Status WriteFile0600(const std::string& path, const std::string& text, bool overwrite) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  const int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    return errno == EEXIST ? InvalidArgument(path + " exists (--force replaces it)")
                           : Unavailable("cannot write " + path + ": " + std::strerror(errno));
  }
  // O_CREAT honours the umask; an existing file keeps its mode: set it.
  const bool ok = ::fchmod(fd, 0600) == 0 &&
                  ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  return ok ? Status::Ok() : Unavailable("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace

Result<CurveKeyPair> GenerateKeyPair() {
  if (!zmq_has("curve")) return Unavailable("this libzmq was built without CURVE (libsodium)");
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) return Internal(std::string("zmq_curve_keypair: ") + zmq_strerror(errno));
  return CurveKeyPair{pub, sec};
}

Status WriteKeyPair(const std::string& base, const CurveKeyPair& keys, const std::string& comment,
                    bool overwrite) {
  const auto parent = std::filesystem::path(base).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent)) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return Unavailable("cannot create " + parent.string() + ": " + ec.message());
    (void)::chmod(parent.c_str(), 0700);
  }
  const std::string key_text =
      "# OpGuard CURVE keypair (opguard keygen). Keep it secret: mode 0600.\n"
      "public-key = " + keys.public_key + "\nsecret-key = " + keys.secret_key + "\n";
  OPGUARD_RETURN_IF_ERROR(WriteFile0600(base + ".key", key_text, overwrite));
  return WriteFile0600(base + ".pub", keys.public_key + " " + comment + "\n", overwrite);
}

Result<CurveKeyPair> ReadKeyPair(const std::string& path) {
  auto text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  CurveKeyPair keys;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = FirstWord(line.substr(0, eq));
    const std::string value = FirstWord(line.substr(eq + 1));
    if (name == "public-key") keys.public_key = value;
    if (name == "secret-key") keys.secret_key = value;
  }
  if (!IsZ85Key(keys.public_key) || !IsZ85Key(keys.secret_key)) {
    return InvalidArgument(path + ": not an opguard keygen keypair (public-key = / secret-key = lines)");
  }
  char derived[kZ85KeyChars + 1];
  if (zmq_curve_public(derived, keys.secret_key.c_str()) != 0 || keys.public_key != derived) {
    return InvalidArgument(path + ": its public key does not belong to its secret key");
  }
  return keys;
}

Result<std::string> ReadPublicKey(const std::string& key_or_path) {
  if (IsZ85Key(key_or_path) && !std::filesystem::exists(key_or_path)) return key_or_path;
  auto text = ReadSmallFile(key_or_path);
  if (!text.ok()) return text.status();
  if (text->find("public-key") != std::string::npos) {
    auto pair = ReadKeyPair(key_or_path);
    if (!pair.ok()) return pair.status();
    return pair->public_key;
  }
  const std::string word = FirstWord(*text);
  if (!IsZ85Key(word)) return InvalidArgument(key_or_path + ": not a public key (40 Z85 characters)");
  return word;
}

Result<std::vector<std::string>> ReadAuthorizedKeys(const std::string& path) {
  auto text = ReadSmallFile(path);
  if (!text.ok()) return text.status();
  std::vector<std::string> keys;
  std::istringstream lines(*text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    const std::string word = FirstWord(line);
    if (word.empty()) continue;
    if (IsZ85Key(word)) {
      keys.push_back(word);
    } else if (word[0] != '#') {
      return InvalidArgument(path + ":" + std::to_string(n) + ": not a public key (40 Z85 characters)");
    }
  }
  return keys;
}

}  // namespace opguard::daemon
