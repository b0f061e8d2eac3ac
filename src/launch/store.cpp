// The c10d TCPStore protocol, client and server (see store.hpp for the two versions).
// Every number is little-endian as the host writes it (torch sends raw host values);
// strings and byte vectors are a uint64 length followed by the bytes. Replies: GET and
// COMPARE_SET a byte vector, ADD / GETNUMKEYS / DELETE_KEY an int64, CHECK one byte
// (0 ready, 1 not ready), WAIT one byte (0 stop waiting, 1 wait canceled) once every key
// is set, PING the nonce back.
//
// The server is one thread polling its sockets (as torch's classic backend): it reads
// what has arrived into each client's buffer and runs every complete command in it.
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
#include <thread>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"

namespace ndmesh::launch {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
constexpr std::size_t kMaxString = std::size_t{256} << 20;  // a sanity bound on one key or value

// Commands, numbered as in the v2 protocol; v1 numbers are mapped onto these.
enum class Cmd : std::uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kUnknown = 255,
};

// PyTorch 1.x numbering: SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY.
constexpr Cmd kV1[] = {Cmd::kSet,  Cmd::kCompareSet, Cmd::kGet,     Cmd::kAdd,      Cmd::kCheck,
                       Cmd::kWait, Cmd::kGetNumKeys, Cmd::kUnknown, Cmd::kDeleteKey};

std::uint8_t wire_code(Cmd c, int protocol) {
  if (protocol == 2) return static_cast<std::uint8_t>(c);
  for (std::size_t i = 0; i < std::size(kV1); ++i)
    if (kV1[i] == c) return static_cast<std::uint8_t>(i);
  fail<InternalError>("store", "command {} has no PyTorch 1.x code", static_cast<int>(c));
}

Cmd from_wire(std::uint8_t code, int protocol) {
  if (protocol == 2)
    return code <= static_cast<std::uint8_t>(Cmd::kPing) ? static_cast<Cmd>(code) : Cmd::kUnknown;
  return code < std::size(kV1) ? kV1[code] : Cmd::kUnknown;
}

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

// Reads from a buffer; false when the buffer ends first (the rest has not arrived).
struct In {
  const std::string& buf;
  std::size_t pos;
  template <typename T>
  bool value(T& v) {
    if (buf.size() - pos < sizeof v) return false;
    std::memcpy(&v, buf.data() + pos, sizeof v);
    pos += sizeof v;
    return true;
  }
  bool str(std::string& s) {
    std::uint64_t n = 0;
    if (!value(n)) return false;
    if (n > kMaxString) throw std::length_error(fmt::format("a string of {} bytes", n));
    if (buf.size() - pos < n) return false;
    s.assign(buf.data() + pos, n);
    pos += n;
    return true;
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
      for (int version : {2, 1}) {
        fd_ = dial(host_, port_, why);
        if (fd_ < 0) break;
        protocol_ = version;
        try {
          if (version == 1 || handshake(deadline)) return;
          why = "no answer to the handshake";
        } catch (const std::exception& e) {
          why = e.what();  // a v1 server resets the connection on the v2 handshake
        }
        ::close(fd_);
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
      if (n > kMaxString) throw std::runtime_error(fmt::format("a reply of {} bytes", n));
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
    out.value<std::uint8_t>(wire_code(c, protocol_));
    return out;
  }

  // The v2 opening: VALIDATE, then a PING whose nonce must come back.
  bool handshake(Clock::time_point deadline) {
    std::uint32_t nonce = std::random_device{}() | 0x80000000u;
    Out out;
    out.value<std::uint8_t>(static_cast<std::uint8_t>(Cmd::kValidate)).value(kValidationMagic);
    out.value<std::uint8_t>(static_cast<std::uint8_t>(Cmd::kPing)).value(nonce);
    send_all(fd_, out.bytes);
    std::uint32_t echo = 0;
    if (!recv_exact(fd_, &echo, sizeof echo, deadline)) return false;
    return echo == nonce;
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
             "{} of '{}' on the store at {} failed: {}; the process serving it (rank 0 or the launcher) may "
             "have exited",
             op, key, address_, e.what());
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
  int fd_ = -1;
  std::mutex mutex_;
};

// The server thread.
class StoreDaemon {
 public:
  StoreDaemon(int port, const std::string& port_variable) {
    listen_fd_ = open_listener(port, port_variable);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) fail<>("store", "pipe: {}", errno_text(errno));
    thread_ = std::thread([this] { run(); });
  }
  ~StoreDaemon() {
    char c = 0;
    (void)!::write(stop_pipe_[1], &c, 1);
    thread_.join();
    for (auto& [fd, client] : clients_) ::close(fd);
    ::close(listen_fd_);
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
  }
  StoreDaemon(const StoreDaemon&) = delete;
  StoreDaemon& operator=(const StoreDaemon&) = delete;
  int port() const { return port_; }

