#include "query/http_server.h"

#include <utility>

#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <boost/asio/post.hpp>

#include <chrono>
#include <cstdlib>
#include <optional>

#include "metrics.h"
#include "opguard/common/log.h"
#include "query/query.h"
#include "storage/store.h"

namespace opguard::daemon {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

constexpr const char* kBadEscape = "bad percent escape in the URL (expected %XX, two hex digits, not %00)";

// nullopt for '%' without two hex digits after it, and for %00: a NUL byte
// in a run name or parameter is never meant.
std::optional<std::string> UrlDecode(std::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%') {
      const int hi = i + 2 < in.size() ? HexDigit(in[i + 1]) : -1;
      const int lo = hi >= 0 ? HexDigit(in[i + 2]) : -1;
      if (lo < 0 || (hi == 0 && lo == 0)) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (in[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

std::optional<std::vector<std::string>> SplitPath(std::string_view path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) {
      auto part = UrlDecode(path.substr(i, j - i));
      if (!part) return std::nullopt;
      parts.push_back(std::move(*part));
    }
    i = j + 1;
  }
  return parts;
}

bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  errno = 0;
  *out = std::strtoull(s.c_str(), nullptr, 10);
  return errno == 0;
}

HttpResponse Json(int status, const nlohmann::json& j) {
  return {status, "application/json", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"};
}

HttpResponse Error(int status, const std::string& message) {
  return Json(status, {{"error", message}});
}

int HttpStatus(const Status& st) {
  switch (st.code()) {
    case StatusCode::kNotFound: return 404;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

// One connection: read a request, answer, repeat while keep-alive.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // metrics->http_connections counts live sessions (the server's cap reads it).
  Session(tcp::socket socket, QueryService* service, Metrics* metrics, Store* store)
      : stream_(std::move(socket)), service_(service), metrics_(metrics), store_(store) {
    metrics_->http_connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() { metrics_->http_connections.fetch_sub(1, std::memory_order_relaxed); }

  void Start() { Read(); }

 private:
  void Read() {
    parser_.emplace();
    parser_->body_limit(64 * 1024);
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec) return Close();
    auto& req = parser_->get();
    metrics_->http_requests.fetch_add(1, std::memory_order_relaxed);
    std::string method(req.method_string()), target(req.target());
    if (IsAlignerRoute(target)) {
      // Off the control thread (signals, health, watchdog); the answer comes
      // back to this connection's strand. A diff may outlast the idle timeout.
      stream_.expires_never();
      service_->RunAligner(false, [self = shared_from_this(), method, target] {
        HttpResponse r = self->Route(method, target);
        boost::asio::post(self->stream_.get_executor(), [self, r = std::move(r)]() mutable { self->Write(std::move(r)); });
      });
      return;
    }
    Write(Route(method, target));
  }

  HttpResponse Route(const std::string& method, const std::string& target) {
    try {
      return RouteHttp(method, target, service_, metrics_, store_);
    } catch (const std::exception& e) {
      return Error(500, std::string("internal error: ") + e.what());
    }
  }

  void Write(HttpResponse r) {
    auto& req = parser_->get();
    stream_.expires_after(std::chrono::seconds(30));
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status),
                                                                    req.version());
    res->set(http::field::server, "opguardd");
    res->set(http::field::content_type, r.content_type);
    res->set(http::field::cache_control, "no-store");
    res->keep_alive(req.keep_alive());
    res->body() = std::move(r.body);
    res->prepare_payload();
    response_ = res;
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code wec, size_t) {
      if (wec || !res->keep_alive()) return self->Close();
      self->Read();
    });
  }

  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<void> response_;
  QueryService* service_;
  Metrics* metrics_;
  Store* store_;
};

}  // namespace

bool IsAlignerRoute(const std::string& target) {
  std::string_view path = target;
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  auto split = SplitPath(path);
  if (!split) return false;  // answered 400 on the control thread
  const auto& parts = *split;
  if (parts.size() == 2 && parts[0] == "api" && parts[1] == "diff") return true;
  return parts.size() == 4 && parts[0] == "api" && parts[1] == "runs" &&
         (parts[3] == "ranks" || parts[3] == "collectives");
}

