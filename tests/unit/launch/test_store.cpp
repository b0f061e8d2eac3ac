// The TCP store: ndmesh's server with ndmesh's clients (protocol v2), a real PyTorch
// TCPStore client against ndmesh's server (Debian's PyTorch 1.13 speaks protocol v1;
// skipped when no python3 imports torch), and the errors.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dirent.h>
#include <poll.h>
#include <atomic>
#include <cstring>
#include <map>
#include <vector>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::launch {
namespace {

using detail::Cmd;
using detail::kValidationMagic;

// A raw TCP client on 127.0.0.1 (or `ip`), for what ndmesh's own client never sends.
int raw_connect(int port, const char* ip = "127.0.0.1") {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, ip, &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

struct Bytes {
  std::string b;
  template <typename T>
  Bytes& value(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& cmd(Cmd c) { return value<std::uint8_t>(static_cast<std::uint8_t>(c)); }
  Bytes& str(const std::string& s) {
    value<std::uint64_t>(s.size());
    b += s;
    return *this;
  }
};

// True when the server closes `fd` within `seconds` (what it sent meanwhile is read).
bool closed_within(int fd, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    timeval tv{0, 100000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
  }
  return false;
}

TEST(Store, SetGetAddCheckWaitShareOverOneServer) {
  StoreServer server("127.0.0.1", 0);
  Store a = Store::connect("127.0.0.1", server.port(), 10);
  Store b = Store::connect("localhost", server.port(), 10);
  EXPECT_EQ(a.protocol(), 2);
  a.set("k", std::string("v\0w", 3));
  EXPECT_EQ(b.get("k"), std::string("v\0w", 3));
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -2), 3);
  EXPECT_EQ(a.add("n", 0), 3);
  EXPECT_TRUE(b.check({"k", "n"}));
  EXPECT_FALSE(b.check({"k", "missing"}));
  // A wait returns once another client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a.set("late", "x");
  });
  b.wait({"late", "k"}, 10);
  setter.join();
  EXPECT_EQ(b.get("late"), "x");
}

TEST(Store, PrefixesSeparateKeysAndShareGivesTheRootsValue) {
  StoreServer server("127.0.0.1", 0);
  Store root = Store::connect("127.0.0.1", server.port(), 10);
  Store other = Store::connect("127.0.0.1", server.port(), 10);
  Store g1 = root.prefixed("g1/"), g2 = other.prefixed("g2/");
  g1.set("x", "one");
  g2.set("x", "two");
  EXPECT_EQ(other.prefixed("g1/").get("x"), "one");
  EXPECT_EQ(root.get("g2/x"), "two");
  std::thread peer([&] { EXPECT_EQ(other.prefixed("nccl/").share("id", false), "unique-id-bytes"); });
  EXPECT_EQ(root.prefixed("nccl/").share("id", true, "unique-id-bytes"), "unique-id-bytes");
  peer.join();
}

TEST(Store, WaitTimesOutNamingTheKeysAndTheConnectionStaysUsable) {
  StoreServer server("127.0.0.1", 0);
  Store s = Store::connect("127.0.0.1", server.port(), 10);
  auto start = std::chrono::steady_clock::now();
  try {
    s.wait({"never"}, 0.3);
    FAIL() << "the wait must time out";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
  s.set("after", "ok");  // the wait was cancelled, the connection goes on
  EXPECT_EQ(s.get("after"), "ok");
}

TEST(Store, APortInUseIsAConfigErrorNamingTheVariable) {
  StoreServer first("127.0.0.1", 0);
  try {
    StoreServer second("127.0.0.1", first.port(), "MASTER_PORT");
    FAIL() << "a second server on the same port must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT=" + std::to_string(first.port()) + " is in use"),
              std::string::npos)
        << e.what();
  }
}

TEST(Store, NoServerIsAnErrorAfterTheTimeout) {
  // A port nobody listens on: bind one, close it.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(Store::connect("127.0.0.1", port, 0.5), Error);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 5);
}

// PyTorch's own client (protocol v1 in Debian's 1.13) against ndmesh's server: it sets a
// key ndmesh reads, reads a key ndmesh set, adds and waits.
TEST(Store, PyTorchClientAgainstNdmeshServer) {
  const char* python = "/usr/bin/python3";
  std::string probe = std::string(python) + " -c 'import torch.distributed' > /dev/null 2>&1";
  if (access(python, X_OK) != 0 || std::system(probe.c_str()) != 0) GTEST_SKIP() << "no python3 with torch";
  StoreServer server("127.0.0.1", 0);
  Store s = Store::connect("127.0.0.1", server.port(), 30);
  s.set("from_ndmesh", "hello");
  s.add("count", 40);
  std::string script = std::string(python) + " -c '" +
                       "import datetime, torch.distributed as d\n"
                       "c = d.TCPStore(\"127.0.0.1\", " +
                       std::to_string(server.port()) +
                       ", 2, False, datetime.timedelta(seconds=30))\n"
                       "assert c.get(\"from_ndmesh\") == b\"hello\", c.get(\"from_ndmesh\")\n"
                       "assert c.add(\"count\", 2) == 42\n"
                       "c.set(\"from_torch\", b\"world\")\n"
                       "c.wait([\"from_ndmesh\", \"from_torch\"])'";
  ASSERT_EQ(std::system(script.c_str()), 0) << script;
  EXPECT_EQ(s.get("from_torch"), "world");
  EXPECT_EQ(s.add("count", 0), 42);
}

}  // namespace
}  // namespace ndmesh::launch

