// Test-only stand-in for libcupti, built from the CUDA toolkit's real
// cupti_activity.h: the Activity API entry points the shim loads
// (kernel_attribution.cc), over host memory. A machine without a CUDA driver
// cannot run the real one (it refuses to enable records), so the shim's
// kernel attribution is tested end to end against this: the shim loads it
// through OPGUARD_CUPTI_LIBRARY, and the test "launches kernels" through
// opguard_standin_cupti_launch, which writes the records CUPTI would write
// for a kernel launched by a runtime API call on the calling thread: an
// ExternalCorrelation record per kind whose stack is not empty, the API
// record, and the kernel record. Records are delivered at the next
// cuptiActivityFlushAll in buffers the registered callback hands out, kernel
// records first (as CUPTI may, since they come from another queue).
#include <cupti.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

size_t Aligned(size_t n) { return (n + 7) & ~size_t{7}; }

size_t RecordSize(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      return Aligned(sizeof(CUpti_ActivityKernel10));
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
      return Aligned(sizeof(CUpti_ActivityExternalCorrelation));
    default:
      return Aligned(sizeof(CUpti_ActivityAPI));
  }
}

struct State {
  std::mutex mu;
  CUpti_BuffersCallbackRequestFunc requested = nullptr;
  CUpti_BuffersCallbackCompleteFunc completed = nullptr;
  std::set<int> enabled;
  std::vector<uint8_t> kernels;  // kernel records not yet delivered
  std::vector<uint8_t> others;   // external and API records not yet delivered
  std::set<std::string> names;   // kernel names (CUPTI shares one pointer per name)
  size_t dropped_next = 0;
  uint32_t next_correlation = 1;
};

State& S() {
  static State* s = new State;
  return *s;
}

thread_local std::vector<uint64_t> t_stacks[CUPTI_EXTERNAL_CORRELATION_KIND_SIZE];

template <typename Record>
void Append(std::vector<uint8_t>& to, const Record& r) {
  size_t at = to.size();
  to.resize(at + Aligned(sizeof r), 0);
  std::memcpy(to.data() + at, &r, sizeof r);
}

// Delivers `bytes` (whole records) in as many buffers as it takes.
void Deliver(const std::vector<uint8_t>& bytes, CUpti_BuffersCallbackRequestFunc requested,
             CUpti_BuffersCallbackCompleteFunc completed) {
  size_t offset = 0;
  while (offset < bytes.size()) {
    uint8_t* buffer = nullptr;
    size_t size = 0, max_records = 0;
    requested(&buffer, &size, &max_records);
    if (buffer == nullptr) {
      std::lock_guard<std::mutex> lock(S().mu);
      ++S().dropped_next;  // at least one record had no room
      return;
    }
    size_t used = 0;
    while (offset < bytes.size()) {
      auto kind = reinterpret_cast<const CUpti_Activity*>(bytes.data() + offset)->kind;
      size_t n = RecordSize(kind);
      if (used + n > size) break;
      std::memcpy(buffer + used, bytes.data() + offset, n);
      used += n;
      offset += n;
    }
    completed(nullptr, 0, buffer, size, used);
    if (used == 0) return;  // a buffer too small for one record
  }
}

}  // namespace

extern "C" {

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t* version) {
  *version = CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char** str) {
  *str = result == CUPTI_SUCCESS ? "CUPTI_SUCCESS" : "CUPTI_ERROR (stand-in)";
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
                                                    CUpti_BuffersCallbackCompleteFunc completed) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().requested = requested;
  S().completed = completed;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().enabled.insert(kind);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().enabled.erase(kind);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t) {
  std::vector<uint8_t> bytes;
  CUpti_BuffersCallbackRequestFunc requested;
  CUpti_BuffersCallbackCompleteFunc completed;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    bytes.swap(S().kernels);
    bytes.insert(bytes.end(), S().others.begin(), S().others.end());
    S().others.clear();
    requested = S().requested;
    completed = S().completed;
  }
  if (requested != nullptr && completed != nullptr) Deliver(bytes, requested, completed);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid,
                                                CUpti_Activity** record) {
  size_t offset = 0;
  if (*record != nullptr) {
    offset = static_cast<size_t>(reinterpret_cast<uint8_t*>(*record) - buffer) +
             RecordSize((*record)->kind);
  }
  if (offset >= valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(buffer + offset);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext, uint32_t, size_t* dropped) {
  std::lock_guard<std::mutex> lock(S().mu);
  *dropped = S().dropped_next;
  S().dropped_next = 0;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                            uint64_t id) {
  if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID ||
      kind >= CUPTI_EXTERNAL_CORRELATION_KIND_SIZE) {
    return CUPTI_ERROR_INVALID_PARAMETER;
  }
  t_stacks[kind].push_back(id);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind,
                                                           uint64_t* id) {
  if (kind <= CUPTI_EXTERNAL_CORRELATION_KIND_INVALID ||
      kind >= CUPTI_EXTERNAL_CORRELATION_KIND_SIZE) {
    return CUPTI_ERROR_INVALID_PARAMETER;
  }
  if (t_stacks[kind].empty()) return CUPTI_ERROR_QUEUE_EMPTY;
  if (id != nullptr) *id = t_stacks[kind].back();
  t_stacks[kind].pop_back();
  return CUPTI_SUCCESS;
}

// ---- the test's controls -----------------------------------------------------

// A kernel `name` launched by a runtime API call on the calling thread.
__attribute__((visibility("default"))) void opguard_standin_cupti_launch(const char* name) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  const uint32_t correlation = s.next_correlation++;
  if (s.enabled.count(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) != 0) {
    for (int kind = 0; kind < CUPTI_EXTERNAL_CORRELATION_KIND_SIZE; ++kind) {
      if (t_stacks[kind].empty()) continue;
      CUpti_ActivityExternalCorrelation x{};
      x.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
      x.externalKind = static_cast<CUpti_ExternalCorrelationKind>(kind);
      x.externalId = t_stacks[kind].back();
      x.correlationId = correlation;
      Append(s.others, x);
    }
  }
  if (s.enabled.count(CUPTI_ACTIVITY_KIND_RUNTIME) != 0) {
    CUpti_ActivityAPI a{};
    a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
    a.correlationId = correlation;
    Append(s.others, a);
  }
  if (s.enabled.count(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != 0) {
    CUpti_ActivityKernel10 k{};
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.correlationId = correlation;
    k.name = s.names.insert(name).first->c_str();
    Append(s.kernels, k);
  }
}

// The next cuptiActivityGetNumDroppedRecords reports `n` more records dropped.
__attribute__((visibility("default"))) void opguard_standin_cupti_drop(size_t n) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().dropped_next += n;
}

// External correlation ids pushed on this thread and not popped (all kinds).
__attribute__((visibility("default"))) size_t opguard_standin_cupti_depth() {
  size_t n = 0;
  for (const auto& stack : t_stacks) n += stack.size();
  return n;
}

}  // extern "C"
