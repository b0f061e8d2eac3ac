// The server side of the c10d TCPStore protocol without sockets: a frame parser that
// resumes where the bytes stopped, and the store's state (keys, waiting clients, each
// client's queue of replies). The socket loop in store.cpp only moves bytes in and out;
// the fuzz target (fuzz/fuzz_store_frames.cpp) drives the same code with its own bytes.
//
// Everything a client can make the server hold is bounded (StoreLimits): a client that
// goes over a bound, sends an unknown command or a malformed frame is dropped (receive()
// returns false with the reason) and the others go on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ndmesh::launch::detail {

/// What one client, and all of them together, can make the server hold.
struct StoreLimits {
  std::size_t key_bytes = std::size_t{8} << 10;       ///< one key (PyTorch's own bound)
  std::size_t value_bytes = std::size_t{8} << 20;     ///< one value (PyTorch's own bound)
  std::uint64_t list_keys = 128 * 1024;               ///< keys of one CHECK/WAIT/MULTI_GET/MULTI_SET
  std::size_t frame_bytes = std::size_t{24} << 20;    ///< one request, as received
  std::size_t queued_bytes = std::size_t{24} << 20;   ///< replies not yet read by one client
  std::size_t stored_bytes = std::size_t{256} << 20;  ///< keys and values of the whole store
  std::size_t connections = 4096;                     ///< clients at once
};

/// The v2 handshake's magic (VALIDATE's argument).
inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
/// The magic that opens every query of the PyTorch 2.x servers from before VALIDATE
/// (store.hpp, "query magic"); the value the next generation sends once as VALIDATE's.
inline constexpr std::uint32_t kQueryMagic = kValidationMagic;

/// Commands, numbered as in the v2 protocol; v1 numbers are mapped onto these.
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

/// The byte for `c` in protocol 1 or 2 (InternalError for a command v1 lacks).
std::uint8_t wire_code(Cmd c, int protocol);
/// The command a byte means in protocol 1 or 2 (kUnknown when none).
Cmd from_wire(std::uint8_t code, int protocol);

/// One request being parsed. feed() takes the bytes after the ones it consumed before
/// and consumes every complete field, so a frame that arrives in pieces is read once.
class FrameParser {
 public:
  enum class Status { kMore, kDone, kBad };
  FrameParser(int protocol, const StoreLimits& limits) : protocol_(protocol), limits_(limits) {}

  /// Consumes what it can of data[0, n) into `consumed`; kDone when a frame is complete
  /// (see cmd(), strings(), number()), kBad with why() for a frame over a bound or an
  /// unknown command, kMore when the rest has not arrived.
  Status feed(const char* data, std::size_t n, std::size_t& consumed);
  Cmd cmd() const { return cmd_; }
  /// The keys and values in frame order.
  const std::vector<std::string>& strings() const { return strings_; }
  /// PING's nonce, VALIDATE's magic, ADD's delta, a list's count.
  std::int64_t number() const { return number_; }
  const std::string& why() const { return why_; }
  /// Ready for the next frame.
  void reset();

 private:
  enum class Field { kEnd, kU32, kI64, kCount, kKey, kValue };
  Field next_field() const;
  int protocol_;
  StoreLimits limits_;
  bool have_cmd_ = false;
  Cmd cmd_ = Cmd::kUnknown;
  std::size_t fields_ = 0;  // fields parsed after the command byte
  std::size_t bytes_ = 0;   // bytes of this frame consumed
  std::uint64_t count_ = 0;
  std::int64_t number_ = 0;
  std::vector<std::string> strings_;
  std::string why_;
};

/// The store's state and every client's protocol state, without sockets.
class StoreCore {
 public:
  explicit StoreCore(StoreLimits limits = {}) : limits_(limits) {}
  const StoreLimits& limits() const { return limits_; }

  /// A new client; false (nothing opened) when `connections` are open already.
  bool open(int id);
  /// Forgets a client and its waits.
  void close(int id);
  /// Runs every complete request in the bytes; replies go to output(id). False with
  /// `why` when the client must be dropped (close() it then).
  bool receive(int id, const char* data, std::size_t n, std::string& why);
  /// Bytes to send to `id`; the caller erases what it sent with sent().
  const std::string& output(int id) const;
  void sent(int id, std::size_t n);
  /// Clients with bytes to send (replies, or a wait another client's SET completed).
  std::vector<int> with_output() const;
  std::size_t clients() const { return clients_.size(); }
  std::size_t keys() const { return data_.size(); }

 private:
  struct Client {
    int protocol = 0;  // 0 until the first bytes tell
    std::string in;    // bytes not yet consumed by the parser, from in_head
    std::size_t in_head = 0;
    FrameParser parser{2, StoreLimits{}};  // replaced once the protocol is known
    std::string out;
    std::size_t awaited = 0;  // keys of a WAIT not yet set
  };
  bool run(int id, Client& c, std::string& why);
  bool reply(Client& c, std::size_t bytes, std::string& why) const;
  bool put(const std::string& key, std::string value, std::string& why);
  std::int64_t stored_size(const std::string& key) const;

  StoreLimits limits_;
  std::map<int, Client> clients_;
  std::map<std::string, std::string> data_;
  std::size_t stored_ = 0;
  std::map<std::string, std::vector<int>> waiting_;
};

}  // namespace ndmesh::launch::detail
