// Where the names of the device kernels each op launched come from (the
// `kernels` of an op record; docs/kernels.md). The shim core drives it:
// recording threads bracket an op with BeginOp/EndOp; the sender thread
// tells it when an op's GPU work has completed, flushes, and asks for the
// op's final list before it releases the op's held record. The one
// implementation is CUPTI's (cupti_kernel_source.cc, built where the CUDA
// toolkit's cupti.h is found); a build without it records no kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"

namespace opguard::shim {

class KernelSource {
 public:
  enum class State : uint8_t { kPending, kReady, kUnavailable };

  virtual ~KernelSource() = default;

  // Recording thread, around the op's launches; never blocks, never throws.
  // BeginOp false: attribution is off (do not call EndOp).
  virtual bool BeginOp(uint64_t key) noexcept = 0;
  virtual void EndOp(uint64_t key) noexcept = 0;

  // Sender thread.
  virtual void GpuWorkDone(uint64_t key) noexcept = 0;
  virtual bool waiting_for_flush() const noexcept = 0;
  virtual void Flush() noexcept = 0;
  // kReady fills `names` (launch order) and forgets the op.
  virtual State KernelsFor(uint64_t key, std::vector<std::string_view>* names) noexcept = 0;
  virtual void Forget(uint64_t key) noexcept = 0;
  virtual bool on() const noexcept = 0;
  virtual void Stop() noexcept = 0;
};

// Starts kernel attribution per `config` (kernels, cupti_library). nullptr
// when it is off, or when it cannot start: then one warning line was logged
// and records carry no kernels.
std::unique_ptr<KernelSource> StartKernelSource(const Config& config);

}  // namespace opguard::shim
