#include "opguard/daemon/testing/batch_maker.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "opguard/daemon/client.h"
#include "opguard/idl/envelope.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace opguard::daemon::testing {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr int kOpKinds = 7;
const char* kOpNames[kOpKinds] = {"aten::linear", "aten::gelu",   "aten::add",       "aten::layer_norm",
                                  "aten::matmul", "aten::softmax", "aten::index_put_"};
constexpr uint64_t kFileId = 0xF11E;
constexpr uint64_t kFunctionId = 0xF0F0;
uint64_t SiteId(int kind) { return 0x5100 + kind; }
uint64_t KernelId() { return 0x4B4B; }

flatbuffers::Offset<wire::TensorSig> Tensor(flatbuffers::FlatBufferBuilder& b, uint64_t seed) {
  int64_t shape[2] = {static_cast<int64_t>(64 + seed % 4), 1024};
  auto shape_v = b.CreateVector(shape, 2);
  const double v = static_cast<double>(seed % 1000) / 7.0;
  auto stats = wire::CreateTensorStats(b, 0, 0, -v, v, v * 3, v * 11);
  wire::Fp128 fp(Mix(seed), Mix(seed ^ 0xabcdef));
  wire::TensorSigBuilder t(b);
  t.add_fingerprint(&fp);
  t.add_dtype(wire::DType::BFloat16);
  t.add_shape(shape_v);
  t.add_stats(stats);
  t.add_device(0);
  return t.Finish();
}

}  // namespace

uint64_t OpNameId(uint64_t op_index) { return 0x1000 + op_index % kOpKinds; }
std::string OpName(uint64_t op_index) { return kOpNames[op_index % kOpKinds]; }

