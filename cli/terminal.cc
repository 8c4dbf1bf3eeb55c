#include "cli/terminal.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace opguard::cli {

bool StdoutHasColour() {
  static const bool colour = [] {
    const char* no_colour = std::getenv("NO_COLOR");
    if (no_colour != nullptr && *no_colour != '\0') return false;
    const char* term = std::getenv("TERM");
    if (term != nullptr && std::strcmp(term, "dumb") == 0) return false;
    return ::isatty(STDOUT_FILENO) == 1;
  }();
  return colour;
}

std::string Paint(std::string_view text, Colour colour) {
  if (!StdoutHasColour()) return std::string(text);
  // SGR codes, in the order of Colour.
  static constexpr const char* kCodes[] = {"1;31", "1;32", "1;33", "1"};
  const char* code = kCodes[static_cast<int>(colour)];
  return std::string("\033[") + code + "m" + std::string(text) + "\033[0m";
}

Progress::Progress(std::string what, std::chrono::milliseconds delay)
    : what_(std::move(what)), delay_(delay) {
  if (::isatty(STDERR_FILENO) == 1) thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() { Stop(); }

void Progress::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Progress::Set(std::string detail) {
  std::lock_guard<std::mutex> lock(mu_);
  detail_ = std::move(detail);
}

void Progress::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  if (cv_.wait_for(lock, delay_, [this] { return stop_; })) return;
  while (!stop_) {
    const auto s =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start_);
    // \r and erase-to-end: one line, redrawn in place.
    std::fprintf(stderr, "\r\033[K%s%s%s · %lld s", what_.c_str(), detail_.empty() ? "" : ": ",
                 detail_.c_str(), static_cast<long long>(s.count()));
    std::fflush(stderr);
    shown_ = true;
    cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; });
  }
  if (shown_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
  }
}

}  // namespace opguard::cli
