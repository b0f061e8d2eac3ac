// The rank side of NDMESH_LAUNCH_NOTIFY: one datagram on a Unix socket, nonblocking.
#include "ndmesh/launch/notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "ndmesh/core/env.hpp"

namespace ndmesh {

void notify_launcher(std::string_view line) noexcept {
  try {
    const auto path = env::raw("NDMESH_LAUNCH_NOTIFY");
    sockaddr_un addr{};
    if (!path || path->size() >= sizeof(addr.sun_path)) return;
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path->data(), path->size());
    const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    const std::size_t n = std::min(line.size(), kNotifyMaxBytes);
    (void)sendto(fd, line.data(), n, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr),
                 sizeof(addr));
    close(fd);
  } catch (const std::exception&) {  // env::raw's checks: nothing to report to
  }
}

std::string_view telling_report(const std::vector<std::string>& lines) {
  const auto across = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find(kSpansNodes) != std::string::npos;
  });
  if (across != lines.end()) return *across;
  return lines.empty() ? std::string_view{} : std::string_view{lines.front()};
}

}  // namespace ndmesh
