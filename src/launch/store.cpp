// The c10d TCPStore protocol, client and server (see store.hpp for the generations).
// Every number is little-endian as the host writes it (torch sends raw host values);
// strings and byte vectors are a uint64 length followed by the bytes. Replies: GET and
// COMPARE_SET a byte vector, ADD / GETNUMKEYS / DELETE_KEY an int64, CHECK one byte
// (0 ready, 1 not ready), WAIT one byte (0 stop waiting, 1 wait canceled) once every key
// is set, PING the nonce back.
//
// The server's protocol is StoreCore (store_protocol.cpp); this file holds the client
// and the server's socket loop.
#include "ndmesh/launch/store.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/launch/store_protocol.hpp"

namespace ndmesh::launch {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxReply = StoreLimits{}.value_bytes;  // the largest value a server holds
// How long identify() waits for the answer to one probe: a server answers a query it
// understands at once, and one it does not may stay silent.
constexpr double kProbeS = 3;

// A message being built.
struct Out {
  std::string bytes;
  template <typename T>
  Out& value(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Out& str(const std::string& s) {
    value<std::uint64_t>(s.size());
    bytes += s;
    return *this;
  }
};

std::string errno_text(int e) { return std::strerror(e); }

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void send_all(int fd, const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("send: " + errno_text(errno));
    off += static_cast<std::size_t>(n);
  }
}

// Reads exactly n bytes, waiting at most until `deadline` for them (nullopt: no bound).
// Returns false at the deadline; throws when the peer closed the connection.
bool recv_exact(int fd, void* out, std::size_t n, std::optional<Clock::time_point> deadline) {
  auto* p = static_cast<char*>(out);
  std::size_t got = 0;
  while (got < n) {
    int wait_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return false;
      wait_ms = static_cast<int>(std::min<long long>(left, 1000));
    }
    pollfd pfd{fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, wait_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) throw std::runtime_error("poll: " + errno_text(errno));
    if (rc == 0) continue;
    ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("the store closed the connection");
    if (r < 0) throw std::runtime_error("recv: " + errno_text(errno));
    got += static_cast<std::size_t>(r);
  }
  return true;
}

