#include "query/explain.h"

#include <utility>  // before Boost.Asio: GCC 12 + C++20 needs it first

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#define XXH_INLINE_ALL
#include <xxhash.h>


namespace opguard::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kMaxAnswerBytes = 1 << 20;  // an answer larger than this is refused, not kept

// The instructions: evidence first, no speculation past it.
constexpr const char* kSystemPrompt =
    "You help an engineer debug a distributed PyTorch training job. OpGuard compared two runs bit for bit "
    "at every op and found the first op where they stop agreeing (the pivot). You get its report, the "
    "source around the pivot in both runs, and what each run recorded about its versions and settings. "
    "In a few short paragraphs: say what most likely caused the divergence and why, citing the evidence "
    "(op, line, step, rank, fingerprints, statistics, kernels); say what to check next. Do not invent facts "
    "that are not in the evidence; say when the evidence does not decide.";

std::string ReadSmallFile(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string data(limit, '\0');
  in.read(data.data(), static_cast<std::streamsize>(limit));
  data.resize(static_cast<size_t>(in.gcount()));
  return data;
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// The chat completion's text, or an error naming what the endpoint said.
Result<std::string> AnswerText(unsigned status, const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (status != 200) {
    std::string why = body.substr(0, 300);
    if (!j.is_discarded() && j.contains("error")) {
      const auto& e = j["error"];
      why = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                 : e.dump().substr(0, 300);
    }
    return Unavailable("explain.endpoint answered HTTP " + std::to_string(status) + ": " + why);
  }
  if (j.is_discarded()) return Unavailable("explain.endpoint answered something that is not JSON");
  try {
    const auto& content = j.at("choices").at(0).at("message").at("content");
    if (!content.is_string() || content.get<std::string>().empty()) {
      return Unavailable("explain.endpoint answered no text (choices[0].message.content)");
    }
    return content.get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return Unavailable("explain.endpoint's answer has no choices[0].message.content");
  }
}

template <class Stream>
Result<std::string> Exchange(Stream& stream, beast::tcp_stream& deadline, const ChatEndpoint& endpoint,
                             const std::string& body, const std::string& api_key,
                             std::chrono::steady_clock::time_point until) {
  http::request<http::string_body> req{http::verb::post, endpoint.target, 11};
  req.set(http::field::host, endpoint.host);
  req.set(http::field::user_agent, "opguardd");
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  deadline.expires_at(until);
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxAnswerBytes);
  deadline.expires_at(until);
  http::read(stream, buffer, parser);
  const auto& res = parser.get();
  return AnswerText(res.result_int(), res.body());
}

}  // namespace

Result<ChatEndpoint> ParseChatEndpoint(const std::string& url) {
  ChatEndpoint e;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    e.tls = true;
    rest = url.substr(8);
  } else {
    return InvalidArgument("explain.endpoint must be an http:// or https:// URL, not '" + url + "'");
  }
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  e.target = slash == std::string::npos ? "/v1/chat/completions" : rest.substr(slash);
  if (authority.find('@') != std::string::npos) {
    return InvalidArgument("explain.endpoint may not carry credentials; put the key in explain.api_key_file");
  }
  const size_t colon = authority.rfind(':');
  const bool bracketed = !authority.empty() && authority[0] == '[';
  if (colon != std::string::npos && (!bracketed || authority.find(']') < colon)) {
    e.port = authority.substr(colon + 1);
    authority = authority.substr(0, colon);
  } else {
    e.port = e.tls ? "443" : "80";
  }
  if (bracketed && authority.size() > 2 && authority.back() == ']') authority = authority.substr(1, authority.size() - 2);
  e.host = authority;
  if (e.host.empty() || e.port.empty() || e.port.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument("explain.endpoint '" + url + "' has no host or a bad port");
  }
  return e;
}

std::string SourceExcerpt(const std::string& text, uint32_t line, uint32_t context) {
  std::istringstream in(text);
  std::ostringstream out;
  std::string l;
  const uint32_t first = line > context ? line - context : 1, last = line + context;
  for (uint32_t n = 1; std::getline(in, l) && n <= last; ++n) {
    if (n < first) continue;
    char number[16];
    std::snprintf(number, sizeof number, "%c%5u  ", n == line ? '>' : ' ', n);
    out << number << l << "\n";
  }
  return out.str();
}