HttpResponse RouteHttp(const std::string& method, const std::string& target, QueryService* service,
                       Metrics* metrics, Store* store) {
  std::string_view path = target, query;
  if (auto q = path.find('?'); q != std::string_view::npos) {
    query = path.substr(q + 1);
    path = path.substr(0, q);
  }
  std::map<std::string, std::string> params;
  {
    size_t i = 0;
    while (i < query.size()) {
      size_t j = query.find('&', i);
      if (j == std::string_view::npos) j = query.size();
      auto item = query.substr(i, j - i);
      auto eq = item.find('=');
      if (eq != std::string_view::npos) {
        auto key = UrlDecode(item.substr(0, eq)), value = UrlDecode(item.substr(eq + 1));
        if (!key || !value) return Error(400, kBadEscape);
        params[*key] = std::move(*value);
      }
      i = j + 1;
    }
  }
  auto split = SplitPath(path);
  if (!split) return Error(400, kBadEscape);
  const auto& parts = *split;
  if (method != "GET" && method != "HEAD") return Error(405, "only GET is served");
  if (path == "/metrics") {
    auto runs = service->ListRuns().size();
    double uptime = service->StatusJson()["uptime_s"].get<double>();
    return {200, "text/plain; version=0.0.4; charset=utf-8", metrics->Prometheus(*store, runs, uptime)};
  }
  if (path == "/healthz") {
    bool healthy = service->StatusJson()["healthy"].get<bool>();
    return {healthy ? 200 : 503, "text/plain", healthy ? "ok\n" : "store failed\n"};
  }
  if (parts.size() >= 2 && parts[0] == "api") {
    if (parts.size() == 2 && parts[1] == "status") return Json(200, service->StatusJson());
    if (parts.size() == 2 && parts[1] == "runs") return Json(200, service->RunsJson());
    if (parts.size() == 3 && parts[1] == "runs") {
      auto run = service->GetRun(parts[2]);
      if (!run.ok()) return Error(HttpStatus(run.status()), run.status().message());
      return Json(200, service->RunJson(*run));
    }
    // Aligner queries; timeout= bounds each peer's answer (seconds).
    uint64_t timeout_s = 0;
    if (params.count("timeout") && (!ParseU64(params["timeout"], &timeout_s) || timeout_s > 3600)) {
      return Error(400, "timeout must be seconds (0..3600)");
    }
    const uint32_t peer_timeout_ms = static_cast<uint32_t>(timeout_s * 1000);
    if (parts.size() == 2 && parts[1] == "diff") {
      if (params["reference"].empty() || params["suspect"].empty()) {
        return Error(400, "diff needs reference= and suspect= run names");
      }
      int64_t rank = -1;
      if (params.count("rank")) {
        uint64_t r = 0;
        if (!ParseU64(params["rank"], &r) || r > UINT32_MAX) return Error(400, "rank must be a number");
        rank = static_cast<int64_t>(r);
      }
      auto j = service->DiffJson(params["reference"], params["suspect"], rank, peer_timeout_ms);
      if (!j.ok()) return Error(HttpStatus(j.status()), j.status().message());
      return Json(200, *j);
    }
    if (parts.size() == 4 && parts[1] == "runs" && parts[3] == "collectives") {
      auto j = service->CollectivesJson(parts[2], peer_timeout_ms);
      if (!j.ok()) return Error(HttpStatus(j.status()), j.status().message());
      return Json(200, *j);
    }
    if (parts.size() == 4 && parts[1] == "runs" && parts[3] == "ranks") {
      std::vector<uint32_t> replicas;
      std::string list = params["replicas"];
      size_t i = 0;
      while (i < list.size()) {
        size_t j = list.find(',', i);
        if (j == std::string::npos) j = list.size();
        uint64_t r = 0;
        if (!ParseU64(list.substr(i, j - i), &r) || r > UINT32_MAX) {
          return Error(400, "replicas must be rank numbers separated by commas");
        }
        replicas.push_back(static_cast<uint32_t>(r));
        i = j + 1;
      }
      auto j = service->RanksJson(parts[2], replicas, peer_timeout_ms);
      if (!j.ok()) return Error(HttpStatus(j.status()), j.status().message());
      return Json(200, *j);
    }
    if (parts.size() == 6 && parts[1] == "runs" && parts[3] == "ranks" && parts[5] == "trace") {
      uint64_t rank = 0, lane = 0, from = 0, max = 1000;
      if (!ParseU64(parts[4], &rank) || rank > UINT32_MAX) return Error(400, "rank must be a number");
      if (params.count("lane") && (!ParseU64(params["lane"], &lane) || lane > UINT32_MAX)) {
        return Error(400, "lane must be a number");
      }
      if (params.count("from") && !ParseU64(params["from"], &from)) return Error(400, "from must be a number");
      if (params.count("max") && (!ParseU64(params["max"], &max) || max == 0 || max > UINT32_MAX)) {
        return Error(400, "max must be a positive number");
      }
      auto page = service->ReadTrace(parts[2], static_cast<uint32_t>(rank), static_cast<uint32_t>(lane), from,
                                     static_cast<uint32_t>(max));
      if (!page.ok()) return Error(HttpStatus(page.status()), page.status().message());
      return Json(200, service->TraceJson(parts[2], static_cast<uint32_t>(rank), static_cast<uint32_t>(lane), *page));
    }
  }
  return Error(404, "no such endpoint: " + std::string(path));
}

