// Knobs of the CPU path that tests and benchmarks turn; production callers
// use FingerprintHost / DigestHost. None of them changes the digest, and
// only `tile_bytes` may change the last bits of Stats::sum and Stats::l2.
#pragma once

#include <cstdint>

#include "opguard/fingerprint/fingerprint.h"

namespace opguard::fingerprint::internal {

// kAuto: the widest the CPU runs; the others at most that one.
enum class Isa { kAuto, kScalar, kAvx2, kAvx512 };

// The stats fold fixed-size tiles of the logical byte stream in order, which
// is what makes sum/l2 independent of the thread count.
constexpr uint64_t kDefaultTileBytes = 64 * 1024;

struct HostOptions {
  int threads = 1;
  Isa isa = Isa::kAuto;
  bool stats = true;
  uint64_t tile_bytes = kDefaultTileBytes;  // multiple of 16, > 0
  // Smallest share of the buffer worth a thread of its own.
  uint64_t min_bytes_per_thread = 4u << 20;
  // Runs the shares on a caller's pool instead of threads started per call.
  const ParallelFor* run_parallel = nullptr;
};

// True when this CPU runs the AVX2 path (checked once at runtime).
bool CpuHasAvx2();
// True when it also runs the AVX-512 hash (AVX-512F).
bool CpuHasAvx512();

Fingerprint FingerprintHostWith(const TensorView& tensor, const HostOptions& options,
                                ByteSums* sums = nullptr);

}  // namespace opguard::fingerprint::internal
