// `opguard fingerprint --dtype DTYPE --shape D0,D1,... FILE [--json]`: the
// fingerprint of a raw little-endian tensor dump, as the shim would record it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "opguard/common/status.h"
#include "opguard/fingerprint/fingerprint.h"

namespace opguard::cli {
namespace {

namespace fp = ::opguard::fingerprint;

int Fail(const std::string& message) {
  std::fprintf(stderr, "opguard fingerprint: %s\n", message.c_str());
  return kExitError;
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

// The bytes of a tensor file: mapped read-only when it is a regular file (no
// copy, the page cache is read in place), else read once into a buffer of the
// expected size (a pipe). size() is the file's size, or want + 1 when a
// stream holds more than `want` bytes (reading stops there).
class TensorBytes {
 public:
  static Result<TensorBytes> Open(const std::string& path, uint64_t want) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NotFound("cannot open '" + path + "': " + std::strerror(errno));
    TensorBytes out;
    out.fd_ = fd;
    struct stat st{};
    if (::fstat(fd, &st) != 0) return Internal("cannot stat '" + path + "': " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) return InvalidArgument("'" + path + "' is a directory");
    if (S_ISREG(st.st_mode)) {
      out.size_ = static_cast<uint64_t>(st.st_size);
      if (out.size_ == 0 || out.size_ != want) return out;  // nothing to map, or refused anyway
      void* p = ::mmap(nullptr, out.size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
      if (p == MAP_FAILED) return Internal("cannot map '" + path + "': " + std::strerror(errno));
      ::madvise(p, out.size_, MADV_SEQUENTIAL);
      out.map_ = static_cast<const uint8_t*>(p);
      return out;
    }
    // One byte more tells "too long" from "exact"; grown as data arrives, so
    // a huge declared shape over a short stream allocates only what came.
    const uint64_t limit = want + 1;
    while (out.size_ < limit) {
      if (out.size_ == out.buffer_.size()) {
        out.buffer_.resize(std::min<uint64_t>(limit, std::max<uint64_t>(1 << 20, 2 * out.size_)));
      }
      const ssize_t got = ::read(fd, out.buffer_.data() + out.size_, out.buffer_.size() - out.size_);
      if (got == 0) break;
      if (got < 0) {
        if (errno == EINTR) continue;
        return Internal("cannot read '" + path + "': " + std::strerror(errno));
      }
      out.size_ += static_cast<uint64_t>(got);
    }
    return out;
  }

  TensorBytes(TensorBytes&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        map_(std::exchange(o.map_, nullptr)),
        size_(o.size_),
        buffer_(std::move(o.buffer_)) {}
  TensorBytes& operator=(TensorBytes&&) = delete;
  ~TensorBytes() {
    if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
    if (fd_ >= 0) ::close(fd_);
  }

  // Null for an empty tensor (the fingerprint's contract).
  const uint8_t* data() const {
    if (size_ == 0) return nullptr;
    return map_ != nullptr ? map_ : buffer_.data();
  }
  uint64_t size() const { return size_; }

 private:
  TensorBytes() = default;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  std::vector<uint8_t> buffer_;
};

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

  auto bytes = TensorBytes::Open(args.path, static_cast<uint64_t>(want));
  if (!bytes.ok()) return Fail(bytes.status().message());
  if (bytes->size() != static_cast<uint64_t>(want)) {
    return Fail("'" + args.path + "' has " +
                (bytes->size() > static_cast<uint64_t>(want) ? "more than " + std::to_string(want)
                                                             : std::to_string(bytes->size())) +
                " bytes, but shape [" + args.shape_text + "] of " +
                std::string(fp::DTypeName(dtype)) + " needs " + std::to_string(want));
  }

  const fp::TensorView view{bytes->data(), dtype, shape, {}};
  if (!args.json) {  // the digest alone: statistics are only printed with --json
    std::printf("%s\n", fp::DigestHost(view, args.threads).Hex().c_str());
    return 0;
  }
  const fp::Fingerprint result = fp::FingerprintHost(view, args.threads);
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
  cmd.footer("Exit codes: 0 printed; 2 an error (usage, an unreadable file, a size that does not\n"
             "match shape x dtype).");
  return [args] { return Run(*args); };
}

}  // namespace

OPGUARD_CLI_COMMAND(fingerprint, "fingerprint",
                    "print the 128-bit fingerprint of a raw tensor file", &Add);

}  // namespace opguard::cli