HttpServer::HttpServer(asio::io_context* io, QueryService* service, Metrics* metrics, Store* store)
    : io_(io), service_(service), metrics_(metrics), store_(store) {}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("http: '" + address + "' is not HOST:PORT");
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  beast::error_code ec;
  auto ip = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
  if (ec) return InvalidArgument("http: '" + host + "' is not an IP address");
  uint64_t port_number = 0;
  if (!ParseU64(port, &port_number) || port_number > 65535) return InvalidArgument("http: bad port '" + port + "'");
  tcp::endpoint endpoint(ip, static_cast<unsigned short>(port_number));
  acceptor_ = std::make_unique<tcp::acceptor>(*io_);
  acceptor_->open(endpoint.protocol(), ec);
  if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(endpoint, ec);
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("cannot listen for HTTP on " + address + ": " + ec.message());
  auto bound = acceptor_->local_endpoint();
  address_ = (bound.address().is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string()) +
             ":" + std::to_string(bound.port());
  Accept();
  return Status::Ok();
}

void HttpServer::Stop() {
  retry_.cancel();
  if (acceptor_) {
    beast::error_code ec;
    acceptor_->close(ec);
    acceptor_.reset();
  }
}

// At max_connections, or out of file descriptors, the server stops
// accepting for a while: waiting clients stay in the kernel's backlog, and
// the descriptors the ingest socket and the store need stay free.
void HttpServer::Accept() {
  if (!acceptor_) return;
  if (metrics_->http_connections.load(std::memory_order_relaxed) >= max_connections_)
    return BackOff();
  acceptor_->async_accept(asio::make_strand(*io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_) return;
    if (!ec) std::make_shared<Session>(std::move(socket), service_, metrics_, store_)->Start();
    using boost::system::errc::errc_t;
    for (errc_t out_of : {errc_t::too_many_files_open, errc_t::too_many_files_open_in_system,
                          errc_t::no_buffer_space, errc_t::not_enough_memory}) {
      if (ec == out_of) return BackOff();
    }
    Accept();
  });
}

void HttpServer::BackOff() {
  metrics_->http_accept_backoffs.fetch_add(1, std::memory_order_relaxed);
  retry_.expires_after(std::chrono::milliseconds(100));
  retry_.async_wait([this](beast::error_code ec) {
    if (!ec) Accept();
  });
}

}  // namespace opguard::daemon
