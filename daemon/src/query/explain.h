// Explanations in prose, behind the diagnosis rules (docs/daemon.md,
// "Explanations"). When the operator configures an OpenAI-compatible chat
// endpoint (explain.endpoint), a diff's evidence — its report, the source
// around the pivot in both runs, the runs' recorded versions and settings —
// is sent there and the answer is kept under DATA_DIR/explanations, named
// by the hash of what was sent: the same case never calls twice, and the
// viewer shows the kept text, labelled as generated, beside the rules'
// verdict. Without an endpoint nothing is sent anywhere.
//
// Included by query.cc. Explainer's methods block (file and network I/O
// with a deadline): aligner worker threads only; safe from several at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "opguard/common/cancel.h"
#include "opguard/common/status.h"
#include "opguard/daemon/config.h"

namespace opguard::daemon {

// explain.endpoint, split: http:// or https://, host, port, path.
struct ChatEndpoint {
  bool tls = false;
  std::string host;
  std::string port;
  std::string target;  // "/v1/chat/completions"
};
Result<ChatEndpoint> ParseChatEndpoint(const std::string& url);

// `context` lines either side of `line` (1-based) of `text`, numbered, the
// line itself marked with '>'.
std::string SourceExcerpt(const std::string& text, uint32_t line, uint32_t context = 12);

// What is sent: the diff report's evidence, both excerpts, both runs'
// metadata. Deterministic for the same inputs (the cache's key is its hash).
std::string ExplainPrompt(const nlohmann::json& report, const std::string& reference_excerpt,
                          const std::string& suspect_excerpt, const nlohmann::json& runs);

class Explainer {
 public:
  explicit Explainer(const Config& config);

  bool configured() const { return !endpoint_url_.empty(); }
  const std::string& model() const { return model_; }

  // Hex digest of the model and the prompt: the cache key.
  std::string EvidenceHash(const std::string& prompt) const;

  // The kept answer for `hash`: {"text", "model", "created_s"}; nullopt when
  // none is kept (or the file cannot be read).
  std::optional<nlohmann::json> Cached(const std::string& hash) const;

  // Sends `prompt` to the endpoint and keeps the answer under `hash`.
  // Unavailable with the endpoint's words on any failure (nothing kept).
  Result<nlohmann::json> Ask(const std::string& hash, const std::string& prompt, const CancelToken* cancel);

 private:
  Result<std::string> Post(const ChatEndpoint& endpoint, const std::string& body, const CancelToken* cancel) const;

  std::string endpoint_url_;
  std::string model_;
  std::string api_key_file_;
  std::chrono::milliseconds timeout_;
  std::string cache_dir_;
  std::mutex write_mu_;  // one writer of the cache folder at a time
};

}  // namespace opguard::daemon
