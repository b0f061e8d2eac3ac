// Streams and events as an interface: what the stream-ordered parts of ndmesh (the device
// communicators' Work, the device allocator's cross-stream rule) need from CUDA, so that
// their state machines are tested on the CPU with a fake (tests/unit) and run on the GPU
// with cudaEvent_t and cudaStream_t behind the same calls.
//
// A stream runs what is enqueued on it in order; an event recorded on a stream passes when
// the stream has run everything enqueued before the record. Handles are opaque pointers
// (cudaStream_t, cudaEvent_t on CUDA).
#pragma once

namespace ndmesh {

class StreamOps {
 public:
  virtual ~StreamOps() = default;
  /// A new event (not yet recorded: query() says passed).
  virtual void* create_event() = 0;
  virtual void destroy_event(void* event) noexcept = 0;
  /// Records `event` on `stream`: it passes once `stream` has run what is enqueued now.
  virtual void record(void* event, void* stream) = 0;
  /// Makes `stream` wait (without blocking the host) until `event` has passed.
  virtual void wait(void* stream, void* event) = 0;
  /// Polls without blocking: true once `event` has passed. Throws Error on a device fault.
  virtual bool query(void* event) = 0;
};

}  // namespace ndmesh
