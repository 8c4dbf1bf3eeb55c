// Where pending fingerprints are computed (shim.h, "pending fingerprints"):
//  - HostFingerprinter: one worker thread that hashes host buffers with the
//    CPU engine (fingerprint/), off the recording thread;
//  - DeviceFingerprinter: launches on a device stream through a table of
//    device functions (device_ops.h: the CUDA backend library, or a test's
//    host-memory stand-in) and harvests the results, per stream in launch
//    order, on the sender thread.
// Both report to an FpSink (the core), never to the caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "device_ops.h"
#include "opguard/shim.h"
#include "pending_table.h"

namespace opguard::shim {

class FpSink {
 public:
  virtual void ResolveFp(uint64_t handle, const FpResult& result) = 0;
  virtual void FailFp(uint64_t handle, std::string_view reason) = 0;

 protected:
  ~FpSink() = default;
};

class HostFingerprinter {
 public:
  struct Job {
    uint64_t handle = 0;
    const void* data = nullptr;
    uint8_t dtype = 0;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;  // empty: C-contiguous
    opguard_release_fn release = nullptr;
    void* release_context = nullptr;
  };

  explicit HostFingerprinter(FpSink& sink) : sink_(sink) {}
  // Stops the worker after its current job; jobs not started fail
  // ("shutdown") and are released.
  ~HostFingerprinter();
  HostFingerprinter(const HostFingerprinter&) = delete;
  HostFingerprinter& operator=(const HostFingerprinter&) = delete;

  // Any thread. Queues the job, starting the worker on first use; false
  // (nothing taken) when the worker cannot be started.
  bool Submit(Job job);

 private:
  void Main();
  void Run(Job& job);

  FpSink& sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread worker_;
};

class DeviceFingerprinter {
 public:
  // Takes ownership of the backend (ops.close at destruction).
  explicit DeviceFingerprinter(const opguard_device_ops& ops);
  ~DeviceFingerprinter();
  DeviceFingerprinter(const DeviceFingerprinter&) = delete;
  DeviceFingerprinter& operator=(const DeviceFingerprinter&) = delete;

  // Recording threads. Launches the fingerprint of `t` on `stream` into a
  // free result slot. Empty on success, else why nothing was launched.
  std::string Launch(uint64_t handle, const opguard_device_tensor& t, void* stream);
  // Sender thread. Hands every landed result to `sink`, per stream in launch
  // order (a stream's later work cannot land before its earlier work), and
  // returns the slot to the pool. Returns how many are still in flight.
  size_t Harvest(FpSink& sink);
  size_t in_flight() const;

 private:
  struct InFlight {
    uint64_t handle;
    uint32_t slot;
  };
  opguard_device_ops ops_;
  mutable std::mutex mu_;
  std::vector<uint32_t> free_slots_;
  std::unordered_map<void*, std::deque<InFlight>> streams_;
  size_t in_flight_ = 0;
};

// Loads the CUDA backend (libopguard_shim_cuda.so next to this library, so
// that libcudart is never a dependency of libopguard_shim.so) with `slots`
// result slots. nullptr and *why when there is no library, driver or device.
std::unique_ptr<DeviceFingerprinter> LoadCudaBackend(uint32_t slots, std::string* why);

}  // namespace opguard::shim
