#include "query/http_auth.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

namespace opguard::daemon {
namespace {

// Compares without stopping at the first difference, so the answer's timing
// does not tell how much of a guess was right.
bool SameSecret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The value of `name` in a list of "name=value" items split by `separator`.
std::string_view Item(std::string_view list, std::string_view name, char separator) {
  size_t i = 0;
  while (i <= list.size()) {
    size_t j = list.find(separator, i);
    if (j == std::string_view::npos) j = list.size();
    std::string_view item = list.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    if (item.size() > name.size() && item.substr(0, name.size()) == name && item[name.size()] == '=') {
      return item.substr(name.size() + 1);
    }
    i = j + 1;
  }
  return {};
}

}  // namespace

bool IsValidToken(std::string_view token) {
  return !token.empty() && std::all_of(token.begin(), token.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.' || c == '~';
  });
}

HttpTokenCheck CheckHttpToken(const std::string& token, bool loopback_peer, std::string_view authorization,
                              std::string_view cookie, std::string_view target) {
  if (token.empty() || loopback_peer) return {true, false};
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) == kBearer && SameSecret(authorization.substr(kBearer.size()), token)) {
    return {true, false};
  }
  if (SameSecret(Item(cookie, kTokenCookie, ';'), token)) return {true, false};
  if (auto q = target.find('?'); q != std::string_view::npos &&
                                 SameSecret(Item(target.substr(q + 1), "token", '&'), token)) {
    return {true, true};
  }
  return {false, false};
}

std::string TokenCookie(const std::string& token) {
  return std::string(kTokenCookie) + "=" + token + "; Path=/; HttpOnly; SameSite=Strict";
}

bool HostAllowed(std::string_view host, const std::vector<std::string>& names) {
  if (host.empty()) return true;
  if (host.front() == '[') {  // an IPv6 address, with or without a port
    const size_t end = host.find(']');
    if (end == std::string_view::npos) return false;
    const std::string inner(host.substr(1, end - 1));
    in6_addr v6{};
    return inet_pton(AF_INET6, inner.c_str(), &v6) == 1 &&
           (end + 1 == host.size() || host[end + 1] == ':');
  }
  if (const size_t colon = host.rfind(':'); colon != std::string_view::npos) {
    const std::string_view port = host.substr(colon + 1);
    if (port.empty() || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return false;
    }
    host = host.substr(0, colon);
  }
  std::string name(host);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!name.empty() && name.back() == '.') name.pop_back();
  in_addr v4{};
  if (inet_pton(AF_INET, name.c_str(), &v4) == 1) return true;
  if (name == "localhost" || (name.size() > 10 && name.ends_with(".localhost"))) return true;
  return std::any_of(names.begin(), names.end(), [&name](const std::string& n) {
    return n.size() == name.size() &&
           std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; });
  });
}

}  // namespace opguard::daemon
