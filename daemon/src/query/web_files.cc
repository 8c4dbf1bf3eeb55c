#include "query/web_files.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <system_error>

namespace opguard::daemon {
namespace fs = std::filesystem;
namespace {

constexpr uintmax_t kMaxFileBytes = 16u << 20;

bool HasIndex(const fs::path& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(dir / "index.html", ec);
}

const char* ContentType(const fs::path& file) {
  static const std::map<std::string, const char*> types = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".json", "application/json"},
      {".ico", "image/x-icon"},
      {".txt", "text/plain; charset=utf-8"}};
  auto it = types.find(file.extension().string());
  return it == types.end() ? "application/octet-stream" : it->second;
}

}  // namespace

std::string FindWebRoot(const std::string& configured) {
  if (!configured.empty()) return HasIndex(configured) ? configured : std::string();
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "opguard" / "web";
    if (HasIndex(installed)) return installed.string();
  }
#ifdef OPGUARD_SOURCE_WEB_DIR
  if (HasIndex(OPGUARD_SOURCE_WEB_DIR)) return OPGUARD_SOURCE_WEB_DIR;
#endif
  return {};
}

bool SafeSegment(const std::string& s) {
  if (s.empty() || s.front() == '.') return false;  // ".", "..", hidden files
  return s.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

std::optional<WebFile> ReadWebFile(const std::string& root,
                                   const std::vector<std::string>& segments) {
  if (root.empty() || segments.empty()) return std::nullopt;
  fs::path path = root;
  for (const auto& s : segments) {
    if (!SafeSegment(s)) return std::nullopt;
    path /= s;
  }
  std::error_code ec;
  const fs::path real_root = fs::canonical(root, ec);
  if (ec) return std::nullopt;
  const fs::path real = fs::canonical(path, ec);
  if (ec) return std::nullopt;
  // Under the root even after symlinks: compare whole path components.
  auto [r, p] = std::mismatch(real_root.begin(), real_root.end(), real.begin(), real.end());
  if (r != real_root.end() || p == real.end()) return std::nullopt;
  if (!fs::is_regular_file(real, ec) || fs::file_size(real, ec) > kMaxFileBytes || ec)
    return std::nullopt;
  std::ifstream in(real, std::ios::binary);
  if (!in) return std::nullopt;
  WebFile f{ContentType(real), std::string(std::istreambuf_iterator<char>(in), {})};
  return f;
}

}  // namespace opguard::daemon