std::string MakeBatch(const std::string& run, uint32_t rank, uint64_t session, uint64_t seq,
                      uint64_t first_op, uint32_t n_ops, const BatchOptions& o) {
  flatbuffers::FlatBufferBuilder b(n_ops * 400 + 1024);
  // Every scalar is written even when it equals its default, so that
  // PatchBatch can rewrite seq and op indices in place.
  b.ForceDefaults(true);
  auto run_s = b.CreateString(run);
  flatbuffers::Offset<wire::RunAnnounce> announce = 0;
  if (o.announce) {
    std::vector<flatbuffers::Offset<wire::KeyValue>> det = {
        wire::CreateKeyValue(b, b.CreateString("cublas_workspace_config"), b.CreateString(":4096:8")),
        wire::CreateKeyValue(b, b.CreateString("deterministic_algorithms"), b.CreateString("true")),
    };
    for (const auto& [key, value] : o.determinism) {
      det.push_back(wire::CreateKeyValue(b, b.CreateString(key), b.CreateString(value)));
    }
    announce = wire::CreateRunAnnounce(b, b.CreateString("job-42"), rank % 8, o.world_size,
                                       b.CreateString("node-a"), 1000 + rank, b.CreateString("loadgen"), 0,
                                       b.CreateVectorOfSortedTables(&det), 0, 1700000000000000000ull);
  }
  std::vector<flatbuffers::Offset<wire::SourceFile>> sources;
  std::vector<flatbuffers::Offset<wire::StringDef>> source_names;
  for (const auto& [path, text] : o.sources) {
    const uint64_t id = XXH64(path.data(), path.size(), 0);
    source_names.push_back(wire::CreateStringDef(b, id, b.CreateString(path)));
    sources.push_back(wire::CreateSourceFile(
        b, id, b.CreateVector(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
  }
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::StringDef>>> strings = 0;
  if (!o.definitions && !source_names.empty()) strings = b.CreateVector(source_names);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::SiteDef>>> sites = 0;
  if (o.definitions) {
    std::vector<flatbuffers::Offset<wire::StringDef>> s;
    for (int k = 0; k < kOpKinds; ++k) s.push_back(wire::CreateStringDef(b, OpNameId(k), b.CreateString(kOpNames[k])));
    s.push_back(wire::CreateStringDef(b, kFileId, b.CreateString("train.py")));
    s.push_back(wire::CreateStringDef(b, kFunctionId, b.CreateString("forward")));
    s.push_back(wire::CreateStringDef(b, KernelId(), b.CreateString("ampere_bf16_gemm")));
    s.insert(s.end(), source_names.begin(), source_names.end());
    strings = b.CreateVector(s);
    std::vector<flatbuffers::Offset<wire::SiteDef>> t;
    for (int k = 0; k < kOpKinds; ++k) t.push_back(wire::CreateSiteDef(b, SiteId(k), kFileId, 100 + k, kFunctionId));
    sites = b.CreateVector(t);
  }
  std::vector<flatbuffers::Offset<wire::OpRecord>> ops;
  std::vector<flatbuffers::Offset<wire::StepMark>> steps;
  std::vector<flatbuffers::Offset<wire::CollectiveRecord>> collectives;
  ops.reserve(n_ops);
  for (uint32_t i = 0; i < n_ops; ++i) {
    const uint64_t op = first_op + i;
    const uint64_t seed = Mix(op * 131 + rank);
    std::vector<flatbuffers::Offset<wire::Value>> inputs;
    for (uint32_t k = 0; k < o.inputs; ++k) {
      auto t = Tensor(b, seed + k);
      wire::ValueBuilder vb(b);
      vb.add_kind(wire::ValueKind::Tensor);
      vb.add_tensor(t);
      inputs.push_back(vb.Finish());
    }
    {
      wire::ValueBuilder vb(b);
      vb.add_kind(wire::ValueKind::Scalar);
      vb.add_scalar_bits(1077936128);
      vb.add_scalar_dtype(wire::DType::Float32);
      inputs.push_back(vb.Finish());
    }
    auto inputs_v = b.CreateVector(inputs);
    std::vector<flatbuffers::Offset<wire::TensorSig>> outputs;
    for (uint32_t k = 0; k < o.outputs; ++k) outputs.push_back(Tensor(b, seed + 100 + k));
    auto outputs_v = b.CreateVector(outputs);
    uint64_t kernel = KernelId();
    auto kernels_v = b.CreateVector(&kernel, 1);
    wire::OpRecordBuilder ob(b);
    ob.add_lane(0);
    ob.add_op_index(op);
    ob.add_step(op / 1000);
    ob.add_name(OpNameId(op));
    ob.add_site(SiteId(static_cast<int>(op % kOpKinds)));
    ob.add_inputs(inputs_v);
    ob.add_outputs(outputs_v);
    ob.add_kernels(kernels_v);
    ob.add_start_ns(1700000000000000000ull + op * 1000);
    ob.add_duration_ns(500 + op % 100);
    ops.push_back(ob.Finish());
    if (o.steps_every && op % o.steps_every == 0) {
      steps.push_back(wire::CreateStepMark(b, op / o.steps_every, 0, op, 1700000000000000000ull + op * 1000));
    }
    if (o.collectives_every && op % o.collectives_every == 0) {
      auto outs = b.CreateVector(std::vector<flatbuffers::Offset<wire::TensorSig>>{Tensor(b, op)});
      wire::CollectiveRecordBuilder cb(b);
      cb.add_communicator(0xC0FFEE);
      cb.add_seq(op / o.collectives_every);
      cb.add_phase(wire::CollectivePhase::Completed);
      cb.add_kind(wire::CollectiveKind::AllReduce);
      cb.add_dtype(wire::DType::BFloat16);
      cb.add_count(65536);
      cb.add_outputs(outs);
      cb.add_op_index(op);
      collectives.push_back(cb.Finish());
    }
  }
  std::vector<flatbuffers::Offset<wire::GapNotice>> gaps;
  for (const auto& [first, last] : o.gaps) {
    gaps.push_back(wire::CreateGapNotice(b, 0, first, last, last - first + 1, b.CreateString("buffer full")));
  }
  auto batch = wire::CreateBatch(b, run_s, rank, session, seq, announce, strings, sites, 0, b.CreateVector(ops),
                                 collectives.empty() ? 0 : b.CreateVector(collectives),
                                 steps.empty() ? 0 : b.CreateVector(steps),
                                 sources.empty() ? 0 : b.CreateVector(sources),
                                 gaps.empty() ? 0 : b.CreateVector(gaps), o.end_of_run);
  if (o.schema_major == 0) {
    wire::FinishEnvelope(b, batch);
  } else {
    wire::Version version(o.schema_major, 0);
    b.Finish(wire::CreateEnvelope(b, &version, wire::Message::Batch, batch.Union()), wire::EnvelopeIdentifier());
  }
  return std::string(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
}

namespace {
template <typename T>
void Patch(const void* table, flatbuffers::voffset_t field, T value) {
  auto* t = reinterpret_cast<flatbuffers::Table*>(const_cast<void*>(table));
  t->SetField<T>(field, value, T());
}
}  // namespace

void PatchBatch(std::string* bytes, uint64_t seq, uint64_t first_op) {
  auto* env = wire::GetEnvelope(bytes->data());
  const auto* batch = env->message_as_Batch();
  const uint64_t old_first = batch->ops() && batch->ops()->size() ? batch->ops()->Get(0)->op_index() : 0;
  const uint64_t delta = first_op - old_first;
  Patch<uint64_t>(batch, wire::Batch::VT_SEQ, seq);
  if (batch->ops()) {
    for (const auto* op : *batch->ops()) {
      Patch<uint64_t>(op, wire::OpRecord::VT_OP_INDEX, op->op_index() + delta);
      Patch<uint64_t>(op, wire::OpRecord::VT_STEP, (op->op_index()) / 1000);
    }
  }
  if (batch->collectives()) {
    for (const auto* c : *batch->collectives()) {
      Patch<uint64_t>(c, wire::CollectiveRecord::VT_OP_INDEX, c->op_index() + delta);
      Patch<uint64_t>(c, wire::CollectiveRecord::VT_SEQ, c->seq() + delta);
    }
  }
  if (batch->steps()) {
    for (const auto* s : *batch->steps()) {
      Patch<uint64_t>(s, wire::StepMark::VT_OP_INDEX, s->op_index() + delta);
      Patch<uint64_t>(s, wire::StepMark::VT_STEP, s->step() + delta);
    }
  }
}

// ---- RankSender -------------------------------------------------------------------

RankSender::RankSender(std::string endpoint, std::string run, uint32_t rank, uint64_t session,
                       uint32_t ops_per_batch, BatchOptions options)
    : endpoint_(std::move(endpoint)),
      run_(std::move(run)),
      rank_(rank),
      session_(session),
      ops_per_batch_(ops_per_batch),
      options_(std::move(options)) {
  context_ = new zmq::context_t(1);
}

RankSender::~RankSender() { delete static_cast<zmq::context_t*>(context_); }

std::string RankSender::MakeSeq(uint64_t seq) const {
  if (options_.reuse_template && seq > 0) {
    // Cheap senders for measuring the daemon: one template, patched.
    if (template_.empty()) template_ = MakeBatch(run_, rank_, session_, 1, ops_per_batch_, ops_per_batch_, options_);
    std::string bytes = template_;
    PatchBatch(&bytes, seq, seq * ops_per_batch_);
    return bytes;
  }
  BatchOptions o = options_;
  o.announce = o.definitions = (seq == 0);
  return MakeBatch(run_, rank_, session_, seq, seq * ops_per_batch_, ops_per_batch_, o);
}

Status RankSender::Run(uint64_t batches, std::chrono::steady_clock::time_point deadline, uint32_t window,
                       uint64_t stop_after_acks, std::chrono::milliseconds resend_after) {
  using Clock = std::chrono::steady_clock;
  zmq::socket_t socket(*static_cast<zmq::context_t*>(context_), zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::sndhwm, 100000);
  socket.set(zmq::sockopt::reconnect_ivl, 50);
  socket.set(zmq::sockopt::reconnect_ivl_max, 200);
  socket.connect(endpoint_);
  std::map<uint64_t, Clock::time_point> in_flight;  // seq -> last send
  std::map<uint64_t, std::string> cache;            // unacked bytes
  uint64_t next = 0;
  while (acked_.size() < batches) {
    if (stop_after_acks && acked_.size() >= stop_after_acks) return Status::Ok();
    const auto now = Clock::now();
    if (abort_) {
      abort_ = false;
      return Unavailable("aborted");
    }
    if (now > deadline) {
      return Unavailable("rank " + std::to_string(rank_) + ": " + std::to_string(acked_.size()) + "/" +
                         std::to_string(batches) + " batches acked before the deadline");
    }
    while (next < batches && in_flight.size() < window) {
      if (acked_.count(next)) {
        ++next;
        continue;
      }
      auto& bytes = cache[next];
      if (bytes.empty()) bytes = MakeSeq(next);
      if (!socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) break;
      in_flight[next] = now;
      ++next;
    }
    for (auto& [seq, sent] : in_flight) {
      if (now - sent > resend_after) {
        if (socket.send(zmq::buffer(cache[seq]), zmq::send_flags::dontwait)) sent = now;
      }
    }
    zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(50));
    zmq::message_t reply;
    while (socket.recv(reply, zmq::recv_flags::dontwait)) {
      auto env = wire::OpenEnvelope(reply.data(), reply.size());
      if (!env.ok()) continue;
      const auto* ack = (*env)->message_as_Ack();
      if (ack == nullptr || ack->session() != session_) continue;
      if (ack->code() == wire::AckCode::Retry) {
        // Kept, sent again after resend_after, as the shim does.
        ++retried_;
        if (auto it = in_flight.find(ack->seq()); it != in_flight.end()) it->second = Clock::now();
        continue;
      }
      if (ack->code() == wire::AckCode::Rejected) ++rejected_;
      acked_.insert(ack->seq());
      in_flight.erase(ack->seq());
      cache.erase(ack->seq());
    }
  }
  return Status::Ok();
}

Result<std::string> SendRaw(const std::string& endpoint, const std::string& frame,
                            std::chrono::milliseconds timeout) {
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, static_cast<int>(timeout.count()));
  socket.set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
  socket.connect(endpoint);
  if (!socket.send(zmq::buffer(frame), zmq::send_flags::none)) return Unavailable("send timed out");
  zmq::message_t reply;
  if (!socket.recv(reply, zmq::recv_flags::none)) return Unavailable("no reply within timeout");
  return std::string(static_cast<const char*>(reply.data()), reply.size());
}

std::string DescribeAck(const std::string& bytes) {
  auto env = wire::OpenEnvelope(bytes.data(), bytes.size());
  if (!env.ok()) return "bad reply: " + env.status().message();
  const auto* ack = (*env)->message_as_Ack();
  if (ack == nullptr) return "not an ack";
  if (ack->code() == wire::AckCode::Durable) return "durable";
  if (ack->code() == wire::AckCode::Retry) return "retry: " + (ack->error() ? ack->error()->str() : std::string());
  return "rejected: " + (ack->error() ? ack->error()->str() : std::string());
}

// ---- TempDir / DaemonProcess -------------------------------------------------------

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "opguardd-test-XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  path_ = made ? made : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
}

DaemonProcess::DaemonProcess(std::string binary, std::string dir, std::vector<std::string> extra_args)
    : binary_(std::move(binary)), dir_(std::move(dir)), args_(std::move(extra_args)) {
  log_ = dir_ + "/opguardd.log";
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) Kill9();
}

