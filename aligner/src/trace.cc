#include "opguard/aligner/trace.h"

#include <algorithm>
#include <cstring>

#include "hash.h"

namespace opguard::aligner {

std::string CommunicatorLabel(const Communicator& c) {
  // The adapter names a subgroup "pg" + its members joined by commas.
  const bool generated = c.name.empty() || (c.name.size() > 2 && c.name.compare(0, 2, "pg") == 0 &&
                                            c.name.find_first_not_of("0123456789,", 2) == std::string::npos);
  if (!generated || c.ranks.empty()) return c.name;
  std::string label = "pg[";
  for (size_t i = 0; i < c.ranks.size(); ++i) label += (i ? "," : "") + std::to_string(c.ranks[i]);
  return label + "]";
}

const char* DTypeName(DType d) {
  static const char* const kNames[] = {"unknown", "float64", "float32", "float16", "bfloat16",
                                       "float8_e4m3", "float8_e5m2", "int64", "int32", "int16",
                                       "int8", "uint8", "bool", "uint16", "uint32", "uint64",
                                       "complex64", "complex128"};
  auto i = static_cast<size_t>(d);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

const char* CollectiveKindName(CollectiveKind k) {
  static const char* const kNames[] = {"unknown", "all_reduce", "broadcast", "reduce",
                                       "all_gather", "reduce_scatter", "all_to_all", "send",
                                       "recv", "barrier", "gather", "scatter"};
  auto i = static_cast<size_t>(k);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

namespace {

void MixShape(Hasher& h, const TensorInfo& t) {
  h.Add(static_cast<uint64_t>(t.dtype));
  h.Add(t.shape.size());
  for (int64_t d : t.shape) h.Add(static_cast<uint64_t>(d));
}

// The tensors' part of an op's signature: its name, backward flag, and the
// dtype and shape of every tensor it reads and writes. Scalar and absent
// arguments are left out, so an op called with another argument list
// (`scale=...` given where the default was used) keeps this part.
uint32_t LooseKey(const OpDetail& d) {
  Hasher h;
  h.Add(d.name);
  h.Add(d.backward ? 1 : 0);
  for (const InputValue& v : d.inputs) {
    if (v.kind == ValueKind::kTensor) MixShape(h, v.tensor);
    if (v.kind == ValueKind::kTensorList) {
      h.Add(v.tensors.size());
      for (const TensorInfo& t : v.tensors) MixShape(h, t);
    }
  }
  h.Add(d.outputs.size());
  for (const TensorInfo& t : d.outputs) MixShape(h, t);
  return static_cast<uint32_t>(h.Digest64());
}

// Everything of the structural key but the site: the loose key in the upper
// half, and in the lower half a hash of the whole argument list (kinds and
// scalar types too; the scalar's value is data, not structure). Only equal
// halves pair structurally; the upper half alone pairs across an edited line.
uint64_t SitelessKey(const OpDetail& d) {
  Hasher h;
  h.Add(d.name);
  h.Add(d.backward ? 1 : 0);
  h.Add(d.inputs.size());
  for (const InputValue& v : d.inputs) {
    h.Add(static_cast<uint64_t>(v.kind));
    switch (v.kind) {
      case ValueKind::kTensor: MixShape(h, v.tensor); break;
      case ValueKind::kScalar: h.Add(static_cast<uint64_t>(v.scalar_dtype)); break;
      case ValueKind::kTensorList:
        h.Add(v.tensors.size());
        for (const TensorInfo& t : v.tensors) MixShape(h, t);
        break;
      case ValueKind::kNone: break;
    }
  }
  h.Add(d.outputs.size());
  for (const TensorInfo& t : d.outputs) MixShape(h, t);
  return (uint64_t{LooseKey(d)} << 32) | static_cast<uint32_t>(h.Digest64());
}

uint64_t WithSite(uint64_t siteless, uint64_t site) {
  Hasher h;
  h.Add(siteless);
  h.Add(site);
  return h.Digest64();
}

}  // namespace

uint64_t StructuralKey(const OpDetail& d, uint64_t boundary) {
  return WithSite(SitelessKey(d), boundary != 0 ? boundary : d.site);
}

Fp128 OutputDigest(const std::vector<TensorInfo>& outputs) {
  Hasher h;
  h.Add(outputs.size());
  for (const TensorInfo& t : outputs) {
    h.Add(t.fingerprint.lo);
    h.Add(t.fingerprint.hi);
  }
  return h.Digest128();
}

Fp128 InputDigest(const std::vector<InputValue>& inputs) {
  Hasher h;
  h.Add(inputs.size());
  for (const InputValue& v : inputs) {
    h.Add(static_cast<uint64_t>(v.kind));
    switch (v.kind) {
      case ValueKind::kTensor:
        h.Add(v.tensor.fingerprint.lo);
        h.Add(v.tensor.fingerprint.hi);
        break;
      case ValueKind::kScalar: h.Add(v.scalar_bits); break;
      case ValueKind::kTensorList:
        h.Add(v.tensors.size());
        for (const TensorInfo& t : v.tensors) {
          h.Add(t.fingerprint.lo);
          h.Add(t.fingerprint.hi);
        }
        break;
      case ValueKind::kNone: break;
    }
  }
  return h.Digest128();
}

namespace {

void AddText(Hasher& h, std::string_view text) {
  h.Add(text.size());
  for (size_t i = 0; i < text.size(); i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, text.data() + i, std::min<size_t>(8, text.size() - i));
    h.Add(word);
  }
}

}  // namespace

std::string_view TrimmedLine(std::string_view s) {
  const char* space = " \t\r\n\f\v";
  const size_t first = s.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

uint64_t BoundaryId(std::string_view file_path, std::string_view function, uint32_t line,
                    std::string_view line_text) {
  const size_t slash = file_path.find_last_of('/');
  Hasher h;
  AddText(h, slash == std::string_view::npos ? file_path : file_path.substr(slash + 1));
  AddText(h, function);
  const std::string_view text = TrimmedLine(line_text);
  if (text.empty()) {
    h.Add(0);
    h.Add(line);
  } else {
    h.Add(1);
    AddText(h, text);
  }
  return h.Digest64() | 1;  // never 0: 0 means "no boundary, use the site id"
}

OpEventCore MakeOpEventCore(const OpDetail& d) {
  OpEventCore c;
  c.op_index = d.op_index;
  c.step = d.step;
  c.name = d.name;
  c.site = d.site;
  c.siteless_key = SitelessKey(d);
  c.outputs = OutputDigest(d.outputs);
  c.inputs = InputDigest(d.inputs);
  c.flags = (d.nondeterministic ? OpEvent::kNondeterministic : 0) |
            (d.replicated ? OpEvent::kReplicated : 0) | (d.trusted ? OpEvent::kTrusted : 0);
  return c;
}

OpEvent ToOpEvent(const OpEventCore& c, uint64_t boundary) {
  OpEvent e;
  e.op_index = c.op_index;
  e.step = c.step;
  e.name = c.name;
  e.site = c.site;
  e.key = WithSite(c.siteless_key, boundary != 0 ? boundary : c.site);
  e.loose_key = static_cast<uint32_t>(c.siteless_key >> 32);
  e.outputs = c.outputs;
  e.inputs = c.inputs;
  e.flags = c.flags;
  return e;
}

OpEvent MakeOpEvent(const OpDetail& d, uint64_t boundary) {
  return ToOpEvent(MakeOpEventCore(d), boundary);
}

std::optional<std::string> StringTable::String(uint64_t id) const {
  auto it = strings_.find(id);
  if (it == strings_.end()) return std::nullopt;
  return it->second;
}

std::optional<StringResolver::Site> StringTable::SiteOf(uint64_t site_id) const {
  auto it = sites_.find(site_id);
  if (it == sites_.end()) return std::nullopt;
  return it->second;
}

size_t InMemoryDetails::KeyHash::operator()(const std::tuple<uint32_t, uint32_t, uint64_t>& k) const {
  Hasher h;
  h.Add(std::get<0>(k));
  h.Add(std::get<1>(k));
  h.Add(std::get<2>(k));
  return static_cast<size_t>(h.Digest64());
}

void InMemoryDetails::Add(uint32_t rank, OpDetail d) {
  auto key = std::make_tuple(rank, d.lane, d.op_index);
  ops_[key] = std::move(d);
}

std::optional<OpDetail> InMemoryDetails::Find(uint32_t rank, uint32_t lane, uint64_t op_index) const {
  auto it = ops_.find(std::make_tuple(rank, lane, op_index));
  if (it == ops_.end()) return std::nullopt;
  return it->second;
}

}  // namespace opguard::aligner
