// The in-process record buffer between the calling threads and the sender
// thread. A recording call copies its record into a StagingBuffer as one
// entry of plain structs (no allocation beyond amortised growth, no
// FlatBuffers work); the sender thread swaps the buffer out and encodes the
// entries into Batch messages (encoder.h). The format never leaves the
// process, so it is plain memcpy of the structs below; entries are 8-byte
// aligned and sized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "opguard/shim.h"

namespace opguard::shim {

enum class EntryKind : uint8_t {
  kOp = 1,
  kCollective,
  kString,
  kSite,
  kCommunicator,
  kStep,
  kSource,
  kGap,
  kCollectiveGap,
};

struct EntryHeader {
  uint32_t size;  // whole entry including this header, a multiple of 8
  EntryKind kind;
  uint8_t pad[3];
};

struct OpFixed {
  uint64_t op_index, step, name, site;
  int64_t seq_nr;
  uint64_t start_ns, duration_ns, forward_site;
  uint32_t lane, flags, num_inputs, num_outputs, num_kernels, pad;
};

struct ValueFixed {
  uint8_t kind, scalar_dtype;
  uint16_t pad;
  uint32_t num_tensors;  // tensors that follow (1 for kind Tensor)
  uint64_t scalar_bits;
};

// Followed by `ndim` int64 dims.
struct TensorFixed {
  uint64_t lo, hi;
  uint32_t ndim;
  uint8_t dtype, has_stats;
  int16_t device;
  opguard_tensor_stats stats;
};

struct CollectiveFixed {
  uint64_t communicator, seq, count, op_index, step, site, time_ns;
  int32_t root;
  uint32_t lane;
  uint8_t phase, kind, dtype, reduce_op;
  uint32_t num_inputs, num_outputs, pad;
};

struct StringFixed {  // followed by `len` bytes
  uint64_t id;
  uint64_t len;
};

struct SiteFixed {
  uint64_t id, file, function;
  uint32_t line, pad;
};

struct CommunicatorFixed {  // followed by name bytes (padded) then `num_ranks` uint32
  uint64_t id;
  uint32_t size, name_len, num_ranks, pad;
};

struct StepFixed {
  uint64_t step, op_index, time_ns;
  uint32_t lane, pad;
};

struct SourceFixed {  // followed by `len` bytes: the content, or the path to read
  uint64_t file;
  uint64_t len;
  uint32_t from_path, pad;
};

struct GapFixed {  // followed by `reason_len` bytes
  uint64_t first_op, last_op, count;
  uint32_t lane, reason_len;
};

struct CollectiveGapFixed {  // followed by `reason_len` bytes; 0: "shim buffer full"
  uint64_t communicator, first_seq, last_seq, count;
  uint32_t reason_len, pad;
};

constexpr size_t Pad8(size_t n) { return (n + 7) & ~size_t{7}; }

// A growable byte buffer that does not zero what it appends (the hot path
// writes every byte it reserves). Move-only; owned by whoever holds it under
// the core's mutex.
class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer() { std::free(data_); }

  // Returns space for `n` more bytes (n a multiple of 8), or nullptr if
  // memory could not be had (the caller drops the record).
  uint8_t* Append(size_t n) {
    if (size_ + n > cap_) {
      size_t cap = cap_ == 0 ? 1024 * 1024 : cap_;
      while (cap < size_ + n) cap *= 2;
      void* grown = std::realloc(data_, cap);
      if (grown == nullptr) return nullptr;
      data_ = static_cast<uint8_t*>(grown);
      cap_ = cap;
    }
    uint8_t* p = data_ + size_;
    size_ += n;
    return p;
  }
  void Swap(StagingBuffer& other) {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(cap_, other.cap_);
  }
  void Clear() { size_ = 0; }
  // Returns the memory when the buffer grew far beyond what it holds.
  void ShrinkIfIdle(size_t keep) {
    if (size_ == 0 && cap_ > keep) {
      std::free(data_);
      data_ = nullptr;
      cap_ = 0;
    }
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

// Sequential writer over reserved space.
class EntryWriter {
 public:
  explicit EntryWriter(uint8_t* p) : p_(p) {}
  template <typename T>
  void Put(const T& v) {
    std::memcpy(p_, &v, sizeof(T));
    p_ += sizeof(T);
  }
  void PutBytes(const void* data, size_t n) {
    if (n != 0) std::memcpy(p_, data, n);
    size_t padded = Pad8(n);
    if (padded != n) std::memset(p_ + n, 0, padded - n);
    p_ += padded;
  }
  uint8_t* pos() const { return p_; }

 private:
  uint8_t* p_;
};

// Sequential reader; the sender thread trusts the entries (this process wrote
// them) but still checks bounds so a bug cannot read past the buffer.
class EntryReader {
 public:
  EntryReader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  template <typename T>
  bool Get(T* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, std::string_view* out) {
    size_t padded = Pad8(n);
    if (static_cast<size_t>(end_ - p_) < padded) return false;
    *out = std::string_view(reinterpret_cast<const char*>(p_), n);
    p_ += padded;
    return true;
  }
  bool GetDims(uint32_t ndim, const uint8_t** dims) {
    size_t n = size_t{ndim} * sizeof(int64_t);
    if (static_cast<size_t>(end_ - p_) < n) return false;
    *dims = p_;
    p_ += n;
    return true;
  }
  bool done() const { return p_ >= end_; }
  const uint8_t* pos() const { return p_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace opguard::shim
