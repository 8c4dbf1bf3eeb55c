#include "kernel_ledger.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace opguard::shim::cupti {
namespace {

// A kernel record whose ExternalCorrelation record has not come after this
// many more delivered flushes was launched outside any op. (Two, not one: a
// flush may run while the launching API call is still writing its records.)
constexpr uint64_t kOrphanFlushes = 2;
// Kernel records without an op, kept at most: beyond, all are counted
// unattributed at once (a process launching kernels outside any op).
constexpr size_t kMaxOrphans = 1 << 16;

}  // namespace

std::string ReportedKernelName(const char* mangled) {
  if (mangled == nullptr) return "?";
  std::string out;
  // Itanium C++ names start with _Z; extern "C" kernels and names CUPTI could
  // not find are reported as they are.
  if (mangled[0] == '_' && mangled[1] == 'Z') {
    int status = -1;
    char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    if (status == 0 && demangled != nullptr && std::strlen(demangled) <= KernelLedger::kMaxDemangledBytes) {
      out = demangled;
    }
    std::free(demangled);
  }
  if (out.empty()) out = mangled;
  if (out.size() > KernelLedger::kMaxNameBytes) out.resize(KernelLedger::kMaxNameBytes);
  return out;
}

const std::string* KernelLedger::NameLocked(const char* cupti_name) {
  auto it = names_.find(cupti_name);
  if (it != names_.end()) {
    // The pointer CUPTI shares among a kernel's records; a module unloaded and
    // another loaded could reuse the address for another name.
    if (cupti_name == nullptr || it->second->cupti == cupti_name) return &it->second->reported;
    retired_names_.push_back(std::move(it->second));
    names_.erase(it);
  }
  auto entry = std::make_unique<CachedName>();
  if (cupti_name != nullptr) entry->cupti = cupti_name;
  entry->reported = ReportedKernelName(cupti_name);
  const std::string* reported = &entry->reported;
  names_.emplace(cupti_name, std::move(entry));
  return reported;
}

void KernelLedger::AttachLocked(uint64_t key, uint32_t correlation_id, const std::string* name) {
  ops_[key].launches.push_back(Launch{correlation_id, name});
  ++counters_.kernels;
}

void KernelLedger::OnRecord(const CUpti_Activity* record) {
  if (record == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (off_) return;
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      const std::string* name = NameLocked(k->name);
      auto owner = key_by_correlation_.find(k->correlationId);
      if (owner != key_by_correlation_.end()) {
        AttachLocked(owner->second, k->correlationId, name);
        return;
      }
      if (orphans_.size() >= kMaxOrphans) {
        counters_.unattributed += orphans_.size();
        orphans_.clear();
      }
      orphans_[k->correlationId] = Orphan{name, flushes_delivered_};
      return;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* x = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (x->externalKind != kOpCorrelationKind) return;
      auto [it, inserted] = ops_.try_emplace(x->externalId);
      if (inserted && ops_.size() > kMaxOpenOps) {
        TurnOffLocked("more than " + std::to_string(kMaxOpenOps) + " ops wait for their kernels");
        return;
      }
      it->second.correlation_ids.push_back(x->correlationId);
      key_by_correlation_[x->correlationId] = x->externalId;
      auto orphan = orphans_.find(x->correlationId);
      if (orphan != orphans_.end()) {
        AttachLocked(x->externalId, x->correlationId, orphan->second.name);
        orphans_.erase(orphan);
      }
      return;
    }
    default:
      return;  // API records: CUPTI emits external records only alongside them
  }
}

void KernelLedger::GpuWorkDone(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (off_) return;
  auto [it, inserted] = ops_.try_emplace(key);
  if (inserted && ops_.size() > kMaxOpenOps) {
    TurnOffLocked("more than " + std::to_string(kMaxOpenOps) + " ops wait for their kernels");
    return;
  }
  if (it->second.done) return;
  it->second.done = true;
  it->second.done_after = flushes_started_;
  ++waiting_;
}

void KernelLedger::FlushStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++flushes_started_;
}

void KernelLedger::FlushDelivered(size_t dropped_records) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.flushes;
  if (dropped_records > 0) {
    counters_.dropped_records += dropped_records;
    // Ops this flush would finalise may be the ones that lost records.
    if (!off_) {
      TurnOffLocked("CUPTI dropped " + std::to_string(dropped_records) +
                    " activity record(s) for lack of buffer space");
    }
  }
  flushes_delivered_ = flushes_started_;
  if (off_) return;
  waiting_ = 0;
  for (const auto& [key, op] : ops_) {
    if (op.done && !FinalLocked(op)) ++waiting_;
  }
  for (auto it = orphans_.begin(); it != orphans_.end();) {
    if (flushes_delivered_ >= it->second.seen_at_flush + kOrphanFlushes) {
      ++counters_.unattributed;
      it = orphans_.erase(it);
    } else {
      ++it;
    }
  }
}

KernelList KernelLedger::KernelsFor(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  KernelList out;
  auto it = ops_.find(key);
  if (it == ops_.end()) {
    out.state = off_ ? KernelsState::kUnavailable : KernelsState::kPending;
    return out;
  }
  OpEntry& op = it->second;
  if (op.lost) {
    out.state = KernelsState::kUnavailable;
    EraseLocked(key, op);
    return out;
  }
  if (!FinalLocked(op)) return out;
  // Launch order is correlation-id order: CUPTI numbers API calls as they
  // are made. Compared as serial numbers, since the 32-bit ids wrap.
  std::sort(op.launches.begin(), op.launches.end(), [](const Launch& a, const Launch& b) {
    return static_cast<int32_t>(a.correlation_id - b.correlation_id) < 0;
  });
  out.state = KernelsState::kReady;
  out.names.reserve(op.launches.size());
  for (const Launch& l : op.launches) out.names.emplace_back(*l.name);
  ++counters_.ops_ready;
  EraseLocked(key, op);
  return out;
}

void KernelLedger::Forget(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(key);
  if (it != ops_.end()) EraseLocked(key, it->second);
}

void KernelLedger::EraseLocked(uint64_t key, OpEntry& op) {
  for (uint32_t c : op.correlation_ids) {
    auto owner = key_by_correlation_.find(c);
    if (owner != key_by_correlation_.end() && owner->second == key) key_by_correlation_.erase(owner);
  }
  ops_.erase(key);
}

void KernelLedger::TurnOffLocked(std::string why) {
  if (off_) return;
  off_ = true;
  off_reason_ = std::move(why);
  // Ops already final keep their (complete) lists; every other op is lost.
  for (auto& [key, op] : ops_) {
    if (!FinalLocked(op)) {
      op.lost = true;
      op.launches.clear();
      ++counters_.ops_unavailable;
    }
  }
  counters_.unattributed += orphans_.size();
  orphans_.clear();
  waiting_ = 0;
}

void KernelLedger::TurnOff(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  TurnOffLocked(std::move(why));
}

bool KernelLedger::off() const {
  std::lock_guard<std::mutex> lock(mu_);
  return off_;
}

std::string KernelLedger::off_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return off_reason_;
}

LedgerCounters KernelLedger::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

bool KernelLedger::waiting_for_flush() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_ > 0;
}

}  // namespace opguard::shim::cupti
