// `opguard fingerprint --dtype DTYPE --shape D0,D1,... FILE [--json]`: the
// fingerprint of a raw little-endian tensor dump, as the shim would record it.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cli/command.h"
#include "opguard/fingerprint/fingerprint.h"

namespace opguard::cli {
namespace {

namespace fp = ::opguard::fingerprint;

int Fail(const std::string& message) {
  std::fprintf(stderr, "opguard fingerprint: %s\n", message.c_str());
  return 1;
}

// "" is rank 0 (a scalar); otherwise comma-separated non-negative integers.
// Hand-written: CLI11's list options have no empty (scalar) form.
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

struct Args {
  std::string dtype_text, shape_text, path;
  bool json = false;
  int threads = 0;
};

int Run(const Args& args) {
  fp::DType dtype{};
  if (!fp::ParseDType(args.dtype_text, &dtype))
    return Fail("unknown dtype '" + args.dtype_text + "'");
  std::vector<int64_t> shape;
  if (!ParseShape(args.shape_text, &shape)) {
    return Fail("bad shape '" + args.shape_text + "' (want D0,D1,... of non-negative integers)");
  }
  const int64_t numel = fp::NumElements(shape);
  int64_t want = 0;
  if (numel < 0 ||
      __builtin_mul_overflow(numel, static_cast<int64_t>(fp::DTypeSize(dtype)), &want)) {
    return Fail("shape '" + args.shape_text + "' is too large");
  }

  FILE* f = std::fopen(args.path.c_str(), "rb");
  if (!f) return Fail("cannot open '" + args.path + "': " + std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) {
    bytes.insert(bytes.end(), chunk, chunk + got);
    if (bytes.size() > static_cast<uint64_t>(want)) break;  // already too big; stop reading
  }
  const bool read_error = std::ferror(f);
  std::fclose(f);
  if (read_error) return Fail("cannot read '" + args.path + "'");
  if (bytes.size() != static_cast<uint64_t>(want)) {
    return Fail("'" + args.path + "' has " +
                (bytes.size() > static_cast<uint64_t>(want) ? "more than " + std::to_string(want)
                                                            : std::to_string(bytes.size())) +
                " bytes, but shape [" + args.shape_text + "] of " +
                std::string(fp::DTypeName(dtype)) + " needs " + std::to_string(want));
  }

  const fp::TensorView view{bytes.data(), dtype, shape, {}};
  const fp::Fingerprint result = fp::FingerprintHost(view, args.threads);
  if (!args.json) {
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

std::function<int()> Add(CLI::App& cmd, const DaemonArgs& top) {
  auto args = std::make_shared<Args>();
  cmd.add_option("--dtype", args->dtype_text, "element type, e.g. float32, bfloat16, int64")
      ->option_text("DTYPE")
      ->required();
  cmd.add_option("--shape", args->shape_text, "dimensions D0,D1,... (\"\" or - for a scalar)")
      ->option_text("D0,D1,...")
      ->required();
  cmd.add_option("FILE", args->path, "raw little-endian tensor dump")->required();
  cmd.add_flag("--json", args->json, "print the fingerprint and statistics as JSON");
  cmd.add_option("--threads", args->threads, "worker threads (default 0: every core)")
      ->option_text("N")
      ->check(CLI::NonNegativeNumber);
  cmd.preparse_callback([args, &top](size_t) { args->json = top.json; });
  return [args] { return Run(*args); };
}

}  // namespace

OPGUARD_CLI_COMMAND(fingerprint, "fingerprint",
                    "print the 128-bit fingerprint of a raw tensor file", &Add);

}  // namespace opguard::cli