Status DaemonProcess::Start(std::chrono::milliseconds timeout) {
  std::vector<std::string> argv_s = {binary_, "--local", dir_, "--http", "127.0.0.1:0"};
  argv_s.insert(argv_s.end(), args_.begin(), args_.end());
  pid_ = ::fork();
  if (pid_ < 0) return Internal("fork failed");
  if (pid_ == 0) {
    std::FILE* log = std::fopen(log_.c_str(), "a");
    if (log) {
      ::dup2(fileno(log), 1);
      ::dup2(fileno(log), 2);
    }
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(binary_.c_str(), argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::steady_clock::time_point http_wait_until{};
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Unavailable("opguardd exited during startup (see " + log_ + ")");
    }
    DaemonClient client(query(), std::chrono::milliseconds(300));
    auto answer = client.Status();
    if (answer.ok()) {
      const auto* st = answer->envelope()->message_as_StatusAnswer();
      if (st && st->http()) http_ = st->http()->str();
      // Queries answer before HTTP is up: wait (a while) for its address too.
      if (http_wait_until == std::chrono::steady_clock::time_point{}) {
        http_wait_until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      }
      if (!http_.empty() || std::chrono::steady_clock::now() > http_wait_until) return Status::Ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Kill9();
  return Unavailable("opguardd did not answer within the startup timeout (see " + log_ + ")");
}

int DaemonProcess::Stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::steady_clock::time_point http_wait_until{};
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Kill9();
  return -1;
}

void DaemonProcess::Kill9() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

bool DaemonProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

namespace {
// A "Vm...:   123 kB" line of /proc/PID/status, in bytes.
uint64_t StatusBytes(pid_t pid, const std::string& field) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size())) * 1024;
  }
  return 0;
}
}  // namespace

