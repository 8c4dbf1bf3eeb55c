// KernelSource over CUPTI's Activity API (shim/cupti/kernel_attribution.h).
#include "kernel_attribution.h"
#include "kernel_source.h"

namespace opguard::shim {
namespace {

class CuptiKernelSource final : public KernelSource {
 public:
  explicit CuptiKernelSource(std::unique_ptr<cupti::KernelAttribution> ka) : ka_(std::move(ka)) {}
  ~CuptiKernelSource() override { ka_->Stop(); }

  bool BeginOp(uint64_t key) noexcept override { return ka_->BeginOp(key); }
  void EndOp(uint64_t key) noexcept override { ka_->EndOp(key); }
  void GpuWorkDone(uint64_t key) noexcept override { ka_->GpuWorkDone(key); }
  bool waiting_for_flush() const noexcept override { return ka_->waiting_for_flush(); }
  void Flush() noexcept override { ka_->Flush(); }
  State KernelsFor(uint64_t key, std::vector<std::string_view>* names) noexcept override {
    cupti::KernelList list = ka_->KernelsFor(key);
    switch (list.state) {
      case cupti::KernelsState::kReady:
        names->swap(list.names);
        return State::kReady;
      case cupti::KernelsState::kPending:
        return State::kPending;
      default:
        return State::kUnavailable;
    }
  }
  void Forget(uint64_t key) noexcept override { ka_->Forget(key); }
  bool on() const noexcept override { return ka_->on(); }
  void Stop() noexcept override { ka_->Stop(); }

 private:
  std::unique_ptr<cupti::KernelAttribution> ka_;
};

}  // namespace

std::unique_ptr<KernelSource> StartKernelSource(const Config& config) {
  if (!config.kernels) return nullptr;
  std::string why;
  auto ka = cupti::KernelAttribution::Start(cupti::KernelsConfig{true, config.cupti_library}, &why);
  if (ka == nullptr) return nullptr;  // Start logged why
  return std::make_unique<CuptiKernelSource>(std::move(ka));
}

}  // namespace opguard::shim
