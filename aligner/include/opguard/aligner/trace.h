// The aligner's input model: what one rank of one run recorded, in two tiers.
//
//  * OpEvent is the compact tier the alignment runs on: fixed size (80 bytes),
//    no heap, structural key and fingerprint digests precomputed. A daemon
//    streams a lane's RocksDB range into a std::vector<OpEvent> and never has
//    to keep the full records in memory.
//  * OpDetail mirrors wire::OpRecord one-to-one (idl/common.fbs). The report
//    needs it only for the pivot op (and for candidate pivots on other lanes),
//    so it is fetched on demand through a DetailSource.
//
// Every id (op name, file, function, kernel, site, communicator) is the 64-bit
// content hash the shim sent; ids are equal across ranks and runs, so no string
// table is needed until a report is rendered (StringResolver).
//
// Lanes: op_index is monotone per (rank, lane) only. The aligner aligns each
// lane of a rank against the same lane id of the other run and never pairs ops
// across lanes (lane ids are assigned deterministically by the shim: main
// thread, autograd thread, ...). See docs/alignment.md, "Lanes".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace opguard::aligner {

// 128-bit fingerprint as on the wire (wire::Fp128: lo = bytes 0..7, hi = 8..15).
struct Fp128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const Fp128&, const Fp128&) = default;
};

// Same numbering as wire::DType and wire::CollectiveKind so the daemon can cast.
enum class DType : uint8_t {
  kUnknown = 0, kFloat64, kFloat32, kFloat16, kBFloat16, kFloat8E4M3, kFloat8E5M2,
  kInt64, kInt32, kInt16, kInt8, kUInt8, kBool, kUInt16, kUInt32, kUInt64, kComplex64, kComplex128
};
const char* DTypeName(DType d);

enum class CollectiveKind : uint8_t {
  kUnknown = 0, kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter,
  kAllToAll, kSend, kRecv, kBarrier, kGather, kScatter
};
const char* CollectiveKindName(CollectiveKind k);

struct TensorStats {
  uint64_t nan_count = 0;
  uint64_t inf_count = 0;
  double min = 0, max = 0, sum = 0, l2 = 0;
  friend bool operator==(const TensorStats&, const TensorStats&) = default;
};

struct TensorInfo {
  Fp128 fingerprint;
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
  std::optional<TensorStats> stats;
  int16_t device = -1;
};

enum class ValueKind : uint8_t { kNone = 0, kTensor, kScalar, kTensorList };

// One op input (wire::Value): a tensor by fingerprint or a scalar by raw bits.
struct InputValue {
  ValueKind kind = ValueKind::kNone;
  TensorInfo tensor;                // kTensor
  uint64_t scalar_bits = 0;         // kScalar
  DType scalar_dtype = DType::kUnknown;
  std::vector<TensorInfo> tensors;  // kTensorList
};

// Full record of one op boundary (wire::OpRecord).
struct OpDetail {
  uint32_t lane = 0;
  uint64_t op_index = 0;
  uint64_t step = 0;
  uint64_t name = 0;
  uint64_t site = 0;
  int64_t seq_nr = -1;
  bool backward = false;
  uint64_t forward_site = 0;  // a backward op's forward call site, as context
  std::vector<InputValue> inputs;
  std::vector<TensorInfo> outputs;
  std::vector<uint64_t> kernels;
  uint64_t start_ns = 0;
  uint64_t duration_ns = 0;
  bool nondeterministic = false;
  bool replicated = false;  // data-parallel replicas must agree on it
  bool trusted = false;     // trusted mode: recorded without fingerprints, never compared
};

// Compact op event: everything the alignment and the pivot walk look at.
struct OpEvent {
  static constexpr uint32_t kNondeterministic = 1u << 0;
  static constexpr uint32_t kReplicated = 1u << 1;
  static constexpr uint32_t kTrusted = 1u << 2;

  uint64_t op_index = 0;
  uint64_t step = 0;
  uint64_t name = 0;
  uint64_t site = 0;
  // Structural key: name, site, backward flag, and dtype+shape of every input
  // and output. Only events with equal keys may pair.
  uint64_t key = 0;
  Fp128 outputs;  // digest of the ordered list of output fingerprints
  Fp128 inputs;   // digest of the ordered input signatures (fingerprints, scalar bits)
  uint32_t flags = 0;
  // Name, backward flag, dtypes and shapes of the tensors read and written,
  // 32 bits: what ops on an edited source line still share, also when the
  // line passes other scalar arguments.
  uint32_t loose_key = 0;

  bool nondeterministic() const { return (flags & kNondeterministic) != 0; }
  bool replicated() const { return (flags & kReplicated) != 0; }
  bool trusted() const { return (flags & kTrusted) != 0; }
};

// The compact event of a full record. The daemon calls this (or fills OpEvent
// itself with the helpers below) while scanning; both runs must use the same
// function, which they do because the aligner computes both.
// `boundary` (non-zero) stands in for d.site in the structural key: the
// daemon passes the site's BoundaryId so that keys survive line shifts.
// MakeOpEvent(d, b) == ToOpEvent(MakeOpEventCore(d), b), bit for bit.
OpEvent MakeOpEvent(const OpDetail& d, uint64_t boundary = 0);
uint64_t StructuralKey(const OpDetail& d, uint64_t boundary = 0);

