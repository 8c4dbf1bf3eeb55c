#include "query/http_server.h"

#include <unistd.h>

#include <utility>

#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <vector>
#include <mutex>
#include <atomic>
#include <array>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <map>
#include <cstdlib>
#include <optional>

#include "metrics.h"
#include "opguard/common/log.h"
#include "query/http_auth.h"
#include "query/query.h"
#include "query/web_files.h"
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

// A request's header (request line included) is at most this long; a
// longer one is answered 431, or 414 when its request line alone is.
constexpr uint32_t kMaxHeaderBytes = 8 << 10;
// A request arrives whole within this time of the connection (or the last
// answer) being ready for it, however slowly its bytes trickle in; an idle
// keep-alive connection is closed after it too.
constexpr auto kRequestTimeout = std::chrono::seconds(10);

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One connection: read a request, answer, repeat while keep-alive.
class Session : public std::enable_shared_from_this<Session> {
 public:
  // metrics->http_connections counts live sessions (the server's cap reads it).
  Session(tcp::socket socket, QueryService* service, Metrics* metrics, Store* store,
          const std::string* web_root, const std::string* token, const std::vector<std::string>* host_names)
      : stream_(std::move(socket)), service_(service), metrics_(metrics), store_(store),
        web_root_(web_root), token_(token), host_names_(host_names) {
    metrics_->http_connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() { metrics_->http_connections.fetch_sub(1, std::memory_order_relaxed); }

  void Start() { Read(); }

  // Since when it waits for a request (0: it is answering one).
  int64_t reading_since_ns() const { return reading_since_ns_.load(std::memory_order_relaxed); }
  // Any thread: closes the connection (its pending read ends).
  void Evict() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      self->stream_.socket().close(ec);
    });
  }

 private:
  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(64 * 1024);
    stream_.expires_after(kRequestTimeout);
    reading_since_ns_.store(SteadyNowNs(), std::memory_order_relaxed);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    reading_since_ns_.store(0, std::memory_order_relaxed);
    if (ec == http::error::header_limit || ec == http::error::body_limit) {
      // Answered, then closed: what follows cannot be framed.
      client_done_ = true;
      drain_ = true;
      if (ec == http::error::body_limit) return Write(Error(413, "request body larger than 64 KiB"));
      // The parser sets the target once the request line is complete.
      if (parser_->get().target().empty()) {
        return Write(Error(414, "request line longer than " + std::to_string(kMaxHeaderBytes) + " bytes"));
      }
      return Write(Error(431, "request header longer than " + std::to_string(kMaxHeaderBytes) + " bytes"));
    }
    if (ec) return Close();
    auto& req = parser_->get();
    metrics_->http_requests.fetch_add(1, std::memory_order_relaxed);
    std::string method(req.method_string()), target(req.target());
    if (const auto host = req[http::field::host]; !HostAllowed(std::string_view(host.data(), host.size()), *host_names_)) {
      metrics_->http_misdirected.fetch_add(1, std::memory_order_relaxed);
      return Write(Error(421, "Host '" + std::string(host) +
                                  "' does not name this daemon: use its address, localhost, this node's host "
                                  "name or a name of http.host_names"));
    }
    if (!token_->empty()) {
      beast::error_code rec;
      const bool loopback = stream_.socket().remote_endpoint(rec).address().is_loopback() && !rec;
      auto header = [&req](http::field f) {
        const auto v = req[f];
        return std::string_view(v.data(), v.size());
      };
      const auto check = CheckHttpToken(*token_, loopback, header(http::field::authorization),
                                        header(http::field::cookie), target);
      if (!check.allowed) {
        metrics_->http_unauthorized.fetch_add(1, std::memory_order_relaxed);
        return Write(Error(401, "a token is needed off loopback: Authorization: Bearer TOKEN, or open "
                                "/?token=TOKEN once in the browser"));
      }
      set_cookie_ = check.set_cookie;
    }
    const bool aligner = IsAlignerRoute(target);
    std::optional<HttpResponse> local;
    if (!aligner) {
      local = Route(method, target);
      if (!NeedsPeers(*local, target)) return Write(std::move(*local));
    }
    // Off the control thread (signals, health, watchdog): alignments, and
    // asking peers for what this node does not hold. The answer comes back
    // to this connection's strand. A diff may outlast the idle timeout, but
    // not the query's time budget, nor its client.
    stream_.expires_never();
    auto token = service_->NewQueryToken();
    WatchForHangUp(token);
    service_->RunAligner(false, token,
                         [self = shared_from_this(), method, target, local = std::move(local), token]() mutable {
      HttpResponse r = local ? std::move(*local) : self->Route(method, target, token.get());
      if (self->NeedsPeers(r, target) && token->Check().ok()) {
        if (auto peer = self->service_->ForwardApi(target)) r = {peer->first, "application/json", std::move(peer->second)};
      }
      boost::asio::post(self->stream_.get_executor(), [self, r = std::move(r)]() mutable { self->Answered(std::move(r)); });
    });
  }

  // While a query computes, a read on the otherwise idle connection tells
  // whether its client hung up: end of stream or an error cancels the
  // query, so an abandoned request stops at its next check point instead of
  // holding a worker. Bytes a client sends meanwhile (a pipelined request)
  // go to buffer_ for the next Read; past 64 KiB of them watching stops.
  //
  // End of stream may also be a client that half-closed after its request
  // and still reads: the answer (a cancelled query's error, or the result
  // when it was ready first) is still written, then the connection closes.
  // It cannot be read again: Asio reports an end of stream once and then
  // waits for readiness the socket never signals again, so a next Read
  // would sit until the idle timeout.
  void WatchForHangUp(std::shared_ptr<CancelToken> token) {
    watching_ = true;
    stream_.async_read_some(asio::buffer(watch_buffer_),
                            [self = shared_from_this(), token](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (n > 0) {
        auto room = self->buffer_.prepare(n);
        std::memcpy(room.data(), self->watch_buffer_.data(), n);
        self->buffer_.commit(n);
      }
      if (ec && ec != asio::error::operation_aborted) self->client_done_ = true;
      if (self->answer_) {  // Answered() cancelled the watch to write
        HttpResponse r = std::move(*self->answer_);
        self->answer_.reset();
        return self->Write(std::move(r));
      }
      if (ec) return token->Cancel(CancelToken::Reason::kClientGone);
      if (self->buffer_.size() < 64 * 1024) self->WatchForHangUp(token);
    });
  }

  // The query's answer, on the strand: written at once, or once the watch
  // read has ended (one read at a time on the stream).
  void Answered(HttpResponse r) {
    if (!watching_) return Write(std::move(r));
    answer_ = std::move(r);
    stream_.cancel();
  }

  bool NeedsPeers(const HttpResponse& r, const std::string& target) const {
    return r.status == 404 && service_->HasPeers() && IsForwardableApiRoute(target);
  }

  HttpResponse Route(const std::string& method, const std::string& target,
                     const CancelToken* cancel = nullptr) {
    try {
      return RouteHttp(method, target, service_, metrics_, store_, *web_root_, cancel);
    } catch (const std::exception& e) {
      return Error(500, std::string("internal error: ") + e.what());
    }
  }

  void Write(HttpResponse r) {
    auto& req = parser_->get();
    stream_.expires_after(std::chrono::seconds(30));
    // A request cut short by a limit has no version yet: answer in HTTP/1.1.
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status),
                                                                    req.version() == 10 ? 10 : 11);
    res->set(http::field::server, "opguardd");
    res->set(http::field::content_type, r.content_type);
    res->set(http::field::cache_control, "no-store");
    // The viewer loads only its own files and the API; nothing is sniffed
    // into another type and no other site may frame it.
    res->set("X-Content-Type-Options", "nosniff");
    res->set("Content-Security-Policy",
             "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'");
    if (r.status == 401) res->set(http::field::www_authenticate, "Bearer");
    if (set_cookie_) res->set(http::field::set_cookie, TokenCookie(*token_));
    set_cookie_ = false;
    // After the client's end of stream nothing more can be read: the
    // answer says the connection closes (requests pipelined behind this one
    // are not answered; an HTTP/1.1 client sends them again).
    res->keep_alive(req.keep_alive() && !client_done_);
    res->body() = std::move(r.body);
    res->prepare_payload();
    response_ = res;
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code wec, size_t) {
      if (!wec && self->drain_) return self->DrainAndClose();
      if (wec || !res->keep_alive()) return self->Close();
      self->Read();
    });
  }

  // After answering a request it did not read whole: stops sending, then
  // reads and drops what the client still sends (for at most 2 s), so that
  // closing with unread bytes does not reset the connection before the
  // client has read the answer.
  void DrainAndClose() {
    Close();
    stream_.expires_after(std::chrono::seconds(2));  // once: a trickle does not extend it
    Drain();
  }
  void Drain() {
    stream_.async_read_some(asio::buffer(watch_buffer_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec) self->Drain();
    });
  }

  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> watch_buffer_;
  bool watching_ = false;               // WatchForHangUp's read is pending
  bool drain_ = false;                  // answered a request not read whole: DrainAndClose
  std::atomic<int64_t> reading_since_ns_{0};  // see reading_since_ns()
  bool client_done_ = false;            // that read met the client's end of stream
  std::optional<HttpResponse> answer_;  // waits for that read to end
  std::shared_ptr<void> response_;
  QueryService* service_;
  Metrics* metrics_;
  Store* store_;
  const std::string* web_root_;
  const std::string* token_;  // empty: no token needed
  const std::vector<std::string>* host_names_;  // HostAllowed's names
  bool set_cookie_ = false;    // this request brought the token in its URL
};

}  // namespace

