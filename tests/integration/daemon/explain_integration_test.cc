// Explanations in prose (docs/daemon.md, "Explanations") against a real
// opguardd and a stand-in for an OpenAI-compatible chat endpoint that this
// test starts on loopback: the evidence is sent once per case and the answer
// kept by its hash; without an endpoint nothing is sent anywhere.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "opguard/daemon/testing/batch_maker.h"

namespace opguard::daemon {
namespace {

using namespace std::chrono_literals;

// Answers POSTs like a chat completions endpoint: each request is kept, the
// answer names its number. `status` other than 200 answers an error.
class StandInChat {
 public:
  explicit StandInChat(int status = 200) : status_(status) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~StandInChat() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1/chat/completions"; }
  std::vector<std::string> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      timeval tv{5, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::string in;
      char buf[65536];
      size_t want = std::string::npos;
      for (ssize_t n; (want == std::string::npos || in.size() < want) && (n = ::read(c, buf, sizeof buf)) > 0;) {
        in.append(buf, static_cast<size_t>(n));
        const size_t end = in.find("\r\n\r\n");
        if (want == std::string::npos && end != std::string::npos) {
          const size_t cl = in.find("Content-Length: ");
          want = end + 4 + (cl < end ? std::stoul(in.substr(cl + 16)) : 0);
        }
      }
      size_t number;
      {
        std::lock_guard lock(mu_);
        requests_.push_back(in);
        number = requests_.size();
      }
      const std::string body =
          status_ == 200 ? nlohmann::json{{"choices", {{{"index", 0},
                                                         {"message",
                                                          {{"role", "assistant"},
                                                           {"content", "stand-in explanation #" +
                                                                           std::to_string(number)}}}}}}}
                               .dump()
                         : R"({"error":{"message":"quota exceeded"}})";
      const std::string out = "HTTP/1.1 " + std::to_string(status_) + " X\r\nContent-Type: application/json\r\n" +
                              "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                              body;
      (void)!::write(c, out.data(), out.size());
      ::close(c);
    }
  }

  int status_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

class ExplainTest : public ::testing::Test {
 protected:
  std::unique_ptr<testing::DaemonProcess> StartDaemon(std::vector<std::string> args) {
    auto d = std::make_unique<testing::DaemonProcess>(OPGUARDD_PATH, dir_.path(), std::move(args));
    Status st = d->Start();
    EXPECT_TRUE(st.ok()) << st.message();
    return d;
  }

  // Two runs of 2 ranks; the suspect's rank 1 diverges at op 300.
  static void RecordRuns(testing::DaemonProcess& d) {
    for (const char* run : {"ref", "sus"}) {
      std::string cmd = std::string(OPGUARD_LOADGEN_PATH) + " --run " + run +
                        " --ranks 2 --ops 1000 --collective-every 100 --endpoint " + d.ingest() +
                        (std::string(run) == "sus" ? " --diverge-at 1:300" : "") + " 2>&1";
      auto out = testing::RunCommand(cmd, 120);
      ASSERT_EQ(out.exit_code, 0) << out.output;
    }
  }

