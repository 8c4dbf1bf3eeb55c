#include "synthetic_trace.h"

#include <algorithm>
#include <set>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace opguard::loadgen {
namespace {

constexpr uint64_t kAllRanks = 0xFFFFFFFFull;
constexpr uint64_t kTaintSalt = 0xBADC0FFEEull;
constexpr uint32_t kLayers = 4;

uint64_t H(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d = 0) {
  uint64_t v[4] = {a, b, c, d};
  uint64_t h = XXH64(v, sizeof(v), seed);
  return h == 0 ? 1 : h;
}

// splitmix64: a small, well-distributed generator for the mutation choices.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
};

}  // namespace

SyntheticTrace::SyntheticTrace(const TraceOptions& options) : o_(options) {
  BuildTemplate();
  BuildPlans();
}

void SyntheticTrace::BuildTemplate() {
  const int64_t B = 8, T = 128, Hd = 256 * static_cast<int64_t>(1 + o_.seed % 4), V = 1024;
  auto add = [&](std::string name, std::string file, uint32_t line, std::string fn,
                 std::vector<int64_t> shape, int producer = -2, bool independent = false) {
    OpTemplate t;
    t.name = std::move(name);
    t.file = std::move(file);
    t.line = line;
    t.function = std::move(fn);
    t.shape = std::move(shape);
    t.producer = producer == -2 ? static_cast<int>(template_.size()) - 1 : producer;
    t.independent_with_next = independent;
    template_.push_back(std::move(t));
    return static_cast<int>(template_.size()) - 1;
  };
  const std::vector<int64_t> act{B, T, Hd}, attn{B, T, T}, mlp{B, T, 4 * Hd}, logits{B, T, V};
  add("aten::embedding", "model.py", 30, "GPT.forward", act, -1);
  for (uint32_t l = 0; l < kLayers; ++l) {
    int ln1 = add("aten::layer_norm", "model.py", 61, "Block.forward", act);
    add("aten::linear", "model.py", 80, "Attention.forward", act, ln1, true);  // q
    add("aten::linear", "model.py", 81, "Attention.forward", act, ln1, true);  // k
    add("aten::linear", "model.py", 82, "Attention.forward", act, ln1);        // v
    add("aten::matmul", "model.py", 84, "Attention.forward", attn, ln1 + 1);
    add("aten::softmax", "model.py", 85, "Attention.forward", attn);
    add("aten::matmul", "model.py", 86, "Attention.forward", act);
    add("aten::linear", "model.py", 87, "Attention.forward", act);
    add("aten::add", "model.py", 62, "Block.forward", act);
    add("aten::layer_norm", "model.py", 63, "Block.forward", act);
    add("aten::linear", "model.py", 100, "MLP.forward", mlp);
    add("aten::gelu", "model.py", 101, "MLP.forward", mlp);
    add("aten::linear", "model.py", 102, "MLP.forward", act);
    add("aten::add", "model.py", 64, "Block.forward", act);
  }
  add("aten::linear", "model.py", 40, "GPT.forward", logits);
  add("aten::cross_entropy_loss", "train.py", 120, "train_step", {});
  int forward_ops = static_cast<int>(template_.size());
  for (int f = forward_ops - 1; f >= 0; --f) {
    OpTemplate t = template_[f];
    t.name = "autograd::" + t.name.substr(t.name.find("::") + 2) + "_backward";
    t.backward = true;
    t.forward_of = f;
    t.producer = static_cast<int>(template_.size()) - 1;
    t.independent_with_next = false;
    template_.push_back(std::move(t));
  }
  for (const char* name : {"aten::_foreach_mul_", "aten::_foreach_add_", "aten::_foreach_addcdiv_"}) {
    int i = add(name, "train.py", 130, "train_step", {Hd * Hd * 12 * kLayers});
    template_[i].replicated = true;
  }
}

bool SyntheticTrace::collective_after(int64_t base) const {
  return o_.collective_every != 0 && base >= 0 &&
         (static_cast<uint64_t>(base) + 1) % o_.collective_every == 0;
}

