// The c10d TCPStore server's protocol state (see store_protocol.hpp). Numbers are
// little-endian as the host writes them; strings are a uint64 length and the bytes.
// Replies: GET and COMPARE_SET a byte vector, ADD / GETNUMKEYS / DELETE_KEY an int64,
// CHECK one byte (0 ready, 1 not ready), WAIT one byte (0 stop waiting, 1 wait canceled)
// once every key is set, MULTI_GET one byte vector per key, PING the nonce back.
#include "ndmesh/launch/store_protocol.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::launch::detail {
namespace {

// PyTorch 1.x numbering: SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY.
constexpr Cmd kV1[] = {Cmd::kSet,  Cmd::kCompareSet, Cmd::kGet,     Cmd::kAdd,      Cmd::kCheck,
                       Cmd::kWait, Cmd::kGetNumKeys, Cmd::kUnknown, Cmd::kDeleteKey};

template <typename T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void append_str(std::string& out, const std::string& s) {
  append<std::uint64_t>(out, s.size());
  out += s;
}

// The integer a key holds, as ADD reads it: false when it is not one.
bool to_int(const std::string& s, std::int64_t& v) {
  if (s.empty() || s.size() > 20) return false;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  v = x;
  return true;
}

}  // namespace

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

void FrameParser::reset() {
  have_cmd_ = false;
  cmd_ = Cmd::kUnknown;
  fields_ = bytes_ = 0;
  count_ = 0;
  number_ = 0;
  strings_.clear();
}

FrameParser::Field FrameParser::next_field() const {
  const std::size_t i = fields_;
  switch (cmd_) {
    case Cmd::kValidate:
    case Cmd::kPing:
      return i == 0 ? Field::kU32 : Field::kEnd;
    case Cmd::kSet:
    case Cmd::kAppend:
      return i == 0 ? Field::kKey : i == 1 ? Field::kValue : Field::kEnd;
    case Cmd::kCompareSet:
      return i == 0 ? Field::kKey : i <= 2 ? Field::kValue : Field::kEnd;
    case Cmd::kGet:
    case Cmd::kDeleteKey:
      return i == 0 ? Field::kKey : Field::kEnd;
    case Cmd::kAdd:
      return i == 0 ? Field::kKey : i == 1 ? Field::kI64 : Field::kEnd;
    case Cmd::kCheck:
    case Cmd::kWait:
    case Cmd::kMultiGet:
      return i == 0 ? Field::kCount : i <= count_ ? Field::kKey : Field::kEnd;
    case Cmd::kMultiSet:
      if (i == 0) return Field::kCount;
      return i <= 2 * count_ ? (i % 2 == 1 ? Field::kKey : Field::kValue) : Field::kEnd;
    case Cmd::kGetNumKeys:
    case Cmd::kCancelWait:
    case Cmd::kUnknown:
      break;
  }
  return Field::kEnd;
}

FrameParser::Status FrameParser::feed(const char* data, std::size_t n, std::size_t& consumed) {
  consumed = 0;
  auto left = [&] { return n - consumed; };
  auto bad = [&](std::string why) {
    why_ = std::move(why);
    return Status::kBad;
  };
  if (!have_cmd_) {
    if (left() < 1) return Status::kMore;
    const auto code = static_cast<std::uint8_t>(data[0]);
    cmd_ = from_wire(code, protocol_);
    if (cmd_ == Cmd::kUnknown) return bad(fmt::format("unknown command {} (protocol v{})", code, protocol_));
    have_cmd_ = true;
    consumed = bytes_ = 1;
  }
  for (;;) {
    const Field f = next_field();
    if (f == Field::kEnd) return Status::kDone;
    if (f == Field::kU32 || f == Field::kI64 || f == Field::kCount) {
      const std::size_t size = f == Field::kU32 ? 4 : 8;
      if (left() < size) return Status::kMore;
      if (f == Field::kU32) {
        std::uint32_t v = 0;
        std::memcpy(&v, data + consumed, 4);
        number_ = v;
      } else if (f == Field::kI64) {
        std::memcpy(&number_, data + consumed, 8);
      } else {
        std::memcpy(&count_, data + consumed, 8);
        if (count_ > limits_.list_keys)
          return bad(fmt::format("a list of {} keys (at most {})", count_, limits_.list_keys));
        number_ = static_cast<std::int64_t>(count_);
        strings_.reserve(cmd_ == Cmd::kMultiSet ? 2 * count_ : count_);
      }
      consumed += size;
      bytes_ += size;
      ++fields_;
      continue;
    }
    std::uint64_t len = 0;
    if (left() < sizeof len) return Status::kMore;
    std::memcpy(&len, data + consumed, sizeof len);
    const std::size_t bound = f == Field::kKey ? limits_.key_bytes : limits_.value_bytes;
    if (len > bound)
      return bad(
          fmt::format("a {} of {} bytes (at most {})", f == Field::kKey ? "key" : "value", len, bound));
    if (bytes_ + sizeof len + len > limits_.frame_bytes)
      return bad(fmt::format("a request of more than {} bytes", limits_.frame_bytes));
    if (left() < sizeof len + len) return Status::kMore;
    strings_.emplace_back(data + consumed + sizeof len, len);
    consumed += sizeof len + len;
    bytes_ += sizeof len + len;
    ++fields_;
  }
}

