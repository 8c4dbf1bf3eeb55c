#include "test_device.h"

#include <cstring>
#include <span>

#include "opguard/fingerprint/fingerprint.h"

namespace opguard::shim::testing {
namespace {

void CopyWhy(const std::string& text, char* why, size_t len) {
  if (len == 0) return;
  size_t n = std::min(text.size(), len - 1);
  std::memcpy(why, text.data(), n);
  why[n] = '\0';
}

}  // namespace

opguard_device_ops TestDevice::Ops() {
  opguard_device_ops ops{};
  ops.abi = OPGUARD_DEVICE_OPS_ABI;
  ops.slots = slots_;
  ops.self = this;
  ops.launch = [](void* self, uint32_t slot, const opguard_device_tensor* t, void* stream, char* why,
                  size_t len) { return static_cast<TestDevice*>(self)->Launch(slot, t, stream, why, len); };
  ops.poll = [](void* self, uint32_t slot, opguard_tensor* out, char* why, size_t len) {
    return static_cast<TestDevice*>(self)->Poll(slot, out, why, len);
  };
  ops.close = [](void* self) { static_cast<TestDevice*>(self)->closed_ = true; };
  return ops;
}

void TestDevice::Enqueue(void* stream, std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_[stream].push_back(std::move(work));
}

size_t TestDevice::RunStream(void* stream, size_t n) {
  size_t ran = 0;
  while (ran < n) {
    std::function<void()> work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& q = streams_[stream];
      if (q.empty()) break;
      work = std::move(q.front());
      q.pop_front();
    }
    work();
    ++ran;
  }
  return ran;
}

size_t TestDevice::Queued(void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_[stream].size();
}

void TestDevice::SetCapturing(void* stream, bool capturing) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capturing) {
    capturing_.insert(stream);
  } else {
    capturing_.erase(stream);
  }
}

void TestDevice::FailNextResult(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ = std::move(why);
}

int TestDevice::Launch(uint32_t slot, const opguard_device_tensor* t, void* stream, char* why,
                       size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capturing_.count(stream) != 0) {
    CopyWhy("cuda graph capture", why, len);
    return 1;
  }
  Slot& s = slot_state_[slot];
  if (slot >= slots_ || s.busy) {
    CopyWhy("slot " + std::to_string(slot) + " launched while in use", why, len);
    return 1;
  }
  s = Slot{};
  s.busy = true;
  ++launches_;
  max_in_use_ = std::max(max_in_use_, ++in_use_);
  // The kernel reads the memory when it runs, not now: the shape is copied,
  // the bytes are not.
  std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
  const void* data = t->data;
  uint8_t dtype = t->dtype;
  streams_[stream].push_back([this, slot, data, dtype, shape] {
    namespace fp = opguard::fingerprint;
    fp::TensorView view;
    view.data = data;
    view.dtype = static_cast<fp::DType>(dtype);
    view.shape = shape;
    fp::Fingerprint f = fp::FingerprintHost(view, 1);
    std::lock_guard<std::mutex> inner(mu_);
    Slot& done = slot_state_[slot];
    done.landed = true;
    if (!fail_next_.empty()) {
      done.failed = true;
      done.why = std::move(fail_next_);
      fail_next_.clear();
    }
    done.result.fp_lo = f.digest.lo;
    done.result.fp_hi = f.digest.hi;
    done.result.has_stats = 1;
    done.result.stats = {f.stats.nan_count, f.stats.inf_count, f.stats.min,
                         f.stats.max,       f.stats.sum,       f.stats.l2};
  });
  return 0;
}

int TestDevice::Poll(uint32_t slot, opguard_tensor* out, char* why, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slot_state_[slot];
  if (!s.busy || !s.landed) return 0;
  s.busy = false;
  --in_use_;
  if (s.failed) {
    CopyWhy(s.why, why, len);
    return -1;
  }
  *out = s.result;
  return 1;
}

}  // namespace opguard::shim::testing
