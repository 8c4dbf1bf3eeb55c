// The web viewer's files (web/ in the source tree, share/opguard/web when
// installed), served read-only by the HTTP server. Only regular files under
// the root are served: path segments are checked after URL decoding (no "..",
// ".", hidden names, separators or NUL inside a segment), and the resolved
// path (symlinks followed) must still lie under the resolved root.
//
// Private to the query room (http_server.cc, daemon.cc; tests).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace opguard::daemon {

// The viewer's directory: `configured` when set (--web-root), else
// ../share/opguard/web next to the running binary (an install), else the
// source tree's web/ (a build tree). "" when none holds index.html.
std::string FindWebRoot(const std::string& configured);

struct WebFile {
  std::string content_type;
  std::string body;
};

// The file named by decoded path `segments` under `root`; nullopt when it is
// not a regular file under the root or a segment is refused.
std::optional<WebFile> ReadWebFile(const std::string& root,
                                   const std::vector<std::string>& segments);

// Whether one decoded path segment may name a file under the root.
bool SafeSegment(const std::string& segment);

}  // namespace opguard::daemon