// A connected TCP socket to host:port, or -1 with `why` set.
int dial(const std::string& host, int port, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    why = fmt::format("cannot resolve {}: {}", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = errno_text(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace

// One client connection; every request holds the mutex until its reply has been read.
class StoreConnection {
 public:
  StoreConnection(std::string host, int port, double timeout_s)
      : host_(std::move(host)),
        port_(port),
        timeout_s_(timeout_s),
        address_(fmt::format("{}:{}", host_, port_)) {
    auto deadline = after(timeout_s);
    std::string why = "no answer";
    auto pause = std::chrono::milliseconds(10);
    for (;;) {
      fd_ = dial(host_, port_, why);
      if (fd_ >= 0) {
        if (identify(deadline, why)) return;
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
      }
      if (Clock::now() >= deadline)
        fail<>(
            "store",
            "no store answered at {} within {:g} s ({}); is rank 0 (or the launcher's agent) running there?",
            address_, timeout_s, why);
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
  }
  ~StoreConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  int protocol() const { return protocol_; }
  const std::string& generation() const { return generation_; }
  double timeout_s() const { return timeout_s_; }
  const std::string& address() const { return address_; }

  void set(const std::string& key, const std::string& value) {
    std::lock_guard lock(mutex_);
    guarded("set", key, [&] { send_all(fd_, start(Cmd::kSet).str("/" + key).str(value).bytes); });
  }

  std::string get(const std::string& key) {
    std::lock_guard lock(mutex_);
    wait_locked({key}, timeout_s_);
    std::string value;
    guarded("get", key, [&] {
      send_all(fd_, start(Cmd::kGet).str("/" + key).bytes);
      std::uint64_t n = 0;
      read(&n, sizeof n);
      if (n > kMaxReply) throw std::runtime_error(fmt::format("a reply of {} bytes", n));
      value.resize(n);
      read(value.data(), n);
    });
    return value;
  }

  std::int64_t add(const std::string& key, std::int64_t delta) {
    std::lock_guard lock(mutex_);
    std::int64_t sum = 0;
    guarded("add", key, [&] {
      send_all(fd_, start(Cmd::kAdd).str("/" + key).value(delta).bytes);
      read(&sum, sizeof sum);
    });
    return sum;
  }

  bool check(const std::vector<std::string>& keys) {
    std::lock_guard lock(mutex_);
    std::uint8_t ready = 1;
    guarded("check", keys.empty() ? "" : keys.front(), [&] {
      Out out = start(Cmd::kCheck);
      out.value<std::uint64_t>(keys.size());
      for (const auto& k : keys) out.str("/" + k);
      send_all(fd_, out.bytes);
      read(&ready, 1);
    });
    return ready == 0;
  }

  void wait(const std::vector<std::string>& keys, double timeout_s) {
    std::lock_guard lock(mutex_);
    wait_locked(keys, timeout_s > 0 ? timeout_s : timeout_s_);
  }

 private:
  Out start(Cmd c) const {
    Out out;
    if (query_magic_) out.value(kQueryMagic);
    out.value<std::uint8_t>(wire_code(c, protocol_));
    return out;
  }

  // Tells the server's generation on the connection fd_ (dialled) and leaves fd_ open
  // for it; false with `why` when the server is not (yet) answering. Each generation is
  // confirmed by an answer, never assumed; every server answers a query it understands
  // at once, so each probe waits kProbeS at most and a probe that is not answered is
  // closed before the next (a query-magic server reads a probe it does not understand
  // in 4-byte pieces and waits for the rest of the last one):
  //   1. VALIDATE + PING, the nonce comes back: recent PyTorch 2.x servers and ndmesh's.
  //   2. The query magic + GETNUMKEYS (1.x numbers), an 8-byte count back: a PyTorch 2.x
  //      server from before VALIDATE. The others close the connection on its first byte.
  //   3. PyTorch 1.x's GETNUMKEYS alone, a count back: 1.x (no handshake, 1.x numbers).
  //   4. VALIDATE + GETNUMKEYS (2.x numbers), a count back: a 2.x server from before PING
  //      (it accepts VALIDATE only first, and closes on PING).
  bool identify(Clock::time_point deadline, std::string& why) {
    auto probe_deadline = [&] { return std::min(deadline, after(kProbeS)); };
    const std::uint32_t nonce = std::random_device{}() | 0x80000000u;  // a v1 server reads a huge length
    Out v2;
    v2.value<std::uint8_t>(static_cast<std::uint8_t>(Cmd::kValidate)).value(kValidationMagic);
    v2.value<std::uint8_t>(static_cast<std::uint8_t>(Cmd::kPing)).value(nonce);
    std::string seen;
    try {
      send_all(fd_, v2.bytes);
      std::uint32_t echo = 0;
      if (recv_exact(fd_, &echo, sizeof echo, probe_deadline())) {
        if (echo != nonce) {
          why = fmt::format("PING {:#x} was answered with {:#x}: not a c10d TCPStore", nonce, echo);
          return false;
        }
        protocol_ = 2;
        generation_ = "v2";
        return true;
      }
      seen = fmt::format("no answer within {:g} s", kProbeS);
    } catch (const std::exception& e) {
      seen = e.what();
    }
    // A count back from GETNUMKEYS in `protocol`'s numbering, after `opening`, on a new
    // connection.
    auto count_answered = [&](int protocol, const std::string& opening, std::string& what) {
      ::close(fd_);
      fd_ = dial(host_, port_, what);
      if (fd_ < 0) return false;
      try {
        Out out;
        out.bytes = opening;
        out.value<std::uint8_t>(wire_code(Cmd::kGetNumKeys, protocol));
        send_all(fd_, out.bytes);
        std::int64_t count = 0;
        if (recv_exact(fd_, &count, sizeof count, probe_deadline())) return true;
        what = fmt::format("no answer within {:g} s", kProbeS);
      } catch (const std::exception& e) {
        what = e.what();
      }
      return false;
    };
    std::string magic_why, v1_why, old_why;
    Out magic;
    magic.value(kQueryMagic);
    if (count_answered(1, magic.bytes, magic_why)) {
      protocol_ = 1;
      query_magic_ = true;
      generation_ = "query magic";
      log::debug("[store] {} is a PyTorch 2.x server from before VALIDATE: every query opens with the magic ({})",
                 address_, seen);
      return true;
    }
    if (count_answered(1, "", v1_why)) {
      protocol_ = 1;
      generation_ = "v1";
      log::debug("[store] {} speaks PyTorch 1.x's protocol ({})", address_, seen);
      return true;
    }
    Out validate;
    validate.value<std::uint8_t>(static_cast<std::uint8_t>(Cmd::kValidate)).value(kValidationMagic);
    if (count_answered(2, validate.bytes, old_why)) {
      protocol_ = 2;
      generation_ = "v2 without PING";
      log::debug("[store] {} speaks PyTorch 2.x's protocol from before PING ({})", address_, seen);
      return true;
    }
    why = fmt::format(
        "the server at {} answered no c10d TCPStore generation: PyTorch 2.x's VALIDATE + PING: {}; the query "
        "magic + GETNUMKEYS: {}; PyTorch 1.x's GETNUMKEYS: {}; VALIDATE + GETNUMKEYS: {}",
        address_, seen, magic_why, v1_why, old_why);
    return false;
  }

  // "a PyTorch 1.x server", for messages.
  std::string kind() const {
    if (generation_ == "v1") return "a PyTorch 1.x server";
    if (generation_ == "query magic") return "a PyTorch 2.x server from before VALIDATE (a magic per query)";
    if (generation_ == "v2 without PING") return "a PyTorch 2.x server from before PING";
    return "a PyTorch 2.x or ndmesh server";
  }

  // Reads a reply; the server answers at once, so a bound of the default timeout only
  // guards against a server that stopped.
  void read(void* out, std::size_t n) {
    if (!recv_exact(fd_, out, n, after(timeout_s_)))
      throw std::runtime_error(fmt::format("no reply within {:g} s", timeout_s_));
  }

  template <typename F>
  void guarded(const char* op, const std::string& key, F&& f) {
    if (fd_ < 0)
      fail<>("store", "{} of '{}': the connection to the store at {} was lost earlier", op, key, address_);
    try {
      f();
    } catch (const std::exception& e) {
      ::close(fd_);
      fd_ = -1;
      fail<>("store",
             "{} of '{}' on the store at {} ({}) failed: {}; the process serving it (rank 0 or the launcher) may "
             "have exited",
             op, key, address_, kind(), e.what());
    }
  }

  void wait_locked(const std::vector<std::string>& keys, double timeout_s) {
    bool done = false;
    const std::string first = keys.empty() ? "" : keys.front();
    guarded("wait", first, [&] {
      Out out = start(Cmd::kWait);
      out.value<std::uint64_t>(keys.size());
      for (const auto& k : keys) out.str("/" + k);
      send_all(fd_, out.bytes);
      std::uint8_t reply = 0;
      done = recv_exact(fd_, &reply, 1, after(timeout_s));
      if (!done && protocol_ == 2) {
        // Cancel; the server may have answered STOP_WAITING just before.
        send_all(fd_, start(Cmd::kCancelWait).bytes);
        read(&reply, 1);
        if (reply == 0) read(&reply, 1);
      }
    });
    if (done) return;
    if (protocol_ == 1) {  // v1 cannot cancel a wait: a new connection drops it
      ::close(fd_);
      std::string why;
      fd_ = dial(host_, port_, why);
    }
    fail<>(
        "store", "waited {:g} s at {} for {} key(s) that were never set: {}", timeout_s, address_,
        keys.size(),
        fmt::join(keys.size() > 4 ? std::vector<std::string>(keys.begin(), keys.begin() + 4) : keys, ", "));
  }

  std::string host_;
  int port_;
  double timeout_s_;
  std::string address_;
  int protocol_ = 2;
  bool query_magic_ = false;  // every query opens with kQueryMagic
  std::string generation_ = "v2";
  int fd_ = -1;
  std::mutex mutex_;
};

// The server thread: one thread polling non-blocking sockets (as torch's classic
// backend). It moves bytes between the sockets and StoreCore, which holds the protocol.
class StoreDaemon {
 public:
  StoreDaemon(const std::string& host, int port, const std::string& port_variable, StoreLimits limits)
      : core_(limits) {
    open_listeners(host, port, port_variable);
    if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) fail<>("store", "pipe: {}", errno_text(errno));
    thread_ = std::thread([this] { run(); });
  }
  ~StoreDaemon() {
    char c = 0;
    (void)!::write(stop_pipe_[1], &c, 1);
    thread_.join();
    for (int fd : fds_) ::close(fd);
    for (int fd : listen_fds_) ::close(fd);
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
  }
  StoreDaemon(const StoreDaemon&) = delete;
  StoreDaemon& operator=(const StoreDaemon&) = delete;
  int port() const { return port_; }

 private:
  // Listens on every address `host` resolves to (MASTER_ADDR: 127.0.0.1 for a local
  // launch, the node's address otherwise), never on all interfaces.
  void open_listeners(const std::string& host, int port, const std::string& port_variable) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0)
      fail<ConfigError>("store",
                        "MASTER_ADDR={} cannot be resolved ({}); give an address or name of rank 0's host",
                        host, gai_strerror(rc));
    int last_errno = 0;
    port_ = port;
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
      int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        last_errno = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // past TIME_WAIT, never a live listener
      if (a->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
      sockaddr_storage addr{};
      std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
      // Every address gets the same port (the first one's, when the kernel picks it).
      if (a->ai_family == AF_INET6)
        reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<std::uint16_t>(port_));
      else
        reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<std::uint16_t>(port_));
      if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
        listen_fds_.push_back(fd);
        if (port_ == 0) {
          socklen_t len = sizeof addr;
          ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
          port_ = ntohs(a->ai_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
        }
        continue;
      }
      last_errno = errno;
      ::close(fd);
      if (last_errno == EADDRINUSE) break;
    }
    ::freeaddrinfo(res);
    if (last_errno == EADDRINUSE) {
      for (int fd : listen_fds_) ::close(fd);
      fail<ConfigError>(
          "store",
          "{}={} is in use on this host (another job or program listens there); choose a free port "
          "for every process of the job, e.g. {}={}",
          port_variable, port, port_variable, port == 65535 ? 29500 : port + 1);
    }
    if (listen_fds_.empty()) {
      if (last_errno == EADDRNOTAVAIL)
        fail<ConfigError>("store",
                          "MASTER_ADDR={} is not an address of this host, so rank 0 cannot serve the store "
                          "there; set MASTER_ADDR to rank 0's host (127.0.0.1 when every rank runs here)",
                          host);
      fail<>("store", "cannot listen at {} port {} ({}={}): {}", host, port, port_variable, port,
             errno_text(last_errno));
    }
  }

  void drop(int fd, const std::string& why) {
    log::debug("[store] dropping client {}: {}", fd, why);
    core_.close(fd);
    fds_.erase(fd);
    ::close(fd);
  }

  void accept_all(int listen_fd) {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          // Out of descriptors or memory: the connection stays in the backlog, and polling
          // the listener again at once would spin. Pause accepting for a while.
          log::debug("[store] accept: {}; accepting again in 100 ms", errno_text(errno));
          accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      if (!core_.open(fd)) {
        log::debug("[store] refusing a client: {} connections are open", core_.clients());
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fds_.insert(fd);
    }
  }

  // Sends what is queued for `fd` until the socket would block; false when it failed.
  bool flush(int fd, std::string& why) {
    for (;;) {
      const std::string& out = core_.output(fd);
      if (out.empty()) return true;
      ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0) {
        why = "send: " + errno_text(errno);
        return false;
      }
      core_.sent(fd, static_cast<std::size_t>(n));
    }
  }

  void flush_all() {
    for (int fd : core_.with_output()) {
      std::string why;
      if (!flush(fd, why)) drop(fd, why);
    }
  }

  void run() {
    std::vector<char> buf(1 << 16);
    std::vector<pollfd> pfds;
    for (;;) {
      pfds.clear();
      pfds.push_back({stop_pipe_[0], POLLIN, 0});
      const bool accepting = Clock::now() >= accept_paused_until_;
      if (accepting)
        for (int fd : listen_fds_) pfds.push_back({fd, POLLIN, 0});
      const std::size_t first_client = pfds.size();
      for (int fd : fds_)
        pfds.push_back({fd, static_cast<short>(POLLIN | (core_.output(fd).empty() ? 0 : POLLOUT)), 0});
      if (::poll(pfds.data(), pfds.size(), accepting ? -1 : 100) < 0) {
        if (errno == EINTR) continue;
        log::error("[store] the store's server at port {} stopped: poll: {}", port_, errno_text(errno));
        return;
      }
      if (pfds[0].revents != 0) return;
      for (std::size_t i = 1; i < first_client; ++i)
        if (pfds[i].revents != 0) accept_all(pfds[i].fd);
      for (std::size_t i = first_client; i < pfds.size(); ++i) {
        const int fd = pfds[i].fd;
        if (pfds[i].revents == 0 || !fds_.count(fd)) continue;
        std::string why;
        if (pfds[i].revents & POLLOUT) {
          if (!flush(fd, why)) {
            drop(fd, why);
            continue;
          }
        }
        if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n <= 0) {
          drop(fd, n == 0 ? "closed the connection" : "recv: " + errno_text(errno));
          continue;
        }
        if (!core_.receive(fd, buf.data(), static_cast<std::size_t>(n), why)) drop(fd, why);
      }
      flush_all();
    }
  }

  StoreCore core_;
  std::vector<int> listen_fds_;
  int port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::set<int> fds_;
  Clock::time_point accept_paused_until_{};
  std::thread thread_;  // last: started after the members it uses
};

}  // namespace detail

