// Internal hashing for structural keys, digests and anchors: deterministic
// and well mixed. Daemons store the event cores hashed with it
// (OpEventCore, trace.h): a change to it, or to what the siteless key and
// the digests mix in, must bump kOpEventCoreVersion so that stored cores of
// the old hashing are recomputed from their records, not compared with new ones.
#pragma once

#include <cstdint>

#include "opguard/aligner/trace.h"

namespace opguard::aligner {

inline uint64_t Mix64(uint64_t x) {
  // splitmix64 finaliser: full avalanche, cheap.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Two independent 64-bit lanes so digests of 128-bit fingerprints keep
// (about) 128 bits: a digest collision must not hide a divergence.
class Hasher {
 public:
  void Add(uint64_t v) {
    a_ = Mix64(a_ ^ (v + 0x9e3779b97f4a7c15ULL));
    b_ = Mix64(b_ + (v ^ 0xc2b2ae3d27d4eb4fULL)) ^ (b_ >> 17);
  }
  uint64_t Digest64() const { return Mix64(a_ ^ (b_ << 1)); }
  Fp128 Digest128() const { return Fp128{Mix64(a_), Mix64(b_ ^ 0x165667b19e3779f9ULL)}; }

 private:
  uint64_t a_ = 0x243f6a8885a308d3ULL;
  uint64_t b_ = 0x13198a2e03707344ULL;
};

}  // namespace opguard::aligner
