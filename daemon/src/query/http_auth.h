// The HTTP token (http.token_file): a client off loopback presents it as
// `Authorization: Bearer TOKEN`, as the opguard_token cookie, or once as
// `?token=TOKEN` in a URL (a browser opening the viewer), which answers with
// that cookie so the viewer's own requests carry it. Loopback clients need
// none. Private to the query room.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace opguard::daemon {

inline constexpr char kTokenCookie[] = "opguard_token";

struct HttpTokenCheck {
  bool allowed = false;
  bool set_cookie = false;  // the token came in the URL: remember it in a cookie
};

// `token` empty: every request is allowed.
HttpTokenCheck CheckHttpToken(const std::string& token, bool loopback_peer, std::string_view authorization,
                              std::string_view cookie, std::string_view target);

// Set-Cookie value for a token accepted from the URL.
std::string TokenCookie(const std::string& token);

// Whether a request's Host header names this daemon (DNS rebinding: a page
// of another site that made its name resolve to this address must not read
// the API). Allowed: no Host (HTTP/1.0 tools; browsers always send one), an
// IP address (a rebinding page cannot send one: it names its own site),
// localhost and *.localhost, and `names` (this node's host name and
// http.host_names), case-insensitively, with or without a port.
bool HostAllowed(std::string_view host, const std::vector<std::string>& names);

// Whether `token` can travel in a header, a cookie and a URL unescaped.
bool IsValidToken(std::string_view token);

}  // namespace opguard::daemon
