// `opguard fingerprint --dtype DTYPE --shape D0,D1,... FILE [--json]`: the
// fingerprint of a raw little-endian tensor dump, as the shim would record it.
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cli/command.h"
#include "opguard/fingerprint/fingerprint.h"

namespace opguard::cli {
namespace {

namespace fp = ::opguard::fingerprint;

constexpr std::string_view kUsage =
    "fingerprint --dtype DTYPE --shape D0,D1,... FILE [--json] [--threads N]";

int Fail(const std::string& message) {
  std::fprintf(stderr, "opguard fingerprint: %s\n", message.c_str());
  return 1;
}

// "" is rank 0 (a scalar); otherwise comma-separated non-negative integers.
bool ParseShape(std::string_view text, std::vector<int64_t>* shape) {
  shape->clear();
  if (text.empty() || text == "-") return true;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view part = text.substr(0, comma);
    int64_t d = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), d);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || d < 0) {
      return false;
    }
    shape->push_back(d);
    if (comma == std::string_view::npos) return true;
    text.remove_prefix(comma + 1);
  }
}

// JSON numbers cannot be NaN/Inf; the statistics never are (finite values only).
std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

int Run(int argc, char** argv) {
  std::string dtype_text, shape_text, path;
  bool have_dtype = false, have_shape = false, json = false;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: opguard %.*s\n", static_cast<int>(kUsage.size()), kUsage.data());
      return 0;
    } else if (arg == "--dtype") {
      if (!value(&dtype_text)) return Fail("--dtype needs a value");
      have_dtype = true;
    } else if (arg == "--shape") {
      if (!value(&shape_text)) return Fail("--shape needs a value");
      have_shape = true;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--threads") {
      std::string t;
      if (!value(&t)) return Fail("--threads needs a value");
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), threads);
      if (ec != std::errc() || end != t.data() + t.size() || threads < 0) {
        return Fail("bad --threads '" + t + "'");
      }
    } else if (arg.starts_with("--")) {
      return Fail("unknown option '" + std::string(arg) + "' (usage: opguard " +
                  std::string(kUsage) + ")");
    } else if (path.empty()) {
      path = arg;
    } else {
      return Fail("more than one FILE given");
    }
  }
  if (!have_dtype || !have_shape || path.empty()) {
    return Fail("usage: opguard " + std::string(kUsage));
  }
  fp::DType dtype{};
  if (!fp::ParseDType(dtype_text, &dtype)) return Fail("unknown dtype '" + dtype_text + "'");
  std::vector<int64_t> shape;
  if (!ParseShape(shape_text, &shape)) {
    return Fail("bad shape '" + shape_text + "' (want D0,D1,... of non-negative integers)");
  }
  const int64_t numel = fp::NumElements(shape);
  int64_t want = 0;
  if (numel < 0 ||
      __builtin_mul_overflow(numel, static_cast<int64_t>(fp::DTypeSize(dtype)), &want)) {
    return Fail("shape '" + shape_text + "' is too large");
  }

  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Fail("cannot open '" + path + "': " + std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) {
    bytes.insert(bytes.end(), chunk, chunk + got);
    if (bytes.size() > static_cast<uint64_t>(want)) break;  // already too big; stop reading
  }
  const bool read_error = std::ferror(f);
  std::fclose(f);
  if (read_error) return Fail("cannot read '" + path + "'");
  if (bytes.size() != static_cast<uint64_t>(want)) {
    return Fail("'" + path + "' has " +
                (bytes.size() > static_cast<uint64_t>(want) ? "more than " + std::to_string(want)
                                                            : std::to_string(bytes.size())) +
                " bytes, but shape [" + shape_text + "] of " + std::string(fp::DTypeName(dtype)) +
                " needs " + std::to_string(want));
  }

  const fp::TensorView view{bytes.data(), dtype, shape, {}};
  const fp::Fingerprint result = fp::FingerprintHost(view, threads);
  if (!json) {
    std::printf("%s\n", result.digest.Hex().c_str());
    return 0;
  }
  std::string shape_json;
  for (size_t i = 0; i < shape.size(); ++i) shape_json += (i ? "," : "") + std::to_string(shape[i]);
  const fp::Stats& s = result.stats;
  std::printf(
      "{\"fingerprint\":\"%s\",\"dtype\":\"%s\",\"shape\":[%s],\"bytes\":%lld,"
      "\"stats\":{\"nan_count\":%llu,\"inf_count\":%llu,\"min\":%s,\"max\":%s,\"sum\":%s,"
      "\"l2\":%s}}\n",
      result.digest.Hex().c_str(), std::string(fp::DTypeName(dtype)).c_str(), shape_json.c_str(),
      static_cast<long long>(want), static_cast<unsigned long long>(s.nan_count),
      static_cast<unsigned long long>(s.inf_count), Number(s.min).c_str(), Number(s.max).c_str(),
      Number(s.sum).c_str(), Number(s.l2).c_str());
  return 0;
}

}  // namespace

OPGUARD_CLI_COMMAND(fingerprint, "fingerprint", kUsage,
                    "print the 128-bit fingerprint of a raw tensor file", Run);

}  // namespace opguard::cli
