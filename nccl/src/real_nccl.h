// The real NCCL functions behind the interposer.
#pragma once

#include <nccl.h>

namespace opguard::nccl {

// The next definition of `name` after this library: dlsym(RTLD_NEXT), or,
// when libnccl was loaded into a local scope (a Python extension's
// dependency opened with RTLD_LOCAL), the already loaded libnccl.so.2's.
// NULL (logged once per name) if neither has it.
void* ResolveReal(const char* name);

}  // namespace opguard::nccl

// The real `fn` (a function declared in nccl.h), resolved on first use.
#define OPGUARD_REAL_NCCL(fn)                                                                    \
  ([]() {                                                                                        \
    static const auto real = reinterpret_cast<decltype(&fn)>(::opguard::nccl::ResolveReal(#fn)); \
    return real;                                                                                 \
  }())