bool StoreCore::open(int id) {
  if (clients_.size() >= limits_.connections) return false;
  clients_[id] = Client{};
  return true;
}

void StoreCore::close(int id) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), id), v.end());
    it = v.empty() ? waiting_.erase(it) : std::next(it);
  }
  clients_.erase(id);
}

const std::string& StoreCore::output(int id) const {
  static const std::string none;
  auto it = clients_.find(id);
  return it == clients_.end() ? none : it->second.out;
}

void StoreCore::sent(int id, std::size_t n) {
  auto it = clients_.find(id);
  if (it != clients_.end()) it->second.out.erase(0, n);
}

std::vector<int> StoreCore::with_output() const {
  std::vector<int> ids;
  for (const auto& [id, c] : clients_)
    if (!c.out.empty()) ids.push_back(id);
  return ids;
}

bool StoreCore::receive(int id, const char* data, std::size_t n, std::string& why) {
  auto it = clients_.find(id);
  if (it == clients_.end()) {
    why = "an unknown client";
    return false;
  }
  Client& c = it->second;
  c.in.append(data, n);
  if (c.protocol == 0) {
    // v2 opens with VALIDATE (0) and the magic; v1 has no handshake.
    const std::string_view in(c.in);
    if (in.empty() || (in[0] == 0 && in.size() < 5)) return true;
    std::uint32_t magic = 0;
    if (in.size() >= 5) std::memcpy(&magic, in.data() + 1, sizeof magic);
    c.protocol = in[0] == 0 && magic == kValidationMagic ? 2 : 1;
    c.parser = FrameParser(c.protocol, limits_);
  }
  for (;;) {
    std::size_t consumed = 0;
    auto status = c.parser.feed(c.in.data() + c.in_head, c.in.size() - c.in_head, consumed);
    c.in_head += consumed;
    if (status == FrameParser::Status::kBad) {
      why = c.parser.why();
      return false;
    }
    if (status == FrameParser::Status::kMore) break;
    if (!run(id, c, why)) return false;
    c.parser.reset();
  }
  // What is left is one field that has not fully arrived: keep it at the front, moving
  // it only when the consumed part is the larger (amortized linear).
  if (c.in_head == c.in.size()) {
    c.in.clear();
    c.in_head = 0;
  } else if (c.in_head > c.in.size() / 2) {
    c.in.erase(0, c.in_head);
    c.in_head = 0;
  }
  return true;
}

bool StoreCore::reply(Client& c, std::size_t bytes, std::string& why) const {
  if (c.out.size() + bytes <= limits_.queued_bytes) return true;
  why = fmt::format("{} bytes of replies not read (at most {})", c.out.size() + bytes, limits_.queued_bytes);
  return false;
}

std::int64_t StoreCore::stored_size(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? -1 : static_cast<std::int64_t>(key.size() + it->second.size());
}

bool StoreCore::put(const std::string& key, std::string value, std::string& why) {
  const std::int64_t before = stored_size(key);
  const std::size_t now =
      stored_ - static_cast<std::size_t>(std::max<std::int64_t>(before, 0)) + key.size() + value.size();
  if (now > limits_.stored_bytes) {
    why = fmt::format("the store would hold {} bytes (at most {})", now, limits_.stored_bytes);
    return false;
  }
  stored_ = now;
  data_[key] = std::move(value);
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return true;
  std::vector<int> ids = std::move(it->second);
  waiting_.erase(it);
  for (int id : ids) {
    auto c = clients_.find(id);
    if (c == clients_.end() || c->second.awaited == 0) continue;
    if (--c->second.awaited == 0) c->second.out.push_back('\0');  // STOP_WAITING
  }
  return true;
}