namespace ndmesh::launch {
namespace {

// The 22-byte frame (VALIDATE, MULTI_SET with a count of 2^26) and a client that sends
// requests and never reads the replies: both are dropped, and another client is served
// meanwhile, at once.
TEST(StoreServer, AHugeCountAndANeverReadingClientAreDroppedAndOthersGoOn) {
  StoreServer server("127.0.0.1", 0);
  Store s = Store::connect("127.0.0.1", server.port(), 10);
  s.set("big", std::string(std::size_t{1} << 20, 'x'));

  int attack = raw_connect(server.port());
  ASSERT_GE(attack, 0);
  Bytes frame;
  frame.cmd(Cmd::kValidate).value(kValidationMagic).cmd(Cmd::kMultiSet);
  frame.value<std::uint64_t>(std::uint64_t{1} << 26).value<std::uint64_t>(0);
  ASSERT_EQ(frame.b.size(), 22u);
  ASSERT_EQ(::send(attack, frame.b.data(), frame.b.size(), MSG_NOSIGNAL), 22);
  EXPECT_TRUE(closed_within(attack, 5)) << "the 22-byte frame must drop its client";
  ::close(attack);

  // GET of a 1 MiB value, again and again, never reading: the server's queue for this
  // client fills (24 MiB) and it is dropped; meanwhile the other client is answered.
  int slow = raw_connect(server.port());
  ASSERT_GE(slow, 0);
  ::fcntl(slow, F_SETFL, O_NONBLOCK);
  Bytes hello;
  hello.cmd(Cmd::kValidate).value(kValidationMagic);
  ASSERT_EQ(::send(slow, hello.b.data(), hello.b.size(), MSG_NOSIGNAL), 5);
  Bytes get;
  get.cmd(Cmd::kGet).str("/big");
  const auto start = std::chrono::steady_clock::now();
  int gets = 0, adds = 0;
  bool dropped = false;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
    ssize_t n = ::send(slow, get.b.data(), get.b.size(), MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } else if (n < 0) {
      dropped = true;  // EPIPE / ECONNRESET: the server closed it
      break;
    } else {
      ASSERT_EQ(n, static_cast<ssize_t>(get.b.size()));
      ++gets;
    }
    if (gets / 8 > adds) {
      // The other client is answered while the slow one piles up replies.
      auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(s.add("n", 1), ++adds);
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2);
    }
  }
  EXPECT_TRUE(dropped) << gets << " GETs of 1 MiB never read, and the client is still served";
  EXPECT_GT(gets, 20);
  ::close(slow);
  EXPECT_EQ(s.get("big").size(), std::size_t{1} << 20);
}

// Out of descriptors, accept fails with EMFILE while the connection waits in the backlog:
// the server pauses accepting instead of polling the listener in a busy loop.
TEST(StoreServer, AcceptFailingWithEmfileDoesNotSpin) {
  StoreServer server("127.0.0.1", 0);
  Store s = Store::connect("127.0.0.1", server.port(), 10);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  // Every descriptor taken but one, which the client's socket takes: none is left for accept.
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 256);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
  ASSERT_FALSE(filler.empty());
  ::close(filler.back());
  filler.pop_back();
  int fds[1] = {raw_connect(server.port())};
  const int opened = fds[0] >= 0 ? 1 : 0;
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ::getrusage(RUSAGE_SELF, &after);
  for (int fd : filler) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
  auto cpu = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
  };
  ASSERT_GE(opened, 1) << "no connection waited in the backlog";
  EXPECT_LT(cpu(after) - cpu(before), 0.1) << "the server thread spun on accept";
  s.set("after", "ok");  // accepting again once descriptors are back
  Store late = Store::connect("127.0.0.1", server.port(), 10);
  EXPECT_EQ(late.get("after"), "ok");
}

