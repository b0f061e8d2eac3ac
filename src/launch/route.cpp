#include "ndmesh/launch/route.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::launch {

std::string local_address_toward(const std::string& host, std::string_view component, std::string_view named,
                                 std::string_view fix) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr)
    fail<ConfigError>(component, "{} does not resolve to an address; {}", named, fix);
  std::string out;
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    char text[INET6_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      const void* a = addr.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&addr)->sin_addr);
      if (::inet_ntop(addr.ss_family, a, text, sizeof text)) out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (out.empty()) fail<>(component, "no route from this host to {}", named);
  return out;
}

}  // namespace ndmesh::launch