bool StoreCore::run(int id, Client& c, std::string& why) {
  const std::vector<std::string>& s = c.parser.strings();
  switch (c.parser.cmd()) {
    case Cmd::kValidate:
      if (static_cast<std::uint32_t>(c.parser.number()) == kValidationMagic) return true;
      why = "VALIDATE with a wrong magic";
      return false;
    case Cmd::kPing:
      if (!reply(c, 4, why)) return false;
      append(c.out, static_cast<std::uint32_t>(c.parser.number()));
      return true;
    case Cmd::kSet:
      return put(s[0], s[1], why);
    case Cmd::kAppend: {
      auto it = data_.find(s[0]);
      std::string value = it == data_.end() ? std::string() : it->second;
      if (value.size() + s[1].size() > limits_.value_bytes) {
        why = fmt::format("APPEND to a value of more than {} bytes", limits_.value_bytes);
        return false;
      }
      return put(s[0], value + s[1], why);
    }
    case Cmd::kCompareSet: {
      const std::string &key = s[0], &expected = s[1], &desired = s[2];
      auto it = data_.find(key);
      std::string current;
      if (it == data_.end()) {
        if (expected.empty() && !put(key, desired, why)) return false;
        current = expected.empty() ? desired : expected;
      } else {
        if (it->second == expected && !put(key, desired, why)) return false;
        current = data_[key];
      }
      if (!reply(c, 8 + current.size(), why)) return false;
      append_str(c.out, current);
      return true;
    }
    case Cmd::kGet: {
      auto it = data_.find(s[0]);
      const std::size_t size = it == data_.end() ? 0 : it->second.size();
      if (!reply(c, 8 + size, why)) return false;
      append_str(c.out, it == data_.end() ? std::string() : it->second);
      return true;
    }
    case Cmd::kAdd: {
      std::int64_t held = 0, sum = 0;
      auto it = data_.find(s[0]);
      if (it != data_.end() && !to_int(it->second, held)) {
        why = "ADD to a key that holds no integer";
        return false;
      }
      if (__builtin_add_overflow(held, c.parser.number(), &sum)) {
        why = fmt::format("ADD of {} to {} overflows", c.parser.number(), held);
        return false;
      }
      if (!reply(c, 8, why) || !put(s[0], std::to_string(sum), why)) return false;
      append(c.out, sum);
      return true;
    }
    case Cmd::kCheck:
    case Cmd::kWait: {
      std::size_t missing = 0;
      for (const auto& k : s) missing += data_.count(k) ? 0 : 1;
      if (c.parser.cmd() == Cmd::kCheck || missing == 0) {
        if (!reply(c, 1, why)) return false;
        c.out.push_back(missing == 0 ? '\0' : '\1');  // READY / NOT_READY; WAIT: STOP_WAITING
        return true;
      }
      if (c.awaited != 0) {
        why = "WAIT while a WAIT is pending";
        return false;
      }
      for (const auto& k : s)
        if (!data_.count(k)) waiting_[k].push_back(id);
      c.awaited = missing;
      return true;
    }
    case Cmd::kMultiGet: {
      std::size_t size = 0;
      for (const auto& k : s) {
        auto it = data_.find(k);
        size += 8 + (it == data_.end() ? 0 : it->second.size());
        if (!reply(c, size, why)) return false;
      }
      for (const auto& k : s) {
        auto it = data_.find(k);
        append_str(c.out, it == data_.end() ? std::string() : it->second);
      }
      return true;
    }
    case Cmd::kMultiSet:
      for (std::size_t i = 0; i + 1 < s.size(); i += 2)
        if (!put(s[i], s[i + 1], why)) return false;
      return true;
    case Cmd::kGetNumKeys:
      if (!reply(c, 8, why)) return false;
      append<std::int64_t>(c.out, static_cast<std::int64_t>(data_.size()));
      return true;
    case Cmd::kDeleteKey: {
      if (!reply(c, 8, why)) return false;
      const std::int64_t size = stored_size(s[0]);
      if (size >= 0) stored_ -= static_cast<std::size_t>(size);
      append<std::int64_t>(c.out, static_cast<std::int64_t>(data_.erase(s[0])));
      return true;
    }
    case Cmd::kCancelWait:
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        auto& v = it->second;
        v.erase(std::remove(v.begin(), v.end(), id), v.end());
        it = v.empty() ? waiting_.erase(it) : std::next(it);
      }
      c.awaited = 0;
      if (!reply(c, 1, why)) return false;
      c.out.push_back('\1');  // WAIT_CANCELED
      return true;
    case Cmd::kUnknown:
      break;
  }
  why = "an unknown command";
  return false;
}

}  // namespace ndmesh::launch::detail