uint64_t DaemonProcess::PeakRssBytes() const { return StatusBytes(pid_, "VmHWM:"); }
uint64_t DaemonProcess::RssBytes() const { return StatusBytes(pid_, "VmRSS:"); }

double ProcessCpuSeconds(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// ---- HTTP / commands -----------------------------------------------------------------

int ConnectTcp(const std::string& host_port) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

Result<HttpResult> HttpGet(const std::string& host_port, const std::string& target,
                           std::chrono::milliseconds timeout, const std::string& extra_headers,
                           const std::string& from) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("bad address " + host_port);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal("socket failed");
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  if (!from.empty() && (::inet_pton(AF_INET, from.c_str(), &local.sin_addr) != 1 ||
                        ::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0)) {
    ::close(fd);
    return Unavailable("cannot connect from " + from);
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return Unavailable("cannot connect to " + host_port);
  }
  std::string request = "GET " + target + " HTTP/1.1\r\nHost: " + host_port + "\r\n" + extra_headers +
                        "Connection: close\r\n\r\n";
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  auto header_end = response.find("\r\n\r\n");
  if (response.size() < 12 || header_end == std::string::npos) return DataLoss("short HTTP response");
  HttpResult result;
  result.status = std::stoi(response.substr(9, 3));
  result.headers = response.substr(0, header_end);
  result.body = response.substr(header_end + 4);
  return result;
}

CommandResult RunCommand(const std::string& command, int timeout_s) {
  CommandResult result;
  std::string line = "timeout -k 5 " + std::to_string(timeout_s) + " sh -c '" + command + "' 2>&1";
  std::FILE* pipe = ::popen(line.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace opguard::daemon::testing
