// How the CUDA kernels split a tensor between threads, as __host__ __device__
// code: the kernels run ThreadWork() on the device, and the CPU unit tests run
// the very same function for every (warp, lane) of many grid shapes to show
// that the combined lane sums do not depend on the partition.
#pragma once

#include <cstdint>
#include <cstring>

#include "fingerprint_spec.h"

namespace opguard::fingerprint::spec {

constexpr uint32_t kWarpSize = 32;
// 16-byte loads per thread per 2 KiB block: one warp-wide load covers 512 B.
constexpr uint32_t kLoadsPerBlock = kBlockBytes / (kWarpSize * 16);

OPGUARD_FP_HD void Load16(const uint8_t* p, uint64_t& w0, uint64_t& w1) {
#if defined(__CUDA_ARCH__)
  // Read-only path; the tensor is not written while the kernel runs.
  const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(p));
  w0 = v.x;
  w1 = v.y;
#else
  std::memcpy(&w0, p, 8);
  std::memcpy(&w1, p + 8, 8);
#endif
}

// Word p of an `nbytes`-byte stream at `data`, zero-padded past the end.
// `aligned8`: data is 8-byte aligned, so whole words can be read directly.
OPGUARD_FP_HD uint64_t LoadWord(const uint8_t* data, uint64_t nbytes, uint64_t p, bool aligned8) {
  const uint64_t off = p * 8;
  if (aligned8 && off + 8 <= nbytes) {
#if defined(__CUDA_ARCH__)
    return __ldg(reinterpret_cast<const unsigned long long*>(data + off));
#else
    uint64_t w;
    std::memcpy(&w, data + off, 8);
    return w;
#endif
  }
  uint64_t w = 0;
  const uint64_t end = off + 8 < nbytes ? off + 8 : nbytes;
  for (uint64_t k = off; k < end; ++k) w |= static_cast<uint64_t>(data[k]) << (8 * (k - off));
  return w;
}

// Bytes of word p that belong to the stream (8 except possibly the last).
OPGUARD_FP_HD uint32_t ValidBytes(uint64_t nbytes, uint64_t p) {
  const uint64_t off = p * 8;
  return nbytes - off >= 8 ? 8u : static_cast<uint32_t>(nbytes - off);
}

// The share of one thread in a team of `num_warps` warps that covers one
// stream (the whole grid in the single-tensor kernel, one CTA in the batched
// one):
//  * full 2 KiB blocks, only when `data` is 16-byte aligned: warp w takes
//    blocks w, w + num_warps, ...; lane t reads 16 bytes at 16t + 512k
//    (k < 4), i.e. block words 2t + 64k and 2t + 64k + 1 — coalesced, and the
//    lane's table keys are loop invariants;
//  * every other word (the tail after the last full block, or every word of
//    a misaligned stream) goes to team thread g = 32 * warp + lane, then
//    g + 32 * num_warps, ...
// `visit(word, valid_bytes)` sees each of this thread's words once.
template <class Visitor>
OPGUARD_FP_HD void ThreadWork(const uint8_t* data, uint64_t nbytes, uint64_t warp,
                              uint64_t num_warps, uint32_t lane, Lanes& lanes, Visitor& visit) {
  const auto addr = reinterpret_cast<uintptr_t>(data);
  const bool aligned16 = addr % 16 == 0;
  const uint64_t full_blocks = aligned16 ? nbytes / kBlockBytes : 0;
  if (full_blocks > warp) {
    uint64_t ta[2 * kLoadsPerBlock], tb[2 * kLoadsPerBlock];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (uint32_t k = 0; k < 2 * kLoadsPerBlock; ++k) {
      const uint32_t i = (k / 2) * (2 * kWarpSize) + 2 * lane + (k % 2);
      ta[k] = TableKeyA(i);
      tb[k] = TableKeyB(i);
    }
    for (uint64_t b = warp; b < full_blocks; b += num_warps) {
      const BlockKeys bk = BlockKey(b);
      const uint8_t* base = data + b * kBlockBytes + 16 * lane;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (uint32_t k = 0; k < kLoadsPerBlock; ++k) {
        uint64_t w0, w1;
        Load16(base + k * (kWarpSize * 16), w0, w1);
        lanes.a0 += TermA(w0, ta[2 * k] + bk.a) + TermA(w1, ta[2 * k + 1] + bk.a);
        lanes.a1 += TermB(w0, tb[2 * k] + bk.b) + TermB(w1, tb[2 * k + 1] + bk.b);
        visit(w0, 8u);
        visit(w1, 8u);
      }
    }
  }
  const uint64_t nwords = (nbytes + 7) / 8;
  const bool aligned8 = addr % 8 == 0;
  const uint64_t team = num_warps * kWarpSize;
  for (uint64_t p = full_blocks * kBlockWords + warp * kWarpSize + lane; p < nwords; p += team) {
    const uint64_t w = LoadWord(data, nbytes, p, aligned8);
    AddWord(lanes, w, p);
    visit(w, ValidBytes(nbytes, p));
  }
}

}  // namespace opguard::fingerprint::spec
