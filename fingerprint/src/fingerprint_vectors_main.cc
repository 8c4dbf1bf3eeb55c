// Prints fingerprint/testdata/vectors.txt. Run only after an intended change of the
// specification (docs/fingerprint.md); the unit tests and the GPU check read
// the committed file.
//   fingerprint_vectors > fingerprint/testdata/vectors.txt
#include <cstdio>

#include "fingerprint_vectors.h"
#include "opguard/fingerprint/fingerprint.h"

int main() {
  using namespace opguard::fingerprint;
  std::printf(
      "# OpGuard fingerprint test vectors (docs/fingerprint.md, \"Test vectors\").\n"
      "# seed dtype shape(- = rank 0) digest; bytes = SplitMix64(seed) stream, little-endian.\n");
  for (auto v : testgen::VectorInputs()) {
    const auto bytes = testgen::VectorBytes(v);
    DType dtype{};
    ParseDType(v.dtype, &dtype);
    TensorView view{bytes.data(), dtype, v.shape, {}};
    std::printf("%llu %s %s %s\n", static_cast<unsigned long long>(v.seed), v.dtype.c_str(),
                testgen::ShapeText(v.shape).c_str(), FingerprintHost(view).digest.Hex().c_str());
  }
  return 0;
}
