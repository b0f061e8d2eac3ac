// The TCP store: ndmesh's server with ndmesh's clients (protocol v2), a real PyTorch
// TCPStore client against ndmesh's server (Debian's PyTorch 1.13 speaks protocol v1;
// skipped when no python3 imports torch), and the errors.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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