 private:
  struct Client {
    std::string in;
    int protocol = 0;  // 0 until the first bytes tell
    std::size_t awaited = 0;
  };

  static int open_listener(int port, const std::string& port_variable) {
    int last_errno = 0;
    for (int family : {AF_INET6, AF_INET}) {
      int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        last_errno = errno;
        continue;
      }
      int one = 1, zero = 0;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // past TIME_WAIT, never a live listener
      sockaddr_storage addr{};
      socklen_t len = 0;
      if (family == AF_INET6) {
        ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons(static_cast<std::uint16_t>(port));
        len = sizeof *a;
      } else {
        auto* a = reinterpret_cast<sockaddr_in*>(&addr);
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons(static_cast<std::uint16_t>(port));
        len = sizeof *a;
      }
      if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 && ::listen(fd, 1024) == 0) return fd;
      last_errno = errno;
      ::close(fd);
      if (last_errno == EADDRINUSE) break;
    }
    if (last_errno == EADDRINUSE)
      fail<ConfigError>(
          "store",
          "{}={} is in use on this host (another job or program listens there); choose a free port "
          "for every process of the job, e.g. {}={}",
          port_variable, port, port_variable, port == 65535 ? 29500 : port + 1);
    fail<>("store", "cannot listen on port {} ({}={}): {}", port, port_variable, port,
           errno_text(last_errno));
  }

  void run() {
    for (;;) {
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
      for (auto& [fd, client] : clients_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;
      if (fds[0].revents & POLLIN) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients_[fd] = Client{};
        }
      }
      for (std::size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        int fd = fds[i].fd;
        char buf[65536];
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        bool keep = n > 0;
        if (keep) {
          clients_[fd].in.append(buf, static_cast<std::size_t>(n));
          try {
            keep = serve(fd, clients_[fd]);
          } catch (const std::exception& e) {
            log::debug("[store] dropping a client: {}", e.what());
            keep = false;
          }
        }
        if (!keep) drop(fd);
      }
    }
  }

  void drop(int fd) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      auto& v = it->second;
      v.erase(std::remove(v.begin(), v.end(), fd), v.end());
      it = v.empty() ? waiting_.erase(it) : std::next(it);
    }
    ::close(fd);
    clients_.erase(fd);
  }

  // Runs every complete command in the client's buffer; false: close the connection.
  bool serve(int fd, Client& c) {
    if (c.protocol == 0) {
      if (c.in.size() < 5 && static_cast<std::uint8_t>(c.in[0]) == 0) return true;
      std::uint32_t magic = 0;
      if (c.in.size() >= 5) std::memcpy(&magic, c.in.data() + 1, sizeof magic);
      c.protocol = static_cast<std::uint8_t>(c.in[0]) == 0 && magic == kValidationMagic ? 2 : 1;
      if (c.protocol == 2) c.in.erase(0, 5);
    }
    std::size_t pos = 0;
    for (;;) {
      In in{c.in, pos};
      std::uint8_t code = 0;
      if (!in.value(code)) break;
      Out reply;
      bool complete = run_command(fd, c, from_wire(code, c.protocol), in, reply);
      if (!complete) break;
      if (!reply.bytes.empty()) send_all(fd, reply.bytes);
      pos = in.pos;
    }
    c.in.erase(0, pos);
    return true;
  }

  // Parses one command and runs it; false when it has not fully arrived.
  bool run_command(int fd, Client& c, Cmd cmd, In& in, Out& reply) {
    std::string key, value, expected;
    switch (cmd) {
      case Cmd::kPing: {
        std::uint32_t nonce = 0;
        if (!in.value(nonce)) return false;
        reply.value(nonce);
        return true;
      }
      case Cmd::kSet:
      case Cmd::kAppend:
        if (!in.str(key) || !in.str(value)) return false;
        if (cmd == Cmd::kAppend) value = data_[key] + value;
        put(key, std::move(value));
        return true;
      case Cmd::kCompareSet: {
        if (!in.str(key) || !in.str(expected) || !in.str(value)) return false;
        auto it = data_.find(key);
        if (it == data_.end()) {
          if (expected.empty()) put(key, value);
          reply.str(expected.empty() ? value : expected);
        } else {
          if (it->second == expected) put(key, std::move(value));
          reply.str(data_[key]);
        }
        return true;
      }
      case Cmd::kGet: {
        if (!in.str(key)) return false;
        auto it = data_.find(key);
        reply.str(it == data_.end() ? std::string() : it->second);
        return true;
      }
      case Cmd::kAdd: {
        std::int64_t delta = 0;
        if (!in.str(key) || !in.value(delta)) return false;
        auto it = data_.find(key);
        std::int64_t sum = delta + (it == data_.end() ? 0 : std::strtoll(it->second.c_str(), nullptr, 10));
        put(key, std::to_string(sum));
        reply.value(sum);
        return true;
      }
      case Cmd::kCheck:
      case Cmd::kWait:
      case Cmd::kMultiGet: {
        std::uint64_t n = 0;
        if (!in.value(n)) return false;
        if (n > (1u << 20)) throw std::length_error("too many keys");
        std::vector<std::string> keys(n);
        for (auto& k : keys)
          if (!in.str(k)) return false;
        if (cmd == Cmd::kMultiGet) {
          for (const auto& k : keys) reply.str(data_.count(k) ? data_[k] : std::string());
          return true;
        }
        std::size_t missing = 0;
        for (const auto& k : keys)
          if (!data_.count(k)) {
            ++missing;
            if (cmd == Cmd::kWait) waiting_[k].push_back(fd);
          }
        if (cmd == Cmd::kCheck) {
          reply.value<std::uint8_t>(missing == 0 ? 0 : 1);
        } else if (missing == 0) {
          reply.value<std::uint8_t>(0);  // STOP_WAITING
        } else {
          c.awaited = missing;
        }
        return true;
      }
      case Cmd::kMultiSet: {
        std::uint64_t n = 0;
        if (!in.value(n)) return false;
        std::vector<std::pair<std::string, std::string>> kv(n);
        for (auto& [k, v] : kv)
          if (!in.str(k) || !in.str(v)) return false;
        for (auto& [k, v] : kv) put(k, std::move(v));
        return true;
      }
      case Cmd::kGetNumKeys:
        reply.value<std::int64_t>(static_cast<std::int64_t>(data_.size()));
        return true;
      case Cmd::kDeleteKey:
        if (!in.str(key)) return false;
        reply.value<std::int64_t>(static_cast<std::int64_t>(data_.erase(key)));
        return true;
      case Cmd::kCancelWait:
        for (auto& [k, fds] : waiting_) fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
        c.awaited = 0;
        reply.value<std::uint8_t>(1);  // WAIT_CANCELED
        return true;
      case Cmd::kValidate:
      case Cmd::kUnknown:
        break;
    }
    throw std::runtime_error("an unknown command");
  }

  void put(const std::string& key, std::string value) {
    data_[key] = std::move(value);
    auto it = waiting_.find(key);
    if (it == waiting_.end()) return;
    std::vector<int> fds = std::move(it->second);
    waiting_.erase(it);
    for (int fd : fds) {
      auto c = clients_.find(fd);
      if (c == clients_.end() || c->second.awaited == 0) continue;
      if (--c->second.awaited == 0) {
        try {
          send_all(fd, std::string(1, '\0'));  // STOP_WAITING
        } catch (const std::exception&) {
          // the client is gone; poll reports it next
        }
      }
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::map<int, Client> clients_;
  std::map<std::string, std::string> data_;
  std::map<std::string, std::vector<int>> waiting_;
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
double Store::timeout_s() const { return conn_->timeout_s(); }
const std::string& Store::address() const { return conn_->address(); }

StoreServer::StoreServer(int port, const std::string& port_variable)
    : daemon_(std::make_unique<detail::StoreDaemon>(port, port_variable)) {}
StoreServer::~StoreServer() = default;
int StoreServer::port() const { return daemon_->port(); }

}  // namespace ndmesh::launch
