// The committed test vectors: which inputs (seed, dtype, shape) make up
// fingerprint/testdata/vectors.txt, and how the file is read and written. Header-only
// so the GPU check (scripts/gpu-check.sh) can build it without CMake.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fingerprint_testgen.h"
#include "opguard/fingerprint/fingerprint.h"

namespace opguard::fingerprint::testgen {

// Every dtype, at sizes around the word (8 B), vector (32 B), key-block
// (2 KiB) and CPU-tile (64 KiB) boundaries, ranks 0 to 4.
inline std::vector<Vector> VectorInputs() {
  std::vector<Vector> out;
  const uint64_t kElems[] = {0,  1,   2,   3,   7,    8,    9,    15,   16,    17,    31,
                             33, 255, 256, 257, 1023, 1024, 1025, 4099, 65537, 262147};
  uint64_t seed = 1;
  for (int d = 1; d <= static_cast<int>(DType::kComplex128); ++d) {
    const auto dtype = static_cast<DType>(d);
    for (uint64_t n : kElems) {
      out.push_back({seed++, std::string(DTypeName(dtype)), {static_cast<int64_t>(n)}, ""});
    }
    out.push_back({seed++, std::string(DTypeName(dtype)), {}, ""});              // rank 0
    out.push_back({seed++, std::string(DTypeName(dtype)), {3, 5, 7}, ""});       // rank 3
    out.push_back({seed++, std::string(DTypeName(dtype)), {2, 0, 4}, ""});       // empty, rank 3
    out.push_back({seed++, std::string(DTypeName(dtype)), {4, 8, 16, 33}, ""});  // rank 4
  }
  return out;
}

inline std::string ShapeText(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s;
}

inline bool ParseShapeText(const std::string& text, std::vector<int64_t>* shape) {
  shape->clear();
  if (text == "-") return true;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) return false;
    shape->push_back(std::stoll(part));
  }
  return true;
}

// Bytes of a vector's tensor: numel(shape) * dtype size, from its seed.
inline std::vector<uint8_t> VectorBytes(const Vector& v) {
  DType dtype{};
  ParseDType(v.dtype, &dtype);
  return Bytes(v.seed, static_cast<uint64_t>(NumElements(v.shape)) * DTypeSize(dtype));
}

inline bool ReadVectors(const std::string& path, std::vector<Vector>* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    Vector v;
    std::string shape;
    if (!(ls >> v.seed >> v.dtype >> shape >> v.hex) || !ParseShapeText(shape, &v.shape)) {
      return false;
    }
    out->push_back(v);
  }
  return true;
}

}  // namespace opguard::fingerprint::testgen
