// HTTP requests: any bytes a client can send on a connection to the daemon's
// HTTP port. They go over a real loopback TCP connection to the real server
// (Boost.Beast's parser, the session's keep-alive loop, the router, the
// aligner workers for diffs). Property: the server answers or closes the
// connection within the deadline and keeps accepting; nothing crashes.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_daemon.h"
#include "opguard/daemon/testing/batch_maker.h"

namespace {

using opguard::daemon::fuzz::Fail;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static opguard::daemon::fuzz::FuzzDaemon daemon;
  const int fd = opguard::daemon::testing::ConnectTcp(daemon.http_address());
  if (fd < 0) Fail("cannot connect to the HTTP server at " + daemon.http_address());
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
