#include "shim_api.h"

#include <dlfcn.h>

#include "log.h"

namespace opguard::nccl {
namespace {

constexpr const char* kShim = "libopguard_shim.so.1";

// The copy already loaded (by an adapter), else the one this library's
// RUNPATH names: its own folder when installed, the shim's in a build tree.
void* OpenShim() {
  if (void* lib = dlopen(kShim, RTLD_LAZY | RTLD_NOLOAD)) return lib;
  return dlopen(kShim, RTLD_LAZY | RTLD_LOCAL);
}

template <typename Fn>
bool Bind(void* lib, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

const ShimApi* Shim() {
  static const ShimApi* api = []() -> const ShimApi* {
    void* lib = OpenShim();
    if (lib == nullptr) {
      const char* why = dlerror();
      Log("cannot load %s (%s); NCCL calls are not recorded", kShim,
          why != nullptr ? why : "not found");
      return nullptr;
    }
    static ShimApi shim;
    bool ok = Bind(lib, "opguard_enabled", &shim.enabled) &&
              Bind(lib, "opguard_set_run_info", &shim.set_run_info) &&
              Bind(lib, "opguard_site", &shim.site) &&
              Bind(lib, "opguard_communicator_define", &shim.communicator_define) &&
              Bind(lib, "opguard_record_collective", &shim.record_collective) &&
              Bind(lib, "opguard_fingerprint_host", &shim.fingerprint_host);
    if (!ok) {
      Log("%s lacks a function this library needs; NCCL calls are not recorded", kShim);
      return nullptr;
    }
    auto version = reinterpret_cast<decltype(&opguard_api_version)>(dlsym(lib, "opguard_api_version"));
    if (version == nullptr || version() < 3 ||
        !Bind(lib, "opguard_fingerprint_device_async", &shim.fingerprint_device_async)) {
      shim.fingerprint_device_async = nullptr;
    }
    return &shim;
  }();
  return api;
}

}  // namespace opguard::nccl
