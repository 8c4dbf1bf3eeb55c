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

}  // namespace opguard::torch_adapter