// The server listens at MASTER_ADDR only: on 127.0.0.1 it is not reachable at the host's
// other addresses; an address of no interface here is a ConfigError naming MASTER_ADDR.
TEST(StoreServer, ListensAtMasterAddrOnly) {
  StoreServer server("127.0.0.1", 0);
  std::string other;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a != nullptr && other.empty(); a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      char ip[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, ip, sizeof ip);
      if (std::string(ip).rfind("127.", 0) != 0) other = ip;
    }
    ::freeifaddrs(list);
  }
  try {
    StoreServer nowhere("192.0.2.1", 0);  // TEST-NET-1: an address of no host
    FAIL() << "a MASTER_ADDR of no interface here must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR=192.0.2.1 is not an address of this host"),
              std::string::npos)
        << e.what();
  }
  if (other.empty()) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  int fd = raw_connect(server.port(), other.c_str());
  EXPECT_LT(fd, 0) << "the store on 127.0.0.1 answered at " << other;
  if (fd >= 0) ::close(fd);
  StoreServer there(other, 0);
  EXPECT_EQ(Store::connect(other, there.port(), 10).generation(), "v2");
}

// Two jobs whose ranks meet at one store (same MASTER_ADDR:MASTER_PORT, another
// TORCHELASTIC_RUN_ID) keep their keys apart: both rendezvous, neither sees its RANK
// taken twice.
TEST(StoreServer, TwoJobsOnOneStoreDoNotMix) {
  StoreServer server("127.0.0.1", 0);
  auto env = [&](const char* run_id, int rank) {
    LaunchEnv e;
    e.launcher = Launcher::kTorchrun;
    e.rank = rank;
    e.world_size = 2;
    e.master_addr = "127.0.0.1";
    e.master_port = server.port();
    e.agent_store = true;  // the test's server plays the agent's
    e.run_id = run_id;
    return e;
  };
  EXPECT_EQ(job_key_prefix(env("a", 0)), "ndmesh/a/attempt_0/");
  std::atomic<int> met{0};
  std::vector<std::thread> ranks;
  for (const char* id : {"a", "b"})
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, id, r] {
        try {
          JobStore job = rendezvous(env(id, r), 20);
          if (job.store.get("world_size") == "2") ++met;
        } catch (const Error& e) {
          ADD_FAILURE() << "job " << id << " rank " << r << ": " << e.what();
        }
      });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(met.load(), 4);
}

// A PyTorch 2.x server from before PING: VALIDATE first, PING closes the connection.
// The client finds it by asking (not by falling back to 1.x) and speaks 2.x to it.
TEST(StoreServer, ASecondGenerationServerWithoutPingIsSpokenTwoX) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(lfd, 8), 0);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  std::atomic<bool> stop{false};
  std::atomic<int> pings{0}, v1_probes{0};
  // Serves VALIDATE, SET, GET and GETNUMKEYS in 2.x numbers; closes on anything else
  // (PING, or a first command that is not VALIDATE), as 2.x servers from before PING do.
  std::thread fake([&] {
    std::map<std::string, std::string> data;
    while (!stop) {
      pollfd p{lfd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) continue;
      auto read_n = [&](void* out, std::size_t n) {
        return ::recv(fd, out, n, MSG_WAITALL) == static_cast<ssize_t>(n);
      };
      auto read_str = [&](std::string& str) {
        std::uint64_t n = 0;
        if (!read_n(&n, 8) || n > 4096) return false;
        str.resize(n);
        return n == 0 || read_n(str.data(), n);
      };
      bool validated = false;
      for (;;) {
        std::uint8_t code = 255;
        if (!read_n(&code, 1)) break;
        if (!validated && code != 0) {
          ++v1_probes;
          break;
        }
        if (code == 0) {
          std::uint32_t magic = 0;
          if (!read_n(&magic, 4) || magic != kValidationMagic) break;
          validated = true;
        } else if (code == 1) {
          std::string k, v;
          if (!read_str(k) || !read_str(v)) break;
          data[k] = v;
        } else if (code == 3) {
          std::string k;
          if (!read_str(k)) break;
          Bytes r;
          r.str(data[k]);
          ::send(fd, r.b.data(), r.b.size(), MSG_NOSIGNAL);
        } else if (code == 6) {  // WAIT: the keys are set already in this test
          std::uint64_t n = 0;
          std::string k;
          if (!read_n(&n, 8)) break;
          for (std::uint64_t i = 0; i < n; ++i)
            if (!read_str(k)) break;
          const char stop_waiting = 0;
          ::send(fd, &stop_waiting, 1, MSG_NOSIGNAL);
        } else if (code == 7) {
          Bytes r;
          r.value<std::int64_t>(static_cast<std::int64_t>(data.size()));
          ::send(fd, r.b.data(), r.b.size(), MSG_NOSIGNAL);
        } else {
          if (code == 13) ++pings;
          break;
        }
      }
      ::close(fd);
    }
  });
  try {
    Store s = Store::connect("127.0.0.1", port, 10);
    EXPECT_EQ(s.protocol(), 2);
    EXPECT_EQ(s.generation(), "v2 without PING");
    s.set("k", "v");
    EXPECT_EQ(s.get("k"), "v");
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  stop = true;
  fake.join();
  ::close(lfd);
  EXPECT_GE(pings.load(), 1);
  EXPECT_GE(v1_probes.load(), 1);
}

}  // namespace
}  // namespace ndmesh::launch