std::string ExplainPrompt(const nlohmann::json& report, const std::string& reference_excerpt,
                          const std::string& suspect_excerpt, const nlohmann::json& runs) {
  // The report without its per-rank detail (the pivot, the ranks it reached
  // and the rules' diagnosis are what matter; a 512-rank job's list is not)
  // and without the query's own timings.
  nlohmann::json evidence = report;
  evidence.erase("ranks");
  evidence.erase("nodes");  // who answered and how fast: not evidence, and it varies
  std::ostringstream p;
  p << "## OpGuard report (JSON)\n" << evidence.dump(1) << "\n\n";
  p << "## Source around the pivot, reference run\n" << (reference_excerpt.empty() ? "(not sent)\n" : reference_excerpt)
    << "\n";
  p << "## Source around the pivot, suspect run\n" << (suspect_excerpt.empty() ? "(not sent)\n" : suspect_excerpt)
    << "\n";
  p << "## The runs' recorded versions and settings (JSON)\n" << runs.dump(1) << "\n";
  return p.str();
}

Explainer::Explainer(const Config& config)
    : endpoint_url_(config.explain_endpoint),
      model_(config.explain_model),
      api_key_file_(config.explain_api_key_file),
      timeout_(config.explain_timeout),
      cache_dir_(config.data_dir + "/explanations") {}

std::string Explainer::EvidenceHash(const std::string& prompt) const {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, model_.data(), model_.size());
  XXH3_128bits_update(state, "\0", 1);
  XXH3_128bits_update(state, prompt.data(), prompt.size());
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

std::optional<nlohmann::json> Explainer::Cached(const std::string& hash) const {
  const std::string data = ReadSmallFile(cache_dir_ + "/" + hash + ".json", 2 * kMaxAnswerBytes);
  if (data.empty()) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.contains("text") || !j["text"].is_string()) return std::nullopt;
  return j;
}

Result<std::string> Explainer::Post(const ChatEndpoint& endpoint, const std::string& body,
                                    const CancelToken* cancel) const {
  std::string api_key;
  if (!api_key_file_.empty()) {
    api_key = Trimmed(ReadSmallFile(api_key_file_, 4096));
    if (api_key.empty()) return Unavailable("explain.api_key_file " + api_key_file_ + " is empty or unreadable");
  }
  auto until = std::chrono::steady_clock::now() + timeout_;
  if (cancel != nullptr) OPGUARD_RETURN_IF_ERROR(cancel->Check());
  try {
    asio::io_context io;
    tcp::resolver resolver(io);
    const auto addresses = resolver.resolve(endpoint.host, endpoint.port);
    if (!endpoint.tls) {
      beast::tcp_stream stream(io);
      stream.expires_at(until);
      stream.connect(addresses);
      auto text = Exchange(stream, stream, endpoint, body, api_key, until);
      beast::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      return text;
    }
    asio::ssl::context tls(asio::ssl::context::tls_client);
    tls.set_default_verify_paths();
    tls.set_verify_mode(asio::ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> stream(io, tls);
    // SNI, and the certificate must name the endpoint's host.
    if (!SSL_set_tlsext_host_name(stream.native_handle(), endpoint.host.c_str())) {
      return Unavailable("explain.endpoint: cannot set the TLS server name " + endpoint.host);
    }
    stream.set_verify_callback(asio::ssl::host_name_verification(endpoint.host));
    beast::get_lowest_layer(stream).expires_at(until);
    beast::get_lowest_layer(stream).connect(addresses);
    stream.handshake(asio::ssl::stream_base::client);
    auto text = Exchange(stream, beast::get_lowest_layer(stream), endpoint, body, api_key, until);
    beast::error_code ignored;
    stream.shutdown(ignored);
    return text;
  } catch (const std::exception& e) {
    return Unavailable("explain.endpoint " + endpoint_url_ + ": " + e.what());
  }
}

Result<nlohmann::json> Explainer::Ask(const std::string& hash, const std::string& prompt, const CancelToken* cancel) {
  OPGUARD_ASSIGN_OR_RETURN(ChatEndpoint endpoint, ParseChatEndpoint(endpoint_url_));
  const nlohmann::json request = {
      {"model", model_},
      {"temperature", 0},
      {"messages", nlohmann::json::array({{{"role", "system"}, {"content", kSystemPrompt}},
                                          {{"role", "user"}, {"content", prompt}}})}};
  OPGUARD_ASSIGN_OR_RETURN(std::string text, Post(endpoint, request.dump(), cancel));
  const nlohmann::json kept = {
      {"text", text},
      {"model", model_},
      {"created_s", std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count()}};
  // Written whole and renamed into place: a reader never sees half a file.
  std::lock_guard lock(write_mu_);
  std::error_code ec;
  std::filesystem::create_directories(cache_dir_, ec);
  ::chmod(cache_dir_.c_str(), 0700);
  const std::string path = cache_dir_ + "/" + hash + ".json", tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept.dump();
    if (!out.flush()) ec = std::make_error_code(std::errc::io_error);
  }
  if (ec || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());  // the answer is still returned; it is asked again next time
  }
  return kept;
}

}  // namespace opguard::daemon