Store Store::connect(const std::string& host, int port, double timeout_s) {
  return Store(std::make_shared<detail::StoreConnection>(host, port, timeout_s), "");
}

Store Store::prefixed(const std::string& prefix) const { return Store(conn_, prefix_ + prefix); }
void Store::set(const std::string& key, const std::string& value) const { conn_->set(prefix_ + key, value); }
std::string Store::get(const std::string& key) const { return conn_->get(prefix_ + key); }
std::int64_t Store::add(const std::string& key, std::int64_t delta) const {
  return conn_->add(prefix_ + key, delta);
}

bool Store::check(const std::vector<std::string>& keys) const {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return conn_->check(full);
}

void Store::wait(const std::vector<std::string>& keys, double timeout_s) const {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  conn_->wait(full, timeout_s);
}

std::string Store::share(const std::string& key, bool is_root, const std::string& value) const {
  if (!is_root) return get(key);
  set(key, value);
  return value;
}

int Store::protocol() const { return conn_->protocol(); }
const std::string& Store::generation() const { return conn_->generation(); }
double Store::timeout_s() const { return conn_->timeout_s(); }
const std::string& Store::address() const { return conn_->address(); }

StoreServer::StoreServer(const std::string& host, int port, const std::string& port_variable,
                         const detail::StoreLimits& limits)
    : daemon_(std::make_unique<detail::StoreDaemon>(host, port, port_variable, limits)) {}
StoreServer::~StoreServer() = default;
int StoreServer::port() const { return daemon_->port(); }

}  // namespace ndmesh::launch
