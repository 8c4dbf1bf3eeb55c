#include "opguard/daemon/daemon.h"

#include <utility>  // before Boost.Asio: GCC 12 + C++20 needs it first

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#ifdef OPGUARD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "access/zap_authenticator.h"
#include "ingest/ingest.h"
#include "local/local_dir.h"
#include "metrics.h"
#include "opguard/common/log.h"
#include "query/http_auth.h"
#include "query/http_server.h"
#include "query/web_files.h"
#include "query/query.h"
#include "query/query_server.h"
#include "registry/run_registry.h"
#include "storage/store.h"

namespace opguard::daemon {
namespace asio = boost::asio;

namespace {

void Notify(const std::string& state) {
#ifdef OPGUARD_HAVE_SYSTEMD
  sd_notify(0, state.c_str());  // no-op without NOTIFY_SOCKET
#else
  (void)state;
#endif
}

// Half the watchdog interval systemd asked for, or zero when it asked for none.
std::chrono::microseconds WatchdogPeriod() {
#ifdef OPGUARD_HAVE_SYSTEMD
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) return std::chrono::microseconds(usec / 2);
#endif
  return std::chrono::microseconds(0);
}

// Raises the soft file descriptor limit to the hard one (libzmq aborts when
// it cannot get a descriptor) and returns the limit in effect.
uint64_t RaiseFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur == RLIM_INFINITY ? UINT64_MAX : lim.rlim_cur;
}

// With curve.key_file: the daemon's keypair, and the ZAP handler started
// for the TCP query endpoint (its own key and curve.authorized_keys).
Result<std::optional<CurveKeyPair>> LoadCurve(const Config& c, zmq::context_t* context, Metrics* metrics,
                                              std::unique_ptr<ZapAuthenticator>* zap) {
  if (c.curve_key_file.empty()) {
    if (!c.curve_authorized_keys.empty()) {
      return InvalidArgument("curve.authorized_keys is set but curve.key_file is not: the daemon needs its "
                             "own keypair (opguard keygen) to serve CURVE");
    }
    return std::optional<CurveKeyPair>();
  }
  auto keys = ReadKeyPair(c.curve_key_file);
  if (!keys.ok()) return Status(keys.status().code(), "curve.key_file: " + keys.status().message());
  std::vector<std::string> allowed = {keys->public_key};  // peer daemons share the keypair
  if (!c.curve_authorized_keys.empty()) {
    auto listed = ReadAuthorizedKeys(c.curve_authorized_keys);
    if (!listed.ok()) return Status(listed.status().code(), "curve.authorized_keys: " + listed.status().message());
    allowed.insert(allowed.end(), listed->begin(), listed->end());
  }
  *zap = std::make_unique<ZapAuthenticator>(context, allowed, metrics);
  OPGUARD_RETURN_IF_ERROR((*zap)->Start());
  OPGUARD_LOG(LogLevel::kInfo, "CURVE on TCP queries: " + std::to_string(allowed.size()) + " keys admitted");
  return std::optional<CurveKeyPair>(*keys);
}

// The HTTP token: the file's first line, at least 16 characters.
Result<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token)) return NotFound("cannot read http.token_file " + path);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.size() < 16 || !IsValidToken(token)) {
    return InvalidArgument("http.token_file " + path +
                           ": a token is 16 or more of A-Z a-z 0-9 - _ . ~ (openssl rand -hex 32)");
  }
  return token;
}

}  // namespace

struct Daemon::Impl {
  explicit Impl(Config c) : config(std::move(c)) {}

  Config config;
  Metrics metrics;
  zmq::context_t context{1};
  std::unique_ptr<Store> store;
  RunRegistry registry;
  std::unique_ptr<Ingest> ingest;
  std::unique_ptr<QueryService> service;
  std::unique_ptr<ZapAuthenticator> zap;  // with curve.key_file: admits CURVE clients
  std::unique_ptr<QueryServer> query_server;
  asio::io_context io{1};
  std::unique_ptr<HttpServer> http;
  int exit_code = 0;

  // Maintenance thread: retention and compaction of deleted runs.
  std::thread maintenance;
  std::mutex maint_mu;
  std::condition_variable maint_cv;
  std::deque<uint64_t> to_compact;
  bool maint_stop = false;

  void MaintenanceLoop();
  void EnforceRetention();
  void Shutdown(int code);
};

void Daemon::Impl::MaintenanceLoop() {
  pthread_setname_np(pthread_self(), "og-maint");
  auto next_check = std::chrono::steady_clock::now() + config.retention_interval;
  std::unique_lock<std::mutex> lock(maint_mu);
  while (!maint_stop) {
    maint_cv.wait_until(lock, next_check, [&] { return maint_stop || !to_compact.empty(); });
    if (maint_stop) break;
    if (!to_compact.empty()) {
      uint64_t id = to_compact.front();
      to_compact.pop_front();
      lock.unlock();
      store->CompactRun(id);
      lock.lock();
      continue;
    }
    if (std::chrono::steady_clock::now() >= next_check) {
      lock.unlock();
      EnforceRetention();
      lock.lock();
      next_check = std::chrono::steady_clock::now() + config.retention_interval;
    }
  }
}

