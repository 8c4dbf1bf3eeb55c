#include "query/trace_cache.h"

namespace opguard::daemon {

uint64_t TraceCache::BytesOf(const aligner::RankTrace& trace) {
  uint64_t n = sizeof trace + trace.lanes.capacity() * sizeof(aligner::LaneTrace) +
               trace.gaps.capacity() * sizeof(aligner::Gap) +
               trace.collectives.capacity() * sizeof(aligner::CollectiveEvent);
  for (const auto& lane : trace.lanes) n += lane.ops.capacity() * sizeof(aligner::OpEvent);
  for (const auto& c : trace.collectives) n += c.outputs.capacity() * sizeof(aligner::Fp128);
  return n;
}

SharedTrace TraceCache::Find(uint64_t run, uint32_t rank, uint64_t stamp) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->run == run && it->rank == rank) {
      if (it->stamp != stamp) {  // the rank received batches since: stale
        bytes_ -= it->bytes;
        entries_.erase(it);
        return nullptr;
      }
      entries_.splice(entries_.begin(), entries_, it);
      return it->trace;
    }
  }
  return nullptr;
}

void TraceCache::Put(uint64_t run, uint32_t rank, uint64_t stamp, SharedTrace trace) {
  const uint64_t bytes = BytesOf(*trace);
  if (bytes > max_bytes_) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(entries_, [&](const Entry& e) {
    const bool same = e.run == run && e.rank == rank;
    if (same) bytes_ -= e.bytes;
    return same;
  });
  EvictTo(max_bytes_ - bytes);
  entries_.push_front({run, rank, stamp, bytes, std::move(trace)});
  bytes_ += bytes;
}

void TraceCache::Forget(uint64_t run) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(entries_, [&](const Entry& e) {
    if (e.run == run) bytes_ -= e.bytes;
    return e.run == run;
  });
}

uint64_t TraceCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void TraceCache::EvictTo(uint64_t budget) {
  while (bytes_ > budget && !entries_.empty()) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

RunReader::RunReader(const Store* store, const RunState& run, TraceCache* cache)
    : store_(store), run_(run), cache_(cache), details_(store, run.id), strings_(store, run.id) {}

Result<SharedTrace> RunReader::Rank(uint32_t rank, const CancelToken* cancel) {
  auto state = run_.ranks.find(rank);
  const bool known = state != run_.ranks.end();
  // Damage found since a trace was kept makes it stale too (its gaps).
  const uint64_t stamp = (known ? state->second.batches : 0) + (store_->damage_generation() << 48);
  if (cache_ != nullptr) {
    if (SharedTrace hit = cache_->Find(run_.id, rank, stamp)) return hit;
  }
  OPGUARD_ASSIGN_OR_RETURN(aligner::RankTrace trace,
                           details_.LoadRank(rank, cancel, known ? state->second.ops : 0));
  // A multi-lane rank's first lane was sized for all its ops.
  for (auto& lane : trace.lanes) {
    if (lane.ops.capacity() > lane.ops.size() + lane.ops.size() / 4 + 1024) lane.ops.shrink_to_fit();
  }
  if (!collectives_loaded_) {
    OPGUARD_ASSIGN_OR_RETURN(collectives_, LoadCollectives(*store_, run_.id));
    collectives_loaded_ = true;
  }
  if (auto it = collectives_.find(rank); it != collectives_.end()) trace.collectives = it->second;
  auto shared = std::make_shared<const aligner::RankTrace>(std::move(trace));
  if (cache_ != nullptr) cache_->Put(run_.id, rank, stamp, shared);
  return shared;
}

}  // namespace opguard::daemon
