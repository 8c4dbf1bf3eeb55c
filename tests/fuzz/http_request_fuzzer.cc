// HTTP requests: any bytes a client can send on a connection to the daemon's
// HTTP port. They go over a real loopback TCP connection to the real server
// (Boost.Beast's parser, the session's keep-alive loop, the router, the
// aligner workers for diffs). Property: the server answers or closes the
// connection within the deadline and keeps accepting; nothing crashes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_daemon.h"

namespace {

using opguard::daemon::fuzz::Fail;

int Connect(const std::string& host_port) {
  const auto colon = host_port.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  ::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    Fail("cannot connect to the HTTP server at " + host_port);
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static opguard::daemon::fuzz::FuzzDaemon daemon;
  const int fd = Connect(daemon.http_address());
  // Send everything, then half-close: the server sees the request end.
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed early (a bad request): fine
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // Read until the server closes: at the latest its idle timeout (30 s)
  // after the last answer, so 60 s without news is a hang.
  char buf[16384];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0) Fail("the HTTP server neither answered nor closed within 60 s");
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
  }
  ::close(fd);
  return 0;
}