// The part of an OpEvent that depends on the record alone: everything but
// the site's share of the structural key, which needs the run's sources
// (BoundaryId) and so is added when a query reads the trace. A daemon
// computes it once when the record arrives and stores it next to the record
// (docs/storage.md), so a query need not decode and hash every record.
struct OpEventCore {
  uint64_t op_index = 0;
  uint64_t step = 0;
  uint64_t name = 0;
  uint64_t site = 0;
  uint64_t siteless_key = 0;  // structural key without the site
  Fp128 outputs;
  Fp128 inputs;
  uint32_t flags = 0;  // OpEvent::kNondeterministic | kReplicated
  friend bool operator==(const OpEventCore&, const OpEventCore&) = default;
};
// Stored cores carry this number: a binary whose hashing differs (a new
// number) recomputes them from the records instead of trusting them.
inline constexpr uint32_t kOpEventCoreVersion = 2;
OpEventCore MakeOpEventCore(const OpDetail& d);
OpEvent ToOpEvent(const OpEventCore& core, uint64_t boundary = 0);

// Line-shift-tolerant identity of a call site: the file's base name, the
// function and the text of the source line (trimmed), not the path and line
// number. Unchanged lines of two runs whose code differs by inserted or
// deleted lines, or that ran from different checkouts, get the same id.
// Identical lines of one function share it: which of them issued an op does
// not decide a pairing on its own (their order and the op's inputs do; see
// align.h). When the line's text is unknown (the run did not send the file)
// the line number stands in for it.
uint64_t BoundaryId(std::string_view file_path, std::string_view function, uint32_t line,
                    std::string_view line_text);
// The trimmed text BoundaryId keys on.
std::string_view TrimmedLine(std::string_view line_text);
Fp128 OutputDigest(const std::vector<TensorInfo>& outputs);
Fp128 InputDigest(const std::vector<InputValue>& inputs);

// Ops first_op..last_op (inclusive) on `lane` were dropped (wire::GapNotice).
struct Gap {
  uint32_t lane = 0;
  uint64_t first_op = 0;
  uint64_t last_op = 0;
};

struct LaneTrace {
  uint32_t lane = 0;
  std::vector<OpEvent> ops;  // ascending op_index
};

enum class CollectivePhase : uint8_t { kCompleted = 0, kEntered = 1 };

// One collective on one rank (wire::CollectiveRecord minus the tensors; the
// outputs are kept as fingerprints because cross-rank checks compare them).
struct CollectiveEvent {
  uint64_t communicator = 0;
  uint64_t seq = 0;
  CollectivePhase phase = CollectivePhase::kCompleted;
  CollectiveKind kind = CollectiveKind::kUnknown;
  DType dtype = DType::kUnknown;
  uint64_t count = 0;
  int32_t root = -1;
  uint8_t reduce_op = 255;
  std::vector<Fp128> outputs;
  uint32_t lane = 0;
  uint64_t op_index = 0;
  uint64_t step = 0;
  uint64_t site = 0;
  uint64_t time_ns = 0;
};

// Everything the aligner needs about one rank of one run.
struct RankTrace {
  uint32_t rank = 0;
  std::vector<LaneTrace> lanes;
  std::vector<Gap> gaps;
  std::vector<CollectiveEvent> collectives;  // any order; both phases may appear
};

// wire::CommunicatorDef. Membership decides who a live collective waits for.
struct Communicator {
  uint64_t id = 0;
  std::string name;
  std::vector<uint32_t> ranks;  // global ranks, by rank in the communicator
};

// How reports name a communicator: by its members, "pg[0,1]", where it has
// no name or the adapter's generated one ("pg0,1", which reads as one number);
// otherwise its name ("world", or one the program chose); "" when nothing is
// known (renderers then show the id).
std::string CommunicatorLabel(const Communicator& c);

// Resolves ids to text for reports. Implemented by the daemon over its string
// and site tables; unknown ids render as hex.
class StringResolver {
 public:
  struct Site {
    uint64_t file = 0;      // string id
    uint32_t line = 0;
    uint64_t function = 0;  // string id
  };
  virtual ~StringResolver() = default;
  virtual std::optional<std::string> String(uint64_t id) const = 0;
  virtual std::optional<Site> SiteOf(uint64_t site_id) const = 0;
};

// Fetches the full record of one op; called only for pivots and candidate
// pivots (a handful of calls per rank). nullopt: record not available.
class DetailSource {
 public:
  virtual ~DetailSource() = default;
  virtual std::optional<OpDetail> Find(uint32_t rank, uint32_t lane, uint64_t op_index) const = 0;
};

// In-memory implementations for tests, tools and small traces.
class StringTable final : public StringResolver {
 public:
  void AddString(uint64_t id, std::string text) { strings_[id] = std::move(text); }
  void AddSite(uint64_t id, Site site) { sites_[id] = site; }
  // Ids are taken as given (tests pick their own; the daemon passes the
  // shim's XXH64 ids).
  std::optional<std::string> String(uint64_t id) const override;
  std::optional<Site> SiteOf(uint64_t site_id) const override;

 private:
  std::unordered_map<uint64_t, std::string> strings_;
  std::unordered_map<uint64_t, Site> sites_;
};

class InMemoryDetails final : public DetailSource {
 public:
  void Add(uint32_t rank, OpDetail d);
  std::optional<OpDetail> Find(uint32_t rank, uint32_t lane, uint64_t op_index) const override;

 private:
  struct KeyHash {
    size_t operator()(const std::tuple<uint32_t, uint32_t, uint64_t>& k) const;
  };
  std::unordered_map<std::tuple<uint32_t, uint32_t, uint64_t>, OpDetail, KeyHash> ops_;
};

}  // namespace opguard::aligner
