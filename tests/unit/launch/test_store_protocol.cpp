// The store server's protocol without sockets (StoreCore, FrameParser): every bound a
// client can hit drops that client and only that client; a frame arriving in pieces is
// consumed field by field; ADD cannot overflow.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/launch/store_protocol.hpp"

namespace ndmesh::launch::detail {
namespace {

// A v2 request being built.
struct Frame {
  std::string bytes;
  template <typename T>
  Frame& value(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Frame& cmd(Cmd c) { return value<std::uint8_t>(static_cast<std::uint8_t>(c)); }
  Frame& str(const std::string& s) {
    value<std::uint64_t>(s.size());
    bytes += s;
    return *this;
  }
};

Frame validate() { return Frame().cmd(Cmd::kValidate).value(kValidationMagic); }

struct Core {
  StoreCore core;
  // Clients 1 and 2 are open.
  explicit Core(StoreLimits limits = {}) : core(limits) {
    core.open(1);
    core.open(2);
  }
  // Sends client `id`'s bytes; the reason it was dropped, "" when kept.
  std::string send(int id, const std::string& bytes) {
    std::string why;
    if (!core.receive(id, bytes.data(), bytes.size(), why)) {
      core.close(id);
      return why.empty() ? "dropped" : why;
    }
    return "";
  }
  std::string take(int id) {
    std::string out = core.output(id);
    core.sent(id, out.size());
    return out;
  }
};

TEST(StoreProtocol, TheTwentyTwoByteMultiSetIsDroppedBeforeAnyAllocation) {
  Core c;
  // VALIDATE, then MULTI_SET with a count of 2^26 and its first key's length: 22 bytes.
  Frame attack = validate();
  attack.cmd(Cmd::kMultiSet).value<std::uint64_t>(std::uint64_t{1} << 26).value<std::uint64_t>(0);
  ASSERT_EQ(attack.bytes.size(), 22u);
  std::string why;
  EXPECT_FALSE(c.core.receive(1, attack.bytes.data(), attack.bytes.size(), why));
  EXPECT_NE(why.find("a list of 67108864 keys (at most 131072)"), std::string::npos) << why;
  c.core.close(1);
  // The other client goes on.
  Frame ok = validate();
  ok.cmd(Cmd::kSet).str("/k").str("v").cmd(Cmd::kGet).str("/k");
  ASSERT_TRUE(c.core.receive(2, ok.bytes.data(), ok.bytes.size(), why)) << why;
  EXPECT_EQ(c.take(2), Frame().str("v").bytes);
}

TEST(StoreProtocol, EveryBoundDropsTheClient) {
  StoreLimits small;
  small.key_bytes = 16;
  small.value_bytes = 64;
  small.list_keys = 4;
  small.frame_bytes = 200;
  small.queued_bytes = 100;
  small.stored_bytes = 150;
  struct Case {
    const char* name;
    Frame frame;
    const char* why;
  };
  const std::string key17(17, 'k'), value65(65, 'v'), value60(60, 'v');
  std::vector<Case> cases = {
      {"key", validate().cmd(Cmd::kSet).str(key17).str("v"), "a key of 17 bytes (at most 16)"},
      {"value", validate().cmd(Cmd::kSet).str("/k").str(value65), "a value of 65 bytes (at most 64)"},
      {"value of compare-set", validate().cmd(Cmd::kCompareSet).str("/k").str("").str(value65),
       "a value of 65 bytes"},
      {"check list", validate().cmd(Cmd::kCheck).value<std::uint64_t>(5), "a list of 5 keys (at most 4)"},
      {"wait list", validate().cmd(Cmd::kWait).value<std::uint64_t>(5), "a list of 5 keys"},
      {"multi-get list", validate().cmd(Cmd::kMultiGet).value<std::uint64_t>(5), "a list of 5 keys"},
      {"multi-set list", validate().cmd(Cmd::kMultiSet).value<std::uint64_t>(5), "a list of 5 keys"},
      {"frame",
       validate()
           .cmd(Cmd::kMultiSet)
           .value<std::uint64_t>(4)
           .str("/a")
           .str(value60)
           .str("/b")
           .str(value60)
           .str("/c")
           .str(value60),
       "a request of more than 200 bytes"},
      {"stored",
       validate()
           .cmd(Cmd::kSet)
           .str("/a")
           .str(value60)
           .cmd(Cmd::kSet)
           .str("/b")
           .str(value60)
           .cmd(Cmd::kSet)
           .str("/c")
           .str(value60),
       "the store would hold"},
      {"queue",
       validate().cmd(Cmd::kSet).str("/a").str(value60).cmd(Cmd::kGet).str("/a").cmd(Cmd::kGet).str("/a"),
       "bytes of replies not read (at most 100)"},
      {"append", validate().cmd(Cmd::kSet).str("/a").str(value60).cmd(Cmd::kAppend).str("/a").str(value60),
       "APPEND to a value of more than 64 bytes"},
      {"wrong magic", Frame().cmd(Cmd::kValidate).value(kValidationMagic).cmd(Cmd::kValidate).value(1u),
       "VALIDATE with a wrong magic"},
      {"unknown command", validate().value<std::uint8_t>(200), "unknown command 200"},
  };
  for (const auto& k : cases) {
    Core c(small);
    EXPECT_NE(c.send(1, k.frame.bytes).find(k.why), std::string::npos)
        << k.name << ": " << c.send(1, k.frame.bytes);
  }
}

TEST(StoreProtocol, ConnectionsAreBounded) {
  StoreLimits small;
  small.connections = 2;
  StoreCore core(small);
  EXPECT_TRUE(core.open(1));
  EXPECT_TRUE(core.open(2));
  EXPECT_FALSE(core.open(3));
  core.close(1);
  EXPECT_TRUE(core.open(3));
}

TEST(StoreProtocol, AddCannotOverflow) {
  Core c;
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(c.send(1, validate().cmd(Cmd::kAdd).str("/n").value<std::int64_t>(max).bytes), "");
  Frame reply;
  reply.value<std::int64_t>(max);
  EXPECT_EQ(c.take(1), reply.bytes);
  EXPECT_NE(c.send(1, Frame().cmd(Cmd::kAdd).str("/n").value<std::int64_t>(1).bytes).find("overflows"),
            std::string::npos);
  Core d;
  EXPECT_NE(d.send(1, validate()
                          .cmd(Cmd::kAdd)
                          .str("/m")
                          .value<std::int64_t>(std::numeric_limits<std::int64_t>::min())
                          .cmd(Cmd::kAdd)
                          .str("/m")
                          .value<std::int64_t>(-1)
                          .bytes)
                .find("overflows"),
            std::string::npos);
}

// A frame that arrives in 3-byte pieces: the parser consumes each field once it is whole,
// so what the caller keeps is never more than the one field still arriving.
TEST(StoreProtocol, APartialFrameIsConsumedFieldByField) {
  Frame f;
  f.value<std::uint64_t>(300);
  for (int i = 0; i < 300; ++i) f.str("/key" + std::to_string(i)).str(std::string(i % 50, 'v'));
  StoreLimits limits;
  FrameParser parser(2, limits);
  std::string kept;
  kept.push_back(static_cast<char>(Cmd::kMultiSet));
  std::size_t most_kept = 0;
  FrameParser::Status status = FrameParser::Status::kMore;
  for (std::size_t at = 0; at < f.bytes.size(); at += 3) {
    kept += f.bytes.substr(at, 3);
    std::size_t consumed = 0;
    status = parser.feed(kept.data(), kept.size(), consumed);
    kept.erase(0, consumed);
    most_kept = std::max(most_kept, kept.size());
    if (at + 3 < f.bytes.size()) {
      ASSERT_EQ(status, FrameParser::Status::kMore) << at;
    }
  }
  ASSERT_EQ(status, FrameParser::Status::kDone);
  EXPECT_TRUE(kept.empty());
  EXPECT_LE(most_kept, 8u + 49u + 3u);  // one value's header and bytes, plus one piece
  ASSERT_EQ(parser.strings().size(), 600u);
  EXPECT_EQ(parser.strings()[598], "/key299");
  EXPECT_EQ(parser.strings()[599], std::string(299 % 50, 'v'));
}

TEST(StoreProtocol, WaitIsAnsweredWhenAnotherClientSetsAndCancelRemovesIt) {
  Core c;
  std::string why;
  Frame wait = validate();
  wait.cmd(Cmd::kWait).value<std::uint64_t>(2).str("/a").str("/b");
  ASSERT_TRUE(c.core.receive(1, wait.bytes.data(), wait.bytes.size(), why));
  EXPECT_EQ(c.take(1), "");
  // A second WAIT while one is pending is not a thing a client does: dropped.
  Frame set = validate();
  set.cmd(Cmd::kSet).str("/a").str("1");
  ASSERT_TRUE(c.core.receive(2, set.bytes.data(), set.bytes.size(), why));
  EXPECT_EQ(c.take(1), "");
  Frame set_b = Frame().cmd(Cmd::kSet).str("/b").str("2");
  ASSERT_TRUE(c.core.receive(2, set_b.bytes.data(), set_b.bytes.size(), why));
  EXPECT_EQ(c.take(1), std::string(1, '\0'));  // STOP_WAITING
  Frame wait_c = Frame().cmd(Cmd::kWait).value<std::uint64_t>(1).str("/c").cmd(Cmd::kCancelWait);
  ASSERT_TRUE(c.core.receive(1, wait_c.bytes.data(), wait_c.bytes.size(), why));
  EXPECT_EQ(c.take(1), std::string(1, '\1'));  // WAIT_CANCELED
  Frame again = Frame()
                    .cmd(Cmd::kWait)
                    .value<std::uint64_t>(1)
                    .str("/c")
                    .cmd(Cmd::kWait)
                    .value<std::uint64_t>(1)
                    .str("/d");
  EXPECT_FALSE(c.core.receive(1, again.bytes.data(), again.bytes.size(), why));
  EXPECT_EQ(why, "WAIT while a WAIT is pending");
}

// PyTorch 1.x numbering: no handshake, SET=0, GET=2, ADD=3, GETNUMKEYS=6.
TEST(StoreProtocol, VersionOneClientsAreServed) {
  Core c;
  Frame f;
  f.value<std::uint8_t>(0)
      .str("/k")
      .str("v1")
      .value<std::uint8_t>(2)
      .str("/k")
      .value<std::uint8_t>(3)
      .str("/n")
      .value<std::int64_t>(7)
      .value<std::uint8_t>(6);
  ASSERT_EQ(c.send(1, f.bytes), "");
  Frame reply;
  reply.str("v1").value<std::int64_t>(7).value<std::int64_t>(2);
  EXPECT_EQ(c.take(1), reply.bytes);
}

}  // namespace
}  // namespace ndmesh::launch::detail
