// What libopguard_nccl.so records about the NCCL calls it forwards: the
// communicators (identity, name, size), one sequence per communicator, group
// semantics, and the Entered/Completed records with buffer fingerprints,
// through the shim's C API. Only the interposer (interposer.cc) calls it, and
// only while recording (OPGUARD=1); every call is thread-safe.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "opguard/shim.h"

namespace opguard::nccl {

// One collective or point-to-point call as the application made it.
struct Call {
  uint8_t kind = OPGUARD_COLL_UNKNOWN;  // OPGUARD_COLL_*
  ncclComm_t comm = nullptr;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  bool reduces = false;
  size_t count = 0;  // NCCL's count argument
  int root = -1;     // root or peer, -1 none
  cudaStream_t stream = nullptr;
  const void* caller = nullptr;  // return address into the application's code
  // Buffers and their sizes in `count`s: 1, or `scale_by_ranks` for
  // count × communicator size; root_only: only the root reads/writes it.
  struct Buffer {
    const void* data = nullptr;
    bool used = false;
    bool scale_by_ranks = false;
    bool root_only = false;
  };
  Buffer input, output;
};

class Recorder {
 public:
  static Recorder& Get();

  // A communicator NCCL created (the call succeeded or is in progress).
  // `nranks` and `rank` may be -1 when not known yet.
  void AddCommunicator(ncclComm_t comm, uint64_t identity, const std::string& name, int nranks,
                       int rank);
  // A split or shrink of `parent` is under way: its identity and name and
  // the ordinal of this split (or shrink) among the parent's. False if the
  // parent is not known (created before recording started).
  enum Derivation { kSplit, kShrink };
  struct Parent {
    uint64_t id = 0;
    uint64_t ordinal = 0;
    std::string name;
  };
  bool NextChild(ncclComm_t parent, Derivation how, Parent* out);
  void RemoveCommunicator(ncclComm_t comm);

  // A collective or point-to-point call: forwards it with `forward` and
  // returns NCCL's result unchanged. Outside a group the call is recorded
  // once NCCL accepted it; inside one it is recorded at the outermost
  // GroupEnd, when NCCL issues it.
  ncclResult_t Collective(const Call& call, const std::function<ncclResult_t()>& forward);
  ncclResult_t GroupStart(const std::function<ncclResult_t()>& forward);
  ncclResult_t GroupEnd(const std::function<ncclResult_t()>& forward);

 private:
  struct Communicator {
    uint64_t id = 0;
    std::string name;
    int nranks = -1;
    int rank = -1;
    bool recorded = true;  // false: another member of it lives in this process
    bool defined = false;
    uint64_t next_seq = 0;
    uint64_t children[2] = {0, 0};  // splits and shrinks so far (Derivation)
    // Point-to-point: (channel, kind) -> next sequence number. A process is
    // the sender or the receiver of a channel, both only for sends to itself.
    std::map<std::pair<uint64_t, uint8_t>, uint64_t> channel_seq;
  };

  // A call NCCL accepted, waiting to be issued or recorded.
  struct Pending {
    Call call;
    uint64_t time_ns = 0;  // when the application made the call
    uint64_t communicator = 0;
    uint64_t input_elements = 0, output_elements = 0;
    int64_t input_shape = 0;
    bool has_input = false;
    opguard_tensor input{};
  };

  Communicator* FindLocked(ncclComm_t comm);
  // Fills what recording needs from the communicator; false if the call is
  // not recorded (unknown communicator, or one not recorded here).
  bool Prepare(const Call& call, Pending* out);
  // Fingerprints the input; call it before the call is issued.
  static void TakeInput(Pending& p);
  // Records Entered (with the input) and Completed (input and output) for
  // each call, in call order, once their operations completed.
  void Record(std::vector<Pending>& calls);
  // The sequence number and communicator id of the call, after those of
  // earlier calls on the same communicator (or point-to-point channel).
  uint64_t NextSeq(const Pending& p, uint64_t* communicator);
  // The call site of a return address: the calling object and the nearest
  // symbol plus offset (dladdr), interned once per address.
  uint64_t SiteOf(const void* caller);

  // Calls of this thread's open group, issued by its outermost GroupEnd
  // (NCCL's group state is per thread too).
  static thread_local std::vector<Pending> group_calls_;

  std::mutex mu_;
  std::unordered_map<ncclComm_t, Communicator> comms_;
  std::unordered_map<uint64_t, int> members_here_;  // identity -> members in this process
  std::unordered_map<const void*, uint64_t> sites_;
};

uint8_t DTypeOf(ncclDataType_t type);
uint64_t WallNs();

}  // namespace opguard::nccl