void SyntheticTrace::BuildPlans() {
  plans_.resize(o_.ranks);
  swaps_.resize(o_.ranks);
  inserted_at_.resize(o_.ranks);
  drops_.resize(o_.ranks);
  for (uint32_t r = 0; r < o_.ranks; ++r) {
    Rng rng{o_.seed * 0x100000001B3ull ^ (uint64_t{r} << 32) ^ 0x5EED};
    std::vector<int64_t> order(o_.ops);
    for (uint64_t i = 0; i < o_.ops; ++i) order[i] = static_cast<int64_t>(i);
    // Swaps of adjacent independent ops (q/k, k/v projections), never across
    // a collective and never overlapping another swap.
    std::set<uint64_t> swapped;
    for (uint32_t n = 0, tries = 0; n < o_.reorders && tries < o_.reorders * 100 + 100; ++tries) {
      uint64_t j = rng.Below(o_.ops > 1 ? o_.ops - 1 : 0);
      if (o_.ops < 2 || !op(static_cast<int64_t>(j)).independent_with_next ||
          collective_after(static_cast<int64_t>(j)) || swapped.count(j) || swapped.count(j + 1) ||
          (j > 0 && swapped.count(j - 1))) {
        continue;
      }
      swapped.insert(j);
      std::swap(order[j], order[j + 1]);
      ++n;
    }
    // Inserted ops go before base position p (p in 0..ops), not inside a swap.
    std::multiset<uint64_t> inserts;
    for (uint32_t n = 0, tries = 0; n < o_.inserts && tries < o_.inserts * 100 + 100; ++tries) {
      uint64_t p = rng.Below(o_.ops + 1);
      if (p > 0 && swapped.count(p - 1)) continue;
      inserts.insert(p);
      ++n;
    }
    auto& plan = plans_[r];
    plan.reserve(o_.ops + o_.inserts);
    uint32_t inserted = 0;
    auto ins = inserts.begin();
    for (uint64_t p = 0; p <= o_.ops; ++p) {
      while (ins != inserts.end() && *ins == p) {
        inserted_at_[r].push_back(plan.size());
        plan.push_back(PlanEntry{-1, inserted++});
        ++ins;
      }
      if (p == o_.ops) break;
      if (swapped.count(p)) swaps_[r].push_back(plan.size());
      plan.push_back(PlanEntry{order[p], 0});
    }
  }
  // Dropped ranges, spread over ranks, non-overlapping within a rank.
  Rng rng{o_.seed ^ 0xD809};
  for (uint32_t n = 0, tries = 0; n < o_.drop_batches && tries < o_.drop_batches * 100 + 100; ++tries) {
    uint32_t r = static_cast<uint32_t>(rng.Below(o_.ranks));
    uint64_t len = plans_[r].size();
    if (len < o_.drop_size) continue;
    uint64_t first = rng.Below(len - o_.drop_size + 1);
    bool overlaps = false;
    for (uint64_t d : drops_[r]) overlaps = overlaps || (first < d + o_.drop_size && d < first + o_.drop_size);
    if (overlaps) continue;
    drops_[r].push_back(first);
    ++n;
  }
  for (auto& d : drops_) std::sort(d.begin(), d.end());
  // Divergence: the smallest base index recorded at or after the given
  // position on the diverging rank; it reaches every rank through the next
  // all-reduce after it.
  if (o_.diverge_rank && *o_.diverge_rank < o_.ranks) {
    const auto& plan = plans_[*o_.diverge_rank];
    for (uint64_t p = o_.diverge_op; p < plan.size(); ++p) {
      if (plan[p].base >= 0 && (diverge_base_ < 0 || plan[p].base < diverge_base_)) diverge_base_ = plan[p].base;
      if (diverge_base_ >= 0 && p > o_.diverge_op + 4) break;  // swaps are adjacent: the min is near
    }
    if (diverge_base_ >= 0 && o_.collective_every != 0) {
      uint64_t k = o_.collective_every;
      taint_all_from_ = static_cast<int64_t>((static_cast<uint64_t>(diverge_base_) / k + 1) * k);
    }
  }
}

bool SyntheticTrace::Tainted(uint32_t rank, int64_t base) const {
  if (diverge_base_ < 0) return false;
  if (o_.diverge_rank && rank == *o_.diverge_rank && base >= diverge_base_) return true;
  return taint_all_from_ >= 0 && base >= taint_all_from_;
}

uint64_t SyntheticTrace::OutputFp(uint32_t rank, int64_t base) const {
  const OpTemplate& t = op(base);
  uint64_t who = t.replicated ? kAllRanks : rank;
  return H(o_.seed, who, static_cast<uint64_t>(base), 1, Tainted(rank, base) ? kTaintSalt : 0);
}

uint64_t SyntheticTrace::InputFp(uint32_t rank, int64_t base) const {
  const OpTemplate& t = op(base);
  uint64_t step = step_of(base);
  if (t.producer < 0) return H(o_.seed, rank, step, 2);  // this step's data batch
  int64_t producer = static_cast<int64_t>(step * template_.size()) + t.producer;
  return OutputFp(rank, producer);
}

uint64_t SyntheticTrace::CollectiveInputFp(uint32_t rank, uint64_t m) const {
  int64_t last = static_cast<int64_t>((m + 1) * o_.collective_every) - 1;
  return H(o_.seed, rank, m, 3, Tainted(rank, last) ? kTaintSalt : 0);
}

uint64_t SyntheticTrace::CollectiveOutputFp(uint64_t m) const {
  int64_t last = static_cast<int64_t>((m + 1) * o_.collective_every) - 1;
  bool any = diverge_base_ >= 0 && diverge_base_ <= last;
  return H(o_.seed, kAllRanks, m, 4, any ? kTaintSalt : 0);
}

}  // namespace opguard::loadgen