void Daemon::Impl::EnforceRetention() {
  if (config.retention_max_bytes == 0 && config.retention_max_age.count() == 0) return;
  auto runs = registry.Runs();
  if (runs.size() < 2) return;  // the most recently active run is never removed
  std::sort(runs.begin(), runs.end(),
            [](const RunState& a, const RunState& b) { return a.LastNs() < b.LastNs(); });
  runs.pop_back();
  const uint64_t now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                 std::chrono::system_clock::now().time_since_epoch())
                                                 .count());
  const uint64_t max_age_ns = static_cast<uint64_t>(config.retention_max_age.count()) * 1000000000ull;
  for (const auto& run : runs) {
    const bool too_old = max_age_ns != 0 && now > run.LastNs() && now - run.LastNs() > max_age_ns;
    const bool too_big = config.retention_max_bytes != 0 && store->DiskBytes() > config.retention_max_bytes;
    // Sorted oldest first: once a run is young enough and the store small
    // enough, every later run is too.
    if (!too_old && !too_big) break;
    OPGUARD_LOG(LogLevel::kInfo, "retention: removing run '" + run.name + "' (" +
                                     (too_old ? "older than retention.max_age" : "store above retention.max_bytes") + ")");
    Status st = ingest->DeleteRun(run.name, std::chrono::seconds(60));
    if (!st.ok()) {
      OPGUARD_LOG(LogLevel::kWarn, "retention: " + st.message());
      continue;
    }
    store->CompactRun(run.id);  // give the space back before measuring again
  }
}

void Daemon::Impl::Shutdown(int code) {
  if (code != 0) exit_code = code;
  io.stop();
}

Daemon::Daemon(Config config) : impl_(std::make_unique<Impl>(std::move(config))) {}
Daemon::~Daemon() = default;

