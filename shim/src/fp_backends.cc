#include "fp_backends.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>

#include <span>

#include "opguard/fingerprint/fingerprint.h"

namespace opguard::shim {

// ---------------------------------------------------------------------------
// HostFingerprinter

HostFingerprinter::~HostFingerprinter() {
  std::deque<Job> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    left.swap(jobs_);
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  for (Job& job : left) {
    sink_.FailFp(job.handle, "shutdown before the fingerprint was taken");
    if (job.release != nullptr) job.release(job.release_context);
  }
}

bool HostFingerprinter::Submit(Job job) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return false;
  if (!worker_.joinable()) {
    // Like the sender: the worker never takes the host's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    try {
      worker_ = std::thread([this] { Main(); });
    } catch (const std::exception&) {
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
      return false;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  jobs_.push_back(std::move(job));
  lock.unlock();
  cv_.notify_one();
  return true;
}

void HostFingerprinter::Main() {
  pthread_setname_np(pthread_self(), "opguard-fp");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    Run(job);
    lock.lock();
  }
}

void HostFingerprinter::Run(Job& job) {
  namespace fp = opguard::fingerprint;
  fp::TensorView view;
  view.data = job.data;
  view.dtype = static_cast<fp::DType>(job.dtype);
  view.shape = job.shape;
  view.strides = job.strides;
  std::string invalid = fp::ValidateView(view);
  if (!invalid.empty()) {
    sink_.FailFp(job.handle, "invalid tensor (" + invalid + ")");
  } else {
    fp::Fingerprint f = fp::FingerprintHost(view, 1);
    FpResult r;
    r.lo = f.digest.lo;
    r.hi = f.digest.hi;
    r.has_stats = 1;
    r.stats = {f.stats.nan_count, f.stats.inf_count, f.stats.min, f.stats.max, f.stats.sum, f.stats.l2};
    sink_.ResolveFp(job.handle, r);
  }
  if (job.release != nullptr) job.release(job.release_context);
}

// ---------------------------------------------------------------------------
// DeviceFingerprinter

DeviceFingerprinter::DeviceFingerprinter(const opguard_device_ops& ops) : ops_(ops) {
  free_slots_.reserve(ops.slots);
  for (uint32_t i = ops.slots; i > 0; --i) free_slots_.push_back(i - 1);
}

DeviceFingerprinter::~DeviceFingerprinter() {
  if (ops_.close != nullptr) ops_.close(ops_.self);
}

std::string DeviceFingerprinter::Launch(uint64_t handle, const opguard_device_tensor& t, void* stream) {
  // Held across the launch so that a stream's queue is in its launch order.
  std::lock_guard<std::mutex> lock(mu_);
  if (free_slots_.empty()) return "pending fingerprint limit";
  uint32_t slot = free_slots_.back();
  char why[256] = {};
  if (ops_.launch(ops_.self, slot, &t, stream, why, sizeof(why)) != 0) {
    why[sizeof(why) - 1] = '\0';
    return why[0] != '\0' ? std::string(why) : std::string("device launch failed");
  }
  free_slots_.pop_back();
  streams_[stream].push_back(InFlight{handle, slot});
  ++in_flight_;
  return {};
}

size_t DeviceFingerprinter::Harvest(FpSink& sink) {
  struct Landed {
    uint64_t handle;
    bool ok;
    FpResult result;
    std::string why;
  };
  std::vector<Landed> landed;
  size_t left = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = streams_.begin(); it != streams_.end();) {
      std::deque<InFlight>& q = it->second;
      while (!q.empty()) {
        opguard_tensor out{};
        char why[256] = {};
        int state = ops_.poll(ops_.self, q.front().slot, &out, why, sizeof(why));
        if (state == 0) break;
        why[sizeof(why) - 1] = '\0';
        Landed l{q.front().handle, state == 1, {}, {}};
        if (l.ok) {
          l.result = FpResult{out.fp_lo, out.fp_hi, out.has_stats, out.stats};
        } else {
          l.why = why[0] != '\0' ? why : "device error";
        }
        landed.push_back(std::move(l));
        free_slots_.push_back(q.front().slot);
        q.pop_front();
        --in_flight_;
      }
      if (q.empty()) {
        it = streams_.erase(it);  // streams come and go; keep no state for idle ones
      } else {
        ++it;
      }
    }
    left = in_flight_;
  }
  // Outside mu_: the sink takes the core's lock.
  for (const Landed& l : landed) {
    if (l.ok) {
      sink.ResolveFp(l.handle, l.result);
    } else {
      sink.FailFp(l.handle, l.why);
    }
  }
  return left;
}

size_t DeviceFingerprinter::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

std::unique_ptr<DeviceFingerprinter> LoadCudaBackend(uint32_t slots, std::string* why) {
  // Look next to the library this code is in, then on the loader's path.
  std::string path = "libopguard_shim_cuda.so";
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&LoadCudaBackend), &info) != 0 && info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    size_t slash = self.rfind('/');
    if (slash != std::string::npos) path = self.substr(0, slash + 1) + path;
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libopguard_shim_cuda.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    *why = std::string("cannot load libopguard_shim_cuda.so (") + (err != nullptr ? err : "?") + ")";
    return nullptr;
  }
  auto open = reinterpret_cast<opguard_device_open_fn>(dlsym(lib, OPGUARD_DEVICE_OPEN_SYMBOL));
  if (open == nullptr) {
    *why = "libopguard_shim_cuda.so has no " OPGUARD_DEVICE_OPEN_SYMBOL;
    dlclose(lib);
    return nullptr;
  }
  opguard_device_ops ops{};
  char err[256] = {};
  if (open(slots, &ops, err, sizeof(err)) != 0 || ops.abi != OPGUARD_DEVICE_OPS_ABI) {
    err[sizeof(err) - 1] = '\0';
    *why = err[0] != '\0' ? err : "the CUDA backend did not start";
    // Kept loaded: the CUDA runtime may have left handlers that point into it.
    return nullptr;
  }
  // The library stays loaded for the life of the process.
  return std::make_unique<DeviceFingerprinter>(ops);
}

}  // namespace opguard::shim
