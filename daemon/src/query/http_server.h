// HTTP face of the daemon (Boost.Beast): the JSON API and Prometheus
// /metrics. Runs on the daemon's control io_context (one thread); handlers
// are short reads of the registry and bounded store scans.
//
//   GET /api/status
//   GET /api/runs
//   GET /api/runs/NAME
//   GET /api/runs/NAME/ranks/R/trace?lane=L&from=OP&max=N (or count=N)
//   GET /api/diff?reference=A&suspect=B[&rank=R][&timeout=S]   (aligner)
//   GET /api/runs/NAME/ranks[?replicas=R,R,...][&timeout=S]    (aligner)
//   GET /api/runs/NAME/collectives[?timeout=S]                 (aligner)
//   GET /api/runs/NAME/ranks/R/lanes                            (lanes, last op each)
//   GET /api/alignment?reference=A&suspect=B&rank=R[&lane=L][&from=N][&count=M][&op=OP]
//   GET /api/source?run=NAME&file=PATH     (only files the run sent)
//   GET /api/verify[?run=NAME]             (scrub: what is damaged; on a worker)
//   GET /, /diff, /run                     (the viewer's index.html)
//   GET /FILE                              (the viewer's files, web_files.h)
//   GET /metrics
//   GET /healthz
//
// Included by daemon.cc only.
#pragma once

#include <utility>  // before Boost.Asio: GCC 12 + C++20 needs it first

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "opguard/common/cancel.h"
#include "opguard/common/status.h"

namespace opguard::daemon {

class QueryService;
class Store;
struct Metrics;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// Aligner routes take seconds and fan out to peers: the server runs them on
// an aligner worker, never on the control thread.
bool IsAlignerRoute(const std::string& target);

// Routes that name one run's rank or the run itself (alignment, trace,
// lanes, source, run metadata): a node that answers 404 for them asks its
// peers (QueryService::ForwardApi), since on a cluster the rank may be stored
// on another node. Peers answer them from their own data (ApiRequest).
bool IsForwardableApiRoute(const std::string& target);

// Routes one request; pure function of the daemon state (unit-testable).
// `web_root` holds the viewer's files ("" : not installed, pages answer 404).
// `cancel` stops an aligner route (the client went away, the time budget).
HttpResponse RouteHttp(const std::string& method, const std::string& target, QueryService* service,
                       Metrics* metrics, Store* store, const std::string& web_root = {},
                       const CancelToken* cancel = nullptr);

class HttpServer {
 public:
  HttpServer(boost::asio::io_context* io, QueryService* service, Metrics* metrics, Store* store,
             std::string web_root);
  ~HttpServer();
  // Binds "HOST:PORT" (port 0: any free port). Control thread.
  Status Start(const std::string& address);
  // The bound "HOST:PORT".
  std::string address() const { return address_; }
  void Stop();
  // Connections served at once (http.max_connections); before Start.
  void SetMaxConnections(uint64_t n) { max_connections_ = n; }
  // The token clients off loopback present (query/http_auth.h); empty:
  // none needed. Before Start.
  void SetToken(std::string token) { token_ = std::move(token); }

 private:
  void Accept();
  void BackOff();  // accepts again 100 ms later
  // At the cap: closes the connection that has waited longest (at least
  // 1 s) for a request, so that a new client is served; false when none.
  bool EvictSlowest();
  struct Live;  // the sessions, for EvictSlowest
  std::shared_ptr<Live> live_;
  uint64_t max_connections_ = 64;
  boost::asio::io_context* io_;
  QueryService* service_;
  Metrics* metrics_;
  Store* store_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  boost::asio::steady_timer retry_{*io_};
  std::string address_;
  const std::string web_root_;
  std::string token_;
  std::vector<std::string> host_names_;  // see HostAllowed (query/http_auth.h)
};

}  // namespace opguard::daemon
