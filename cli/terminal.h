// What the CLI does differently for a person at a terminal: colour on
// stdout, and a progress line on stderr while a query takes more than a
// second. Neither happens when the stream is a pipe or a file, so scripts and
// tests read plain, stable text; NO_COLOR (https://no-color.org) and
// TERM=dumb turn colour off on a terminal too.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace opguard::cli {

enum class Colour { kRed, kGreen, kYellow, kBold };

// Whether stdout gets colour (decided once per process).
bool StdoutHasColour();
// `text` in `colour` when stdout has colour, else `text` unchanged.
std::string Paint(std::string_view text, Colour colour);

// A line on stderr, redrawn in place, shown only when stderr is a terminal and
// only once `delay` has passed: "opguard diff: aligning on ipc://... · 3 s".
// Set() may be called from any thread; the destructor erases the line.
class Progress {
 public:
  explicit Progress(std::string what, std::chrono::milliseconds delay = std::chrono::seconds(1));
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Set(std::string detail);
  // Erases the line and stops for good (before printing to stderr). Idempotent.
  void Stop();

 private:
  void Loop();

  const std::string what_;
  const std::chrono::milliseconds delay_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  std::condition_variable cv_;
  std::string detail_;
  bool stop_ = false;
  bool shown_ = false;
  std::thread thread_;  // started only on a terminal
};

}  // namespace opguard::cli
