// A build without CUPTI's headers: kernel names are never recorded.
#include "kernel_source.h"

namespace opguard::shim {

std::unique_ptr<KernelSource> StartKernelSource(const Config& config) {
  if (config.kernels) {
    OPGUARD_LOG(LogLevel::kWarn,
                "kernel names are not recorded: this build of OpGuard has no CUPTI support");
  }
  return nullptr;
}

}  // namespace opguard::shim