int Daemon::Run() {
  Impl& d = *impl_;
  const Config& c = d.config;
  const uint64_t file_limit = RaiseFileLimit();
  if (!c.local_dir.empty()) {
    Status local = PrepareLocalDirs(c.local_dir, c.data_dir, {c.ingest, c.query_socket, c.listen});
    if (local.ok()) local = LockLocalDir(c.local_dir);
    if (!local.ok()) {
      OPGUARD_LOG(LogLevel::kError, local.message());
      return 1;
    }
  }
  auto store = Store::Open(c);
  if (!store.ok()) {
    OPGUARD_LOG(LogLevel::kError, store.status().message());
    return 1;
  }
  d.store = std::move(store).value();
  d.ingest = std::make_unique<Ingest>(c, d.store.get(), &d.registry, &d.metrics, &d.context);
  d.ingest->SetOnRunDeleted([&d](uint64_t id) {
    if (d.service) d.service->ForgetRun(id);
    std::lock_guard<std::mutex> lock(d.maint_mu);
    d.to_compact.push_back(id);
    d.maint_cv.notify_one();
  });
  d.service = std::make_unique<QueryService>(c, d.store.get(), &d.registry, d.ingest.get(), &d.metrics);
  auto curve = LoadCurve(c, &d.context, &d.metrics, &d.zap);
  if (!curve.ok()) {
    OPGUARD_LOG(LogLevel::kError, curve.status().message());
    (void)d.store->Close();
    return 1;
  }
  d.query_server = std::make_unique<QueryServer>(c, d.service.get(), &d.metrics, &d.context, *curve);
  std::string http_token;
  if (!c.http.empty() && !c.http_token_file.empty()) {
    auto token = ReadToken(c.http_token_file);
    if (!token.ok()) {
      OPGUARD_LOG(LogLevel::kError, token.status().message());
      (void)d.store->Close();
      return 1;
    }
    http_token = *token;
  }
  // Peers ask for the JSON API of ranks stored here; they get this node's
  // answer only (no viewer files, no forwarding again).
  d.service->SetApiRouter([&d](const std::string& target, const CancelToken* cancel) -> std::pair<int, std::string> {
    if (!IsForwardableApiRoute(target)) return {400, R"({"error":"not a JSON API route peers answer"})"};
    try {
      HttpResponse r = RouteHttp("GET", target, d.service.get(), &d.metrics, d.store.get(), {}, cancel);
      return {r.status, std::move(r.body)};
    } catch (const std::exception& e) {
      return {500, nlohmann::json{{"error", std::string("internal error: ") + e.what()}}.dump()};
    }
  });

  // Signals first, so a SIGTERM during startup still stops cleanly.
  asio::signal_set signals(d.io, SIGTERM, SIGINT);
  signals.async_wait([&d](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    OPGUARD_LOG(LogLevel::kInfo, std::string("received ") + (signo == SIGTERM ? "SIGTERM" : "SIGINT") +
                                     ", shutting down");
    d.Shutdown(0);
  });
  std::signal(SIGPIPE, SIG_IGN);

  auto fail = [&](const Status& st) {
    OPGUARD_LOG(LogLevel::kError, st.message());
    d.service->StopAligner();
    d.query_server->Stop();
    d.ingest->Stop();
    (void)d.store->Close();
    return 1;
  };
  Status st = d.ingest->Start();
  if (!st.ok()) return fail(st);
  st = d.query_server->Start();
  if (!st.ok()) return fail(st);
  if (!c.http.empty()) {
    const std::string web_root = FindWebRoot(c.web_root);
    if (web_root.empty()) {
      OPGUARD_LOG(LogLevel::kWarn, "web viewer not found" +
                                       (c.web_root.empty() ? std::string() : " in " + c.web_root) +
                                       " (no index.html): the HTTP server answers the API only");
    } else {
      OPGUARD_LOG(LogLevel::kInfo, "web viewer: " + web_root);
    }
    d.http = std::make_unique<HttpServer>(&d.io, d.service.get(), &d.metrics, d.store.get(),
                                            web_root);
    // HTTP never takes the descriptors ingest, queries and the store need.
    const uint64_t http_cap =
        std::max<uint64_t>(1, std::min<uint64_t>(c.http_max_connections, file_limit / 4));
    if (http_cap < c.http_max_connections) {
      OPGUARD_LOG(LogLevel::kWarn, "http.max_connections lowered to " + std::to_string(http_cap) +
                                       " (a quarter of the file descriptor limit " +
                                       std::to_string(file_limit) + ")");
    }
    d.http->SetMaxConnections(http_cap);
    d.http->SetToken(http_token);
    st = d.http->Start(c.http);
    if (!st.ok()) return fail(st);
    d.service->SetHttpAddress(d.http->address());
  }
  d.maintenance = std::thread([&d] { d.MaintenanceLoop(); });

  OPGUARD_LOG(LogLevel::kInfo, std::string("opguardd ") + OPGUARD_VERSION + " ready: data " + c.data_dir +
                                   ", ingest " + c.ingest + ", queries " + c.query_socket +
                                   (c.listen.empty() || c.listen == c.query_socket ? "" : " and " + c.listen) +
                                   (d.zap ? " (CURVE)" : "") + ", http " +
                                   (d.http ? d.http->address() : std::string("off")) + ", " +
                                   std::to_string(d.registry.Count()) + " runs stored");
  Notify("READY=1\nSTATUS=serving " + std::to_string(d.registry.Count()) + " runs");

  // Health: a failed store makes the daemon exit (systemd restarts it); the
  // watchdog is fed only while the ingest threads make progress.
  const auto watchdog = WatchdogPeriod();
  asio::steady_timer health(d.io);
  // --idle-exit: anything received or asked moves these counters.
  auto activity = [&d] {
    const Metrics& m = d.metrics;
    return m.bytes_received.load() + m.queries.load() + m.http_requests.load() + m.inflight_bytes.load();
  };
  uint64_t last_activity = activity();
  auto last_active_at = std::chrono::steady_clock::now();
  std::function<void()> check = [&] {
    if (d.ingest->Failed()) {
      OPGUARD_LOG(LogLevel::kError, "store failed; exiting so the service manager restarts the daemon");
      d.Shutdown(1);
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (const uint64_t seen = activity(); seen != last_activity) {
      last_activity = seen;
      last_active_at = now;
    } else if (c.idle_exit.count() > 0 && now - last_active_at >= c.idle_exit) {
      OPGUARD_LOG(LogLevel::kInfo, "no batch or query for " + std::to_string(c.idle_exit.count()) +
                                       " s (idle_exit): exiting");
      d.Shutdown(0);
      return;
    }
    if (watchdog.count() > 0 && d.ingest->Healthy(std::chrono::seconds(30))) Notify("WATCHDOG=1");
    auto period = watchdog.count() > 0 ? std::min<std::chrono::microseconds>(watchdog, std::chrono::seconds(1))
                                       : std::chrono::microseconds(std::chrono::seconds(1));
    health.expires_after(period);
    health.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) check();
    });
  };
  check();

  d.io.run();

  Notify("STOPPING=1\nSTATUS=finishing in-flight batches");
  if (d.http) d.http->Stop();
  {
    std::lock_guard<std::mutex> lock(d.maint_mu);
    d.maint_stop = true;
  }
  d.maint_cv.notify_all();
  if (d.maintenance.joinable()) d.maintenance.join();
  // Running alignments give up; their workers must be gone before the query
  // socket and the store they use.
  d.service->StopAligner();
  d.query_server->Stop();
  if (d.zap) d.zap->Stop();
  d.ingest->Stop();  // commits and acks what was received
  st = d.store->Close();
  if (!st.ok()) {
    OPGUARD_LOG(LogLevel::kError, st.message());
    if (d.exit_code == 0) d.exit_code = 1;
  }
  OPGUARD_LOG(LogLevel::kInfo, "stopped");
  return d.exit_code;
}

}  // namespace opguard::daemon
