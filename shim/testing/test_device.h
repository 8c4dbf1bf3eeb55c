// Test-only stand-in for a GPU behind the shim's device backend table
// (shim/src/device_ops.h): "device memory" is host memory, a stream is a
// queue of work that runs only when the test says so (RunStream), so a test
// decides when each stream's fingerprints land, in which order streams
// progress, and whether a launch or a result fails. Fingerprints are taken
// with the CPU engine when their turn on the stream comes, reading the
// memory as it is then, as a kernel would.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "device_ops.h"

namespace opguard::shim::testing {

class TestDevice {
 public:
  explicit TestDevice(uint32_t slots) : slots_(slots) {}
  TestDevice(const TestDevice&) = delete;
  TestDevice& operator=(const TestDevice&) = delete;

  // The backend table (the device stays owned by the test and must outlive
  // the shim core; close only counts).
  opguard_device_ops Ops();

  // A stream handle for launches (any distinct pointer value).
  void* Stream(int id) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + id)); }
  // Queues host work on a stream (the test's "kernels", e.g. writes into a
  // buffer the caching allocator hands out again).
  void Enqueue(void* stream, std::function<void()> work);
  // Runs up to `n` queued items of `stream` in order; returns how many ran.
  size_t RunStream(void* stream, size_t n = SIZE_MAX);
  size_t Queued(void* stream);

  // Launches on a capturing stream fail with "cuda graph capture".
  void SetCapturing(void* stream, bool capturing);
  // The next result of a fingerprint launched into a slot that lands fails.
  void FailNextResult(std::string why);

  uint32_t launches() const { return launches_; }
  uint32_t max_slots_in_use() const { return max_in_use_; }
  bool closed() const { return closed_; }

 private:
  struct Slot {
    bool busy = false;     // launched, not yet polled as landed
    bool landed = false;
    bool failed = false;
    std::string why;
    opguard_tensor result{};
  };
  int Launch(uint32_t slot, const opguard_device_tensor* t, void* stream, char* why, size_t len);
  int Poll(uint32_t slot, opguard_tensor* out, char* why, size_t len);

  const uint32_t slots_;
  std::mutex mu_;
  std::map<void*, std::deque<std::function<void()>>> streams_;
  std::set<void*> capturing_;
  std::map<uint32_t, Slot> slot_state_;
  std::string fail_next_;
  uint32_t launches_ = 0;
  uint32_t in_use_ = 0, max_in_use_ = 0;
  bool closed_ = false;
};

}  // namespace opguard::shim::testing