bool IsAlignerRoute(const std::string& target) {
  std::string_view path = target;
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  auto split = SplitPath(path);
  if (!split) return false;  // answered 400 on the control thread
  const auto& parts = *split;
  if (parts.size() == 2 && parts[0] == "api" &&
      (parts[1] == "diff" || parts[1] == "alignment" || parts[1] == "explain" || parts[1] == "verify")) {
    return true;
  }
  return parts.size() == 4 && parts[0] == "api" && parts[1] == "runs" &&
         (parts[3] == "ranks" || parts[3] == "collectives");
}

bool IsForwardableApiRoute(const std::string& target) {
  std::string_view path = target;
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  auto split = SplitPath(path);
  if (!split || split->size() < 2 || (*split)[0] != "api") return false;
  const auto& parts = *split;
  if (parts.size() == 2) return parts[1] == "alignment" || parts[1] == "source";
  if (parts[1] != "runs") return false;
  return parts.size() == 3 || (parts.size() == 6 && parts[3] == "ranks" && (parts[5] == "trace" || parts[5] == "lanes"));
}

namespace {

// The query parameters of one request, checked against what its route takes.
class Params {
 public:
  explicit Params(std::map<std::string, std::string> values) : values_(std::move(values)) {}

  // Empty when every parameter is one of `allowed`, else the 400 message.
  std::string Unknown(std::initializer_list<const char*> allowed) const {
    for (const auto& entry : values_) {
      const std::string& key = entry.first;  // clang 14 cannot capture a structured binding
      if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; }) ==
          allowed.end()) {
        std::string names;
        for (const char* a : allowed) names += std::string(names.empty() ? "" : ", ") + a;
        return "unknown parameter '" + key + "'" + (names.empty() ? " (this endpoint takes none)"
                                                                  : " (this endpoint takes " + names + ")");
      }
    }
    return {};
  }
  bool Has(const char* key) const { return values_.count(key) != 0; }
  std::string Text(const char* key) const {
    auto it = values_.find(key);
    return it == values_.end() ? std::string() : it->second;
  }
  // An optional unsigned parameter in [lo, hi]; false (with *error set) when
  // present but not a number in range.
  bool Number(const char* key, uint64_t lo, uint64_t hi, uint64_t* out, std::string* error) const {
    auto it = values_.find(key);
    if (it == values_.end()) return true;
    uint64_t v = 0;
    if (!ParseU64(it->second, &v) || v < lo || v > hi) {
      *error = std::string(key) + " must be a number from " + std::to_string(lo) + " to " + std::to_string(hi) +
               " (got '" + it->second.substr(0, 40) + "')";
      return false;
    }
    *out = v;
    return true;
  }

 private:
  std::map<std::string, std::string> values_;
};

