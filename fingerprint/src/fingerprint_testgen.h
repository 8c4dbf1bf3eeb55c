// Deterministic test inputs, specified in docs/fingerprint.md ("Test vectors"):
// the bytes of a vector with seed S are the little-endian bytes of successive
// SplitMix64 outputs started from state S, truncated to the size. Shared by
// the unit tests, the vector writer and the GPU check so they agree.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace opguard::fingerprint::testgen {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

inline void FillBytes(uint64_t seed, uint8_t* out, uint64_t size) {
  SplitMix64 rng(seed);
  uint64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t v = rng.Next();
    for (int k = 0; k < 8; ++k) out[i + k] = static_cast<uint8_t>(v >> (8 * k));
  }
  if (i < size) {
    const uint64_t v = rng.Next();
    uint8_t tail[8];
    for (int k = 0; k < 8; ++k) tail[k] = static_cast<uint8_t>(v >> (8 * k));
    std::memcpy(out + i, tail, size - i);
  }
}

inline std::vector<uint8_t> Bytes(uint64_t seed, uint64_t size) {
  std::vector<uint8_t> out(size);
  FillBytes(seed, out.data(), size);
  return out;
}

// One line of fingerprint/testdata/vectors.txt:
//   <seed> <dtype name> <shape: D0,D1,... or "-" for rank 0> <32 hex digits>
struct Vector {
  uint64_t seed = 0;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string hex;
};

}  // namespace opguard::fingerprint::testgen
