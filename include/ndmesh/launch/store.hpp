// The job's key-value store: how processes started without MPI find each other.
//
// A client and a server of PyTorch's c10d TCPStore wire protocol, so that ndmesh can be
// a client of the store torchrun's agent serves (TORCHELASTIC_USE_AGENT_STORE=True), or
// serve one itself on rank 0 at MASTER_ADDR:MASTER_PORT. The generations of servers:
//   v2 (recent PyTorch 2.x, classic and libuv servers, ndmesh): a connection opens with
//      VALIDATE + magic 0x3C85F7CE and a PING whose nonce comes back; commands are
//      numbered VALIDATE=0, SET=1, ...
//   v2 without PING (earlier PyTorch 2.x): VALIDATE first, then the same numbers; PING
//      closes the connection.
//   query magic (PyTorch 2.x servers from before VALIDATE, classic backend, as in
//      pytorch/pytorch 00321a02's TCPStore.cpp and TCPStoreBackend.cpp): no handshake;
//      every query opens with a 4-byte magic, then the command byte numbered SET=0,
//      COMPARE_SET=1, ..., GETNUMKEYS=6 as in 1.x (DELETE_KEY=7, APPEND, MULTI_GET,
//      MULTI_SET, CANCEL_WAIT=11 after it). A query without the magic is not answered: the
//      server skips its first 4 bytes and reads on, so a client that omits it waits forever.
//   v1 (PyTorch 1.x, e.g. Debian's 1.13): no handshake; SET=0, COMPARE_SET=1, GET=2, ...
// The client confirms each generation by an answer (see StoreConnection::identify) and
// never falls back unchecked; a store it cannot identify, and a command a server of a
// known generation does not answer, end in one line naming the server's generation. The server answers v2 and v1 (it tells them apart by the
// opening). Keys are sent with torch's leading "/".
//
// Store is a cheap handle over one connection (calls are serialized on it); prefixed()
// gives a view whose keys all start with a prefix (a group's keys, a job attempt's keys).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/launch/store_protocol.hpp"

namespace ndmesh::launch {

namespace detail {
class StoreConnection;
class StoreDaemon;
}  // namespace detail

/// A client of a c10d TCPStore.
class Store {
 public:
  /// No store (what a job launched by MPI has).
  Store() = default;
  /// False for the default-constructed handle.
  bool valid() const { return conn_ != nullptr; }

  /// Connects to host:port, retrying until `timeout_s` has passed (the server may start
  /// after the client). `timeout_s` is also the default bound of get and wait. Error when
  /// no server answers in time.
  static Store connect(const std::string& host, int port, double timeout_s);

  /// The same store with `prefix` put in front of every key (after this handle's own).
  Store prefixed(const std::string& prefix) const;

  /// Sets key to value (bytes), waking the clients waiting for it.
  void set(const std::string& key, const std::string& value) const;
  /// The value of key, waiting up to the default timeout for it to be set.
  std::string get(const std::string& key) const;
  /// Adds delta to the integer held by key (0 when unset) and returns the sum.
  std::int64_t add(const std::string& key, std::int64_t delta) const;
  /// True when every key is set (does not wait).
  bool check(const std::vector<std::string>& keys) const;
  /// Waits until every key is set; Error naming the keys after `timeout_s` (0: the
  /// default timeout).
  void wait(const std::vector<std::string>& keys, double timeout_s = 0) const;

  /// Rank 0's bytes for every rank, e.g. NCCL's unique id: the root (is_root) sets key to
  /// `value` and returns it; the others wait for key (the default timeout) and return its
  /// value.
  std::string share(const std::string& key, bool is_root, const std::string& value = "") const;

  /// 1 or 2: the command numbering the server speaks (1: PyTorch 1.x's, also that of the
  /// "query magic" servers; 2: PyTorch 2.x's with VALIDATE, ndmesh's).
  int protocol() const;
  /// The server's generation: "v2", "v2 without PING", "query magic" or "v1".
  const std::string& generation() const;
  /// The default bound of get and wait.
  double timeout_s() const;
  /// "host:port".
  const std::string& address() const;

 private:
  Store(std::shared_ptr<detail::StoreConnection> conn, std::string prefix)
      : conn_(std::move(conn)), prefix_(std::move(prefix)) {}
  std::shared_ptr<detail::StoreConnection> conn_;
  std::string prefix_;
};

/// A c10d TCPStore server (both protocol versions) on a background thread of this
/// process, until destroyed.
class StoreServer {
 public:
  /// Listens at `port` (0: one the kernel picks) on the addresses `host` resolves to
  /// (MASTER_ADDR), not on every interface. ConfigError naming `port_variable` when the
  /// port is taken, so that the message says which variable to change, and naming
  /// MASTER_ADDR when it is no address of this host. A client that goes over `limits`
  /// is dropped (a debug line), the others go on.
  StoreServer(const std::string& host, int port, const std::string& port_variable = "MASTER_PORT",
              const detail::StoreLimits& limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  /// The port listened on.
  int port() const;

 private:
  std::unique_ptr<detail::StoreDaemon> daemon_;
};

/// The store of a job launched with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, after
/// every rank has arrived.
struct JobStore {
  Store store;  ///< keys of this job attempt: "ndmesh/<job id>/attempt_<n>/..." (job_key_prefix)
  std::shared_ptr<StoreServer> server;  ///< rank 0's server, when ndmesh serves the store
  bool agent_store = false;             ///< the launcher's agent serves the store
};

/// "ndmesh/<job id>/attempt_<n>/": the job id is TORCHELASTIC_RUN_ID ("none" when unset,
/// as torchrun's default), n is TORCHELASTIC_RESTART_COUNT; two jobs that meet at one
/// store never read each other's keys.
std::string job_key_prefix(const LaunchEnv& env);

/// Connects the job: rank 0 serves the store unless the launcher's agent does
/// (env.agent_store), every rank connects, checks that it agrees with rank 0 on
/// WORLD_SIZE and that no other process has its RANK, and waits until all WORLD_SIZE ranks
/// have arrived. ConfigError (exit 2) naming the variable for a port in use, a
/// WORLD_SIZE that differs from rank 0's or a RANK taken twice. A rank that does not
/// arrive within `timeout_s` ends this process with one line naming the missing ranks
/// and exit status 124, as MPI_Init's guard does (there is no job to report to).
JobStore rendezvous(const LaunchEnv& env, double timeout_s);

}  // namespace ndmesh::launch
