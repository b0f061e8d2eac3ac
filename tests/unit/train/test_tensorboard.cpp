// TensorBoard's event format as ndmesh writes it (train/tensorboard.hpp): CRC-32C against its
// check value, the TFRecord framing, and the protocol-buffer bytes of an Event, decoded here
// by hand field by field. (TensorBoard's own reader reads whole files in
// tests/python/tensorboard_reader.sh.)
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "ndmesh/train/tensorboard.hpp"

namespace ndmesh::train {
namespace {

std::uint32_t le32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
std::uint32_t masked(const std::string& data) {
  const std::uint32_t c = crc32c(data.data(), data.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TEST(TensorBoard, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c("", 0), 0u);
  // Continuing a CRC over a second piece gives the CRC of the whole.
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);
}

TEST(TensorBoard, RecordFraming) {
  const std::string data = "hello event";
  const std::string r = tfrecord(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  std::uint64_t length = 0;
  std::memcpy(&length, r.data(), 8);
  EXPECT_EQ(length, data.size());
  EXPECT_EQ(le32(r, 8), masked(r.substr(0, 8)));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(le32(r, 12 + data.size()), masked(data));
}

TEST(TensorBoard, ScalarEventBytes) {
  const std::string e = scalar_event(1.5, 300, {{"loss", 2.0f}});
  // Event: field 1 double (key 0x09) 1.5, field 2 varint (0x10) 300 = 0xac 0x02, field 5
  // bytes (0x2a) a Summary: field 1 bytes (0x0a) a Value: tag (0x0a) "loss", simple_value
  // (0x15) float 2.0.
  std::string want = "\x09";
  double wall = 1.5;
  want.append(reinterpret_cast<const char*>(&wall), 8);
  want += std::string("\x10\xac\x02", 3);
  const std::string value = std::string("\x0a\x04loss\x15", 7) + std::string("\x00\x00\x00\x40", 4);
  const std::string summary = std::string("\x0a", 1) + static_cast<char>(value.size()) + value;
  want += std::string("\x2a", 1) + static_cast<char>(summary.size()) + summary;
  EXPECT_EQ(e, want);
}

TEST(TensorBoard, FileVersionAndSessionStart) {
  EXPECT_NE(file_version_event(0).find("brain.Event:2"), std::string::npos);
  // SessionLog (field 7, bytes: 0x3a) with status START (field 1 varint 1: 0x08 0x01), at step 21.
  const std::string e = session_start_event(0, 21);
  EXPECT_NE(e.find(std::string("\x10\x15\x3a\x02\x08\x01", 6)), std::string::npos);
}

}  // namespace
}  // namespace ndmesh::train
