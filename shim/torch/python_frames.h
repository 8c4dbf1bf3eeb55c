// The user's call site of the op being recorded: the innermost Python frame
// that is not inside torch, OpGuard or the standard library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opguard::torch_adapter {

struct UserSite {
  uint64_t site = 0;  // opguard_site(file, line, function); 0 if none found
  uint64_t file = 0;  // string id of the file path
};

// Frames whose file path starts with one of these prefixes are not user code.
void SetSkippedPathPrefixes(std::vector<std::string> prefixes);

// Looks up the calling Python frame. Only called on threads that run Python
// (never on autograd or collective worker threads, which have no frames and
// whose GIL acquisition could wait on the very thread they serve). Sends
// every new user file once with opguard_source_file. Never throws.
UserSite FindUserSite();

// Where the calling thread's Python code was at one moment: its user frames,
// outermost first, each with the instruction it was at. The stack holds a
// reference to each frame, so no later frame can take a kept frame's address.
class UserStack {
 public:
  UserStack() = default;
  UserStack(const UserStack&) = delete;
  UserStack& operator=(const UserStack&) = delete;
  // Never destroyed while Python runs: dropping the references needs the GIL
  // (Capture drops the previous ones).

  // Replaces the stack with the calling thread's. Takes the GIL when needed;
  // call only on a thread that runs Python. Never throws.
  void Capture();
  bool empty() const { return frames_.empty(); }
  // Whether the calling thread is now running code that comes before this
  // stack in the same frames (a loop went round: at the first frame where
  // the two differ, the same frame is at an earlier instruction) or a new
  // call from the same place (the same parents at the same instructions, a
  // new frame below them). Same GIL rules as Capture.
  bool IsBehind() const;

 private:
  struct Frame {
    void* frame;  // PyFrameObject*, referenced
    int lasti;
  };
  std::vector<Frame> frames_;
};

}  // namespace opguard::torch_adapter
