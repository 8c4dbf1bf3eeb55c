#include "fuzz_daemon.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "opguard/common/log.h"
#include "opguard/daemon/testing/batch_maker.h"

namespace opguard::daemon::fuzz {
namespace {

// RocksDB in memory-backed storage where there is some: every group commit
// is an fsync.
std::string MakeTempDir() {
  std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
  std::string pattern = base + "/opguard-fuzz-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) Fail("mkdtemp " + pattern + " failed");
  return pattern;
}

}  // namespace

void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz harness: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

bool IsSeedRun(std::string_view name) {
  for (const char* seed : kSeedRuns) {
    if (name == seed) return true;
  }
  return false;
}

std::vector<std::string> SeedBatches() {
  using testing::BatchOptions;
  using testing::MakeBatch;
  std::vector<std::string> out;
  BatchOptions first;
  first.announce = true;
  first.definitions = true;
  first.world_size = 2;
  first.steps_every = 8;
  first.collectives_every = 4;
  first.sources = {{"train.py", "import torch\nmodel = torch.nn.Linear(4, 4)\n"}};
  BatchOptions later;
  later.steps_every = 8;
  later.collectives_every = 4;
  BatchOptions last = later;
  last.end_of_run = true;
  for (const char* run : {"ref", "sus"}) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      out.push_back(MakeBatch(run, rank, 7, 0, 0, 16, first));
      BatchOptions middle = later;
      // The suspect's rank 1 reports ops 20..23 missing: a gap in the diff.
      if (std::string_view(run) == "sus" && rank == 1) middle.gaps = {{20, 23}};
      out.push_back(MakeBatch(run, rank, 7, 1, 16, 16, middle));
      out.push_back(MakeBatch(run, rank, 7, 2, 32, 8, last));
    }
  }
  // Rank 0 of four: the others never sent anything.
  BatchOptions wide = first;
  wide.world_size = 4;
  out.push_back(MakeBatch("solo", 0, 9, 0, 0, 12, wide));
  return out;
}

FuzzDaemon::FuzzDaemon(std::vector<std::string> peers) : dir_(MakeTempDir()) {
  SetLogLevel(LogLevel::kError);
  config_.data_dir = dir_ + "/data";
  config_.ingest = "inproc://opguard-fuzz-ingest";
  config_.listen = "";
  config_.query_socket = "";
  config_.http = "127.0.0.1:0";
  // The corpus' requests say "Host: x": a name of this daemon, so they reach
  // the routes (other names are answered 421 before routing).
  config_.http_host_names = {"x"};
  config_.socket_group = "";
  config_.peers = std::move(peers);
  // Small memtables and cache: the harnesses write little.
  config_.write_buffer_bytes = 4u << 20;
  config_.memtable_budget_bytes = 16u << 20;
  config_.block_cache_bytes = 8u << 20;
  auto store = Store::Open(config_);
  if (!store.ok()) Fail("store: " + store.status().message());
  store_ = std::move(store).value();
  ingest_ = std::make_unique<Ingest>(config_, store_.get(), &registry_, &metrics_, &context_);
  if (Status st = ingest_->Start(); !st.ok()) Fail("ingest: " + st.message());
  service_ = std::make_unique<QueryService>(config_, store_.get(), &registry_, ingest_.get(), &metrics_);
  service_->SetApiRouter([this](const std::string& target,
                                 const CancelToken* cancel) -> std::pair<int, std::string> {
    if (!IsForwardableApiRoute(target)) return {400, R"({"error":"not a JSON API route peers answer"})"};
    HttpResponse r = RouteHttp("GET", target, service_.get(), &metrics_, store_.get(), {}, cancel);
    return {r.status, std::move(r.body)};
  });
  http_ = std::make_unique<HttpServer>(&io_, service_.get(), &metrics_, store_.get(), std::string());
  if (Status st = http_->Start(config_.http); !st.ok()) Fail("http: " + st.message());
  http_address_ = http_->address();
  service_->SetHttpAddress(http_address_);
  io_thread_ = std::thread([this] { io_.run(); });

  sender_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
  sender_->set(zmq::sockopt::linger, 0);
  sender_->connect(config_.ingest);
  for (const std::string& batch : SeedBatches()) {
    auto ack = SendBatch(batch);
    if (!ack || testing::DescribeAck(*ack) != "durable") Fail("a seed batch was not acknowledged as durable");
  }
}

FuzzDaemon::~FuzzDaemon() {
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
  http_.reset();
  service_->StopAligner();
  sender_.reset();
  ingest_->Stop();
  (void)store_->Close();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::optional<std::string> FuzzDaemon::SendBatch(std::string_view message, std::chrono::milliseconds timeout) {
  sender_->send(zmq::const_buffer(message.data(), message.size()), zmq::send_flags::none);
  zmq::pollitem_t item{static_cast<void*>(*sender_), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
  zmq::message_t ack;
  if (!sender_->recv(ack, zmq::recv_flags::none)) return std::nullopt;
  return ack.to_string();
}

Status FuzzDaemon::DeleteRun(const std::string& name) {
  return ingest_->DeleteRun(name, std::chrono::seconds(20));
}

}  // namespace opguard::daemon::fuzz