  static nlohmann::json Get(testing::DaemonProcess& d, const std::string& target, int expect_status = 200) {
    auto r = testing::HttpGet(d.http(), target, 60s);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return nullptr;
    EXPECT_EQ(r->status, expect_status) << r->body;
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  testing::TempDir dir_;
};

TEST_F(ExplainTest, TheEvidenceIsSentOnceAndTheAnswerKeptByItsHash) {
  StandInChat chat;
  const std::string key_file = dir_.path() + "/key";
  std::ofstream(key_file) << "sk-test-123\n";
  auto d = StartDaemon({"--explain.endpoint", chat.url(), "--explain.model", "stand-in-1",
                        "--explain.api-key-file", key_file});
  ASSERT_TRUE(d->Running());
  RecordRuns(*d);

  // A first look shows only what is kept: nothing, and no call.
  auto look = Get(*d, "/api/explain?reference=ref&suspect=sus");
  EXPECT_EQ(look["status"], "diverged") << look;
  EXPECT_FALSE(look["cached"].get<bool>()) << look;
  EXPECT_TRUE(look["generated"].is_null()) << look;
  EXPECT_TRUE(chat.requests().empty());
  const std::string hash = look["evidence_hash"].get<std::string>();
  EXPECT_EQ(hash.size(), 32u);

  auto asked = Get(*d, "/api/explain?reference=ref&suspect=sus&ask=1");
  EXPECT_EQ(asked["generated"]["text"], "stand-in explanation #1") << asked;
  EXPECT_EQ(asked["generated"]["model"], "stand-in-1") << asked;
  EXPECT_EQ(asked["evidence_hash"], hash);
  // The rules' verdict travels beside it, as the diff gives it.
  auto diff = Get(*d, "/api/diff?reference=ref&suspect=sus");
  EXPECT_EQ(asked["diagnosis"], diff["diagnosis"]);
  ASSERT_EQ(chat.requests().size(), 1u);
  const std::string request = chat.requests()[0];
  EXPECT_NE(request.find("POST /v1/chat/completions HTTP/1.1"), std::string::npos) << request.substr(0, 300);
  EXPECT_NE(request.find("Authorization: Bearer sk-test-123"), std::string::npos);
  const auto body = nlohmann::json::parse(request.substr(request.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["model"], "stand-in-1");
  const std::string prompt = body["messages"][1]["content"];
  // The pivot's evidence and both runs' metadata are in what was sent.
  EXPECT_NE(prompt.find(diff["first_divergence"]["op"].get<std::string>()), std::string::npos);
  EXPECT_NE(prompt.find("\"first_divergence\""), std::string::npos);
  EXPECT_NE(prompt.find("\"ref\""), std::string::npos);
  EXPECT_NE(prompt.find("\"sus\""), std::string::npos);

  // The same case again: answered from what was kept, no second call, also
  // after a restart.
  auto again = Get(*d, "/api/explain?reference=ref&suspect=sus&ask=1");
  EXPECT_TRUE(again["cached"].get<bool>());
  EXPECT_EQ(again["generated"]["text"], "stand-in explanation #1");
  EXPECT_EQ(d->Stop(), 0);
  d = StartDaemon({"--explain.endpoint", chat.url(), "--explain.model", "stand-in-1"});
  ASSERT_TRUE(d->Running());
  auto restarted = Get(*d, "/api/explain?reference=ref&suspect=sus&ask=1");
  EXPECT_EQ(restarted["generated"]["text"], "stand-in explanation #1");
  EXPECT_EQ(chat.requests().size(), 1u);

  // Another model is another case: asked anew.
  EXPECT_EQ(d->Stop(), 0);
  d = StartDaemon({"--explain.endpoint", chat.url(), "--explain.model", "stand-in-2"});
  auto other = Get(*d, "/api/explain?reference=ref&suspect=sus&ask=1");
  EXPECT_NE(other["evidence_hash"], hash);
  EXPECT_EQ(other["generated"]["text"], "stand-in explanation #2");
  EXPECT_EQ(chat.requests().size(), 2u);
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(ExplainTest, WithoutAnEndpointNothingIsSentAnywhere) {
  StandInChat chat;
  auto d = StartDaemon({});
  ASSERT_TRUE(d->Running());
  RecordRuns(*d);
  auto r = Get(*d, "/api/explain?reference=ref&suspect=sus&ask=1", 400);
  EXPECT_EQ(r["error"], "no explain.endpoint is configured: the daemon sends evidence nowhere");
  // The diff still carries the rules' diagnosis.
  EXPECT_FALSE(Get(*d, "/api/diff?reference=ref&suspect=sus")["diagnosis"].is_null());
  EXPECT_TRUE(chat.requests().empty());
  EXPECT_FALSE(std::filesystem::exists(d->data_dir() + "/explanations"));
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(ExplainTest, AnEndpointErrorIsSaidInOneLineAndNothingIsKept) {
  StandInChat chat(429);
  auto d = StartDaemon({"--explain.endpoint", chat.url()});
  ASSERT_TRUE(d->Running());
  RecordRuns(*d);
  auto r = Get(*d, "/api/explain?reference=ref&suspect=sus&ask=1", 503);
  EXPECT_EQ(r["error"], "explain.endpoint answered HTTP 429: quota exceeded") << r;
  auto look = Get(*d, "/api/explain?reference=ref&suspect=sus");
  EXPECT_FALSE(look["cached"].get<bool>());
  EXPECT_EQ(chat.requests().size(), 1u);
  // The daemon goes on answering.
  EXPECT_EQ(Get(*d, "/api/diff?reference=ref&suspect=sus")["status"], "diverged");
  EXPECT_EQ(d->Stop(), 0);
}

TEST_F(ExplainTest, ABadEndpointIsRefusedAtStart) {
  auto out = testing::RunCommand(std::string(OPGUARDD_PATH) + " --local " + dir_.path() +
                                     "/x --explain.endpoint ftp://example.invalid/v1",
                                 20);
  EXPECT_NE(out.exit_code, 0);
  EXPECT_NE(out.output.find("must be an http:// or https:// URL"), std::string::npos) << out.output;
}

}  // namespace
}  // namespace opguard::daemon