// Largest page of alignment rows; a viewer screen shows well under this.
constexpr uint64_t kMaxAlignmentRows = 5000;

// Paths the viewer's router handles in the browser: each answers index.html
// so that a shared URL opens its view.
bool IsViewerPage(std::string_view path) { return path == "/" || path == "/diff" || path == "/run"; }

HttpResponse WebFileResponse(const std::string& web_root, const std::vector<std::string>& parts) {
  if (web_root.empty()) return Error(404, "the web viewer is not installed here (opguardd --web-root DIR)");
  auto file = ReadWebFile(web_root, parts);
  if (!file) return Error(404, "no such file");
  return {200, std::move(file->content_type), std::move(file->body)};
}

}  // namespace

HttpResponse RouteHttp(const std::string& method, const std::string& target, QueryService* service,
                       Metrics* metrics, Store* store, const std::string& web_root,
                       const CancelToken* cancel) {
  std::string_view path = target, query;
  if (auto q = path.find('?'); q != std::string_view::npos) {
    query = path.substr(q + 1);
    path = path.substr(0, q);
  }
  std::map<std::string, std::string> values;
  {
    size_t i = 0;
    while (i < query.size()) {
      size_t j = query.find('&', i);
      if (j == std::string_view::npos) j = query.size();
      auto item = query.substr(i, j - i);
      if (!item.empty()) {
        auto eq = item.find('=');
        auto key = UrlDecode(item.substr(0, eq));
        auto value = eq == std::string_view::npos ? std::optional<std::string>("") : UrlDecode(item.substr(eq + 1));
        if (!key || !value) return Error(400, kBadEscape);
        values[*key] = std::move(*value);
      }
      i = j + 1;
    }
  }
  const Params params(std::move(values));
  auto split = SplitPath(path);
  if (!split) return Error(400, kBadEscape);
  const auto& parts = *split;
  if (method != "GET" && method != "HEAD") return Error(405, "only GET is served");
  const bool api = !parts.empty() && parts[0] == "api";
  if (!api) {
    if (IsViewerPage(path)) return WebFileResponse(web_root, {"index.html"});
    if (path != "/metrics" && path != "/healthz") {
      for (const auto& part : parts) {
        if (!SafeSegment(part)) return Error(400, "path segments may not be '.', '..', hidden or contain '/', '\\' or NUL");
      }
      return WebFileResponse(web_root, parts);
    }
    if (std::string unknown = params.Unknown({}); !unknown.empty()) return Error(400, unknown);
  }
  if (path == "/metrics") {
    auto runs = service->ListRuns().size();
    double uptime = service->StatusJson()["uptime_s"].get<double>();
    return {200, "text/plain; version=0.0.4; charset=utf-8", metrics->Prometheus(*store, runs, uptime)};
  }
  if (path == "/healthz") {
    bool healthy = service->StatusJson()["healthy"].get<bool>();
    return {healthy ? 200 : 503, "text/plain", healthy ? "ok\n" : "store failed\n"};
  }
  std::string error;
  auto answer = [](const Result<nlohmann::json>& j) {
    return j.ok() ? Json(200, *j) : Error(HttpStatus(j.status()), j.status().message());
  };
  if (parts.size() == 2 && parts[1] == "status") {
    if (error = params.Unknown({}); !error.empty()) return Error(400, error);
    return Json(200, service->StatusJson());
  }
  if (parts.size() == 2 && parts[1] == "runs") {
    if (error = params.Unknown({}); !error.empty()) return Error(400, error);
    return Json(200, service->RunsJson());
  }
  if (parts.size() == 3 && parts[1] == "runs") {
    if (error = params.Unknown({}); !error.empty()) return Error(400, error);
    auto run = service->GetRun(parts[2]);
    if (!run.ok()) return Error(HttpStatus(run.status()), run.status().message());
    return Json(200, service->RunJson(*run));
  }
  if (parts.size() == 2 && parts[1] == "source") {
    if (error = params.Unknown({"run", "file"}); !error.empty()) return Error(400, error);
    const std::string run = params.Text("run"), file = params.Text("file");
    if (run.empty() || file.empty()) return Error(400, "source needs run= and file= (a path the run's call sites name)");
    if (file.size() > 4096) return Error(400, "file= is longer than 4096 bytes");
    return answer(service->SourceJson(run, file));
  }
  if (parts.size() == 2 && parts[1] == "verify") {
    if (error = params.Unknown({"run"}); !error.empty()) return Error(400, error);
    return answer(service->VerifyJson(params.Text("run"), cancel));
  }
  // Aligner queries; timeout= bounds each peer's answer (seconds).
  uint64_t timeout_s = 0;
  if (!params.Number("timeout", 0, 3600, &timeout_s, &error)) return Error(400, error);
  const uint32_t peer_timeout_ms = static_cast<uint32_t>(timeout_s * 1000);
  uint64_t rank = 0;
  if (!params.Number("rank", 0, UINT32_MAX, &rank, &error)) return Error(400, error);
  if (parts.size() == 2 && parts[1] == "diff") {
    if (error = params.Unknown({"reference", "suspect", "rank", "timeout"}); !error.empty()) return Error(400, error);
    if (params.Text("reference").empty() || params.Text("suspect").empty()) {
      return Error(400, "diff needs reference= and suspect= run names");
    }
    return answer(service->DiffJson(params.Text("reference"), params.Text("suspect"),
                                    params.Has("rank") ? static_cast<int64_t>(rank) : -1, peer_timeout_ms,
                                    cancel));
  }
  if (parts.size() == 2 && parts[1] == "explain") {
    // ask=1 asks explain.endpoint when no answer is kept; without it only a
    // kept answer is shown (the viewer's first look never costs a call).
    if (error = params.Unknown({"reference", "suspect", "ask"}); !error.empty()) return Error(400, error);
    if (params.Text("reference").empty() || params.Text("suspect").empty()) {
      return Error(400, "explain needs reference= and suspect= run names");
    }
    uint64_t ask = 0;
    if (!params.Number("ask", 0, 1, &ask, &error)) return Error(400, error);
    return answer(service->ExplainJson(params.Text("reference"), params.Text("suspect"), ask == 1, cancel));
  }
  if (parts.size() == 2 && parts[1] == "alignment") {
    if (error = params.Unknown({"reference", "suspect", "rank", "lane", "from", "count", "op"}); !error.empty()) {
      return Error(400, error);
    }
    if (params.Text("reference").empty() || params.Text("suspect").empty() || !params.Has("rank")) {
      return Error(400, "alignment needs reference=, suspect= and rank=");
    }
    uint64_t lane = 0, from = 0, count = 200, op = 0;
    if (!params.Number("lane", 0, UINT32_MAX, &lane, &error) ||
        !params.Number("from", 0, uint64_t{1} << 40, &from, &error) ||
        !params.Number("count", 1, kMaxAlignmentRows, &count, &error) ||
        !params.Number("op", 0, UINT64_MAX, &op, &error)) {
      return Error(400, error);
    }
    return answer(service->AlignmentJson(params.Text("reference"), params.Text("suspect"),
                                         static_cast<uint32_t>(rank), static_cast<uint32_t>(lane), from, count,
                                         params.Has("op") ? std::optional<uint64_t>(op) : std::nullopt,
                                         cancel));
  }
  if (parts.size() == 4 && parts[1] == "runs" && parts[3] == "collectives") {
    if (error = params.Unknown({"timeout"}); !error.empty()) return Error(400, error);
    return answer(service->CollectivesJson(parts[2], peer_timeout_ms, cancel));
  }
  if (parts.size() == 4 && parts[1] == "runs" && parts[3] == "ranks") {
    if (error = params.Unknown({"replicas", "timeout"}); !error.empty()) return Error(400, error);
    std::vector<uint32_t> replicas;
    std::string list = params.Text("replicas");
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
    return answer(service->RanksJson(parts[2], replicas, peer_timeout_ms, cancel));
  }
  if (parts.size() == 6 && parts[1] == "runs" && parts[3] == "ranks" &&
      (parts[5] == "trace" || parts[5] == "lanes")) {
    uint64_t path_rank = 0, lane = 0, from = 0, max = 1000;
    if (!ParseU64(parts[4], &path_rank) || path_rank > UINT32_MAX) return Error(400, "rank must be a number");
    if (parts[5] == "lanes") {
      if (error = params.Unknown({}); !error.empty()) return Error(400, error);
      return answer(service->LanesJson(parts[2], static_cast<uint32_t>(path_rank)));
    }
    // count= is max= under the name the viewer's other ranges use.
    if (error = params.Unknown({"lane", "from", "max", "count"}); !error.empty()) return Error(400, error);
    if (!params.Number("lane", 0, UINT32_MAX, &lane, &error) || !params.Number("from", 0, UINT64_MAX, &from, &error) ||
        !params.Number("max", 1, UINT32_MAX, &max, &error) || !params.Number("count", 1, UINT32_MAX, &max, &error)) {
      return Error(400, error);
    }
    auto page = service->ReadTrace(parts[2], static_cast<uint32_t>(path_rank), static_cast<uint32_t>(lane), from,
                                   static_cast<uint32_t>(max));
    if (!page.ok()) return Error(HttpStatus(page.status()), page.status().message());
    return Json(200, service->TraceJson(parts[2], static_cast<uint32_t>(path_rank), static_cast<uint32_t>(lane), *page));
  }
  return Error(404, "no such endpoint: " + std::string(path));
}

