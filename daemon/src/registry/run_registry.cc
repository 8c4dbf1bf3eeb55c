#include "registry/run_registry.h"

#include <mutex>

namespace opguard::daemon {

std::vector<RunState> RunRegistry::Runs() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<RunState> out;
  out.reserve(runs_.size());
  for (const auto& [name, run] : runs_) out.push_back(run);
  return out;
}

std::optional<RunState> RunRegistry::Find(const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = runs_.find(name);
  if (it == runs_.end()) return std::nullopt;
  return it->second;
}

size_t RunRegistry::Count() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return runs_.size();
}

void RunRegistry::Reset(std::map<std::string, RunState> runs) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  runs_ = std::move(runs);
}

void RunRegistry::Publish(std::vector<RunState>* runs,
                          const std::vector<std::pair<std::string, uint64_t>>& deleted) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (const auto& [name, id] : deleted) {
    auto it = runs_.find(name);
    if (it != runs_.end() && it->second.id == id) runs_.erase(it);
  }
  for (auto& run : *runs) runs_[run.name] = std::move(run);
}

}  // namespace opguard::daemon
