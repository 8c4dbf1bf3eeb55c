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

void RunRegistry::Publish(std::vector<RunUpdate>* updates,
                          const std::vector<std::pair<std::string, uint64_t>>& deleted) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (const auto& [name, id] : deleted) {
    auto it = runs_.find(name);
    if (it != runs_.end() && it->second.id == id) runs_.erase(it);
  }
  for (auto& u : *updates) {
    auto it = runs_.find(u.name);
    const bool known = it != runs_.end() && it->second.id == u.id;
    if (u.meta) {
      if (known) u.meta->ranks = std::move(it->second.ranks);
      it = runs_.insert_or_assign(u.name, std::move(*u.meta)).first;
    } else if (!known) {
      continue;  // a run's first update carries its metadata; this one was removed since
    }
    for (auto& [rank, state] : u.ranks) it->second.ranks[rank] = std::move(state);
  }
}

}  // namespace opguard::daemon