struct HttpServer::Live {
  std::mutex mu;
  std::vector<std::weak_ptr<Session>> sessions;
};

HttpServer::HttpServer(asio::io_context* io, QueryService* service, Metrics* metrics, Store* store,
                       std::string web_root)
    : live_(std::make_shared<Live>()), io_(io), service_(service), metrics_(metrics), store_(store),
      web_root_(std::move(web_root)) {}

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
  // The names a Host header may give besides addresses and localhost.
  host_names_.clear();
  if (service_ != nullptr) host_names_ = service_->config().http_host_names;
  char node[256] = {};
  if (::gethostname(node, sizeof node - 1) == 0 && node[0] != '\0') host_names_.emplace_back(node);
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
  if (metrics_->http_connections.load(std::memory_order_relaxed) >= max_connections_ && !EvictSlowest()) {
    return BackOff();
  }
  acceptor_->async_accept(asio::make_strand(*io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_) return;
    if (!ec) {
      auto session =
          std::make_shared<Session>(std::move(socket), service_, metrics_, store_, &web_root_, &token_, &host_names_);
      {
        std::lock_guard<std::mutex> lock(live_->mu);
        auto& sessions = live_->sessions;
        if (sessions.size() >= 2 * max_connections_) {  // the closed ones go
          sessions.erase(std::remove_if(sessions.begin(), sessions.end(), [](const auto& w) { return w.expired(); }),
                         sessions.end());
        }
        sessions.push_back(session);
      }
      session->Start();
    }
    using boost::system::errc::errc_t;
    for (errc_t out_of : {errc_t::too_many_files_open, errc_t::too_many_files_open_in_system,
                          errc_t::no_buffer_space, errc_t::not_enough_memory}) {
      if (ec == out_of) return BackOff();
    }
    Accept();
  });
}

bool HttpServer::EvictSlowest() {
  constexpr int64_t kMinWaitNs = 1'000'000'000;  // a client that just connected is not evicted
  const int64_t now = SteadyNowNs();
  std::shared_ptr<Session> slowest;
  std::lock_guard<std::mutex> lock(live_->mu);
  auto& sessions = live_->sessions;
  sessions.erase(std::remove_if(sessions.begin(), sessions.end(), [](const auto& w) { return w.expired(); }),
                 sessions.end());
  for (const auto& weak : sessions) {
    auto s = weak.lock();
    const int64_t since = s ? s->reading_since_ns() : 0;
    if (since == 0 || now - since < kMinWaitNs) continue;
    if (!slowest || since < slowest->reading_since_ns()) slowest = std::move(s);
  }
  if (!slowest) return false;
  metrics_->http_evicted.fetch_add(1, std::memory_order_relaxed);
  slowest->Evict();
  return true;
}

void HttpServer::BackOff() {
  metrics_->http_accept_backoffs.fetch_add(1, std::memory_order_relaxed);
  retry_.expires_after(std::chrono::milliseconds(100));
  retry_.async_wait([this](beast::error_code ec) {
    if (!ec) Accept();
  });
}

}  // namespace opguard::daemon
