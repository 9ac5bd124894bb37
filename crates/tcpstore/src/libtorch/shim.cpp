// The C API of shim.h over c10d::TCPStore. Every entry point runs its body
// inside guarded(), which turns any exception into a torchstore_error, so
// no C++ exception can unwind into Rust.

#include "shim.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using std::chrono::milliseconds;

namespace {

// Ends requests that outlive their deadline. torch reads replies (and writes
// requests) with no timeout, so at a request's deadline this thread shuts
// the client socket down: torch's blocked recv or send fails at once, and the
// request's exception is reported as "no reply". The connection is useless
// by then anyway (replies would no longer match requests). One thread per
// store, idle between requests.
class Deadlines {
 public:
  explicit Deadlines(int fd) : fd_(fd), thread_([this] { run(); }) {}
  Deadlines(const Deadlines &) = delete;
  Deadlines &operator=(const Deadlines &) = delete;
  ~Deadlines() {
    {
      std::lock_guard<std::mutex> hold(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Starts a request that must end within limit (0: no limit).
  void arm(milliseconds limit) {
    std::lock_guard<std::mutex> hold(mutex_);
    armed_ = limit.count() > 0;
    fired_ = false;
    until_ = std::chrono::steady_clock::now() + limit;
    changed_.notify_all();
  }

  // Ends the request; true if its deadline passed (the socket is shut down).
  bool disarm() {
    std::lock_guard<std::mutex> hold(mutex_);
    armed_ = false;
    return fired_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> hold(mutex_);
    while (!stop_) {
      if (!armed_) {
        changed_.wait(hold);
      } else if (std::chrono::steady_clock::now() >= until_) {
        armed_ = false;
        fired_ = true;
        ::shutdown(fd_, SHUT_RDWR);
      } else {
        changed_.wait_until(hold, until_);
      }
    }
  }

  int fd_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  bool armed_ = false;
  bool fired_ = false;
  std::chrono::steady_clock::time_point until_;
  std::thread thread_;
};

}  // namespace

struct torchstore {
  c10::intrusive_ptr<c10d::TCPStore> store;
  // Watches torch's client socket (found through TCPStore::repr()). Declared
  // after `store`, so destroyed (its thread joined) before the socket closes.
  std::unique_ptr<Deadlines> deadlines;
  // One request at a time, waited for at most the request's deadline; torch's
  // own activeOpLock_ cannot give up waiting.
  std::timed_mutex lock;
  // Set once a request failed half-way: replies no longer match requests.
  bool broken = false;
};

namespace {

// Returned when even the error cannot be allocated; never freed.
torchstore_error oom_error{TORCHSTORE_ERR_UNKNOWN, const_cast<char *>("out of memory in the torchstore shim"), nullptr,
                           0};

torchstore_error *make_error(torchstore_error_kind kind, const char *message, const char *stage = nullptr,
                             milliseconds stage_limit = milliseconds(0)) {
  auto *err = static_cast<torchstore_error *>(std::malloc(sizeof(torchstore_error)));
  if (err == nullptr) {
    return &oom_error;
  }
  err->kind = kind;
  err->stage = stage;
  err->stage_limit_ms = stage_limit.count();
  size_t len = std::strlen(message);
  err->message = static_cast<char *>(std::malloc(len + 1));
  if (err->message != nullptr) {
    std::memcpy(err->message, message, len + 1);
  }
  return err;
}

// A failure the shim itself classifies (deadlines), thrown inside guarded().
struct shim_error : std::runtime_error {
  torchstore_error_kind kind;
  const char *stage;
  milliseconds stage_limit;
  shim_error(torchstore_error_kind kind, const std::string &message, const char *stage = nullptr,
             milliseconds stage_limit = milliseconds(0))
      : std::runtime_error(message), kind(kind), stage(stage), stage_limit(stage_limit) {}
};

// Runs body; maps the exception type (most derived first) to an error kind.
template <typename F>
torchstore_error *guarded(F &&body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const shim_error &e) {
    return make_error(e.kind, e.what(), e.stage, e.stage_limit);
  } catch (const c10d::TimeoutError &e) {
    return make_error(TORCHSTORE_ERR_NET_TIMEOUT, e.what_without_backtrace());
  } catch (const c10d::SocketError &e) {
    return make_error(TORCHSTORE_ERR_SOCKET, e.what_without_backtrace());
  } catch (const c10::DistNetworkError &e) {
    return make_error(TORCHSTORE_ERR_NETWORK, e.what_without_backtrace());
  } catch (const c10::DistStoreError &e) {
    return make_error(TORCHSTORE_ERR_STORE, e.what_without_backtrace());
  } catch (const c10::Error &e) {
    return make_error(TORCHSTORE_ERR_TORCH, e.what_without_backtrace());
  } catch (const std::exception &e) {
    return make_error(TORCHSTORE_ERR_STD, e.what());
  } catch (...) {
    return make_error(TORCHSTORE_ERR_UNKNOWN, "unknown C++ exception");
  }
}

// The port of a socket address (IPv4 or IPv6); 0 if neither.
uint16_t port_of(const sockaddr_storage &ss) {
  if (ss.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in &>(ss).sin_port);
  }
  if (ss.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6 &>(ss).sin6_port);
  }
  return 0;
}

uint16_t peer_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  return ::getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0 ? port_of(ss) : 0;
}

uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  return ::getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0 ? port_of(ss) : 0;
}

// The number after `tag` in text, or -1.
long number_after(const std::string &text, const std::string &tag, size_t from = 0) {
  size_t at = text.find(tag, from);
  if (at == std::string::npos) {
    return -1;
  }
  char *end = nullptr;
  const char *start = text.c_str() + at + tag.size();
  long n = std::strtol(start, &end, 10);
  return end == start ? -1 : n;
}

// torch's client socket. c10d::TCPStore keeps it private, but its exported
// repr() names it: "TCPStore(client=TCPClient(SocketImpl(fd=13,
// addr=[::ffff:127.0.0.1]:58750, remote=[::ffff:127.0.0.1]:35305)), ...)".
// The fd is trusted only if it is connected from that local port to the
// store's port.
int client_fd(c10d::TCPStore &store) {
  std::string repr = store.repr();
  size_t client = repr.find("client=TCPClient(SocketImpl(");
  long fd = number_after(repr, "fd=", client);
  size_t remote = repr.find(", remote=", client);
  size_t colon = remote == std::string::npos ? std::string::npos : repr.rfind(':', remote);
  long local = colon == std::string::npos ? -1 : number_after(repr, ":", colon);
  if (client == std::string::npos || fd < 0 || local <= 0 || local_port(static_cast<int>(fd)) != local ||
      peer_port(static_cast<int>(fd)) != store.getPort()) {
    throw std::runtime_error("cannot find the client socket of c10d::TCPStore in its repr() \"" + repr +
                             "\", so its requests cannot be given a deadline; this shim expects torch 2.11's format");
  }
  return static_cast<int>(fd);
}

// This process's sockets (fd, inode) connected to `port`.
std::vector<std::pair<int, ino_t>> sockets_to(uint16_t port) {
  std::vector<std::pair<int, ino_t>> out;
  DIR *dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) {
    return out;
  }
  while (const dirent *entry = ::readdir(dir)) {
    char *end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    struct stat st{};
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir) || ::fstat(static_cast<int>(fd), &st) != 0 ||
        !S_ISSOCK(st.st_mode) || peer_port(static_cast<int>(fd)) != port) {
      continue;
    }
    out.emplace_back(static_cast<int>(fd), st.st_ino);
  }
  ::closedir(dir);
  return out;
}

// Bounds the handshake inside c10d::TCPStore's constructor, whose PING reply
// torch reads with no timeout: if the constructor is still running after
// `limit`, the sockets connected to `port` that appeared since the watchdog
// started are shut down, so that its read fails and the constructor throws.
// (Another thread of this process connecting to the same port at that very
// moment would lose its socket too: only ever when that store is silent.)
class Watchdog {
 public:
  Watchdog(milliseconds limit, uint16_t port) {
    std::set<ino_t> before;
    for (const auto &s : sockets_to(port)) {
      before.insert(s.second);
    }
    thread_ = std::thread([this, limit, port, before] {
      std::unique_lock<std::mutex> hold(mutex_);
      if (done_.wait_for(hold, limit, [this] { return finished_; })) {
        return;
      }
      // Only a connected socket has a peer: one still connecting is left to
      // torch's own connect timeout.
      for (const auto &s : sockets_to(port)) {
        if (before.count(s.second) == 0) {
          ::shutdown(s.first, SHUT_RDWR);
          fired_ = true;
        }
      }
    });
  }
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;
  ~Watchdog() { (void)finish(); }

  // Stops the watchdog; true if it shut a socket down.
  bool finish() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> hold(mutex_);
        finished_ = true;
      }
      done_.notify_all();
      thread_.join();
    }
    return fired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  bool fired_ = false;
  std::thread thread_;
};

std::string key_of(const char *key, size_t len) { return std::string(key, len); }

std::vector<std::string> keys_of(const char *const *keys, const size_t *lens, size_t n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back(keys[i], lens[i]);
  }
  return out;
}

std::vector<uint8_t> bytes_of(const uint8_t *data, size_t len) {
  return len == 0 ? std::vector<uint8_t>() : std::vector<uint8_t>(data, data + len);
}

// Hands a value to the caller in malloc'ed memory.
void give(const std::vector<uint8_t> &value, torchstore_bytes *out) {
  out->len = value.size();
  // malloc(0) may return NULL; one byte keeps "NULL means failure" simple.
  out->data = static_cast<uint8_t *>(std::malloc(value.empty() ? 1 : value.size()));
  if (out->data == nullptr) {
    throw std::bad_alloc();
  }
  if (!value.empty()) {
    std::memcpy(out->data, value.data(), value.size());
  }
}

// Runs one request on s (see shim.h): the lock is waited for at most
// deadline_ms, and the request must end within wait_ms (the time it may
// spend waiting for keys, 0 for requests that do not wait) + deadline_ms.
template <typename F>
torchstore_error *request(torchstore *s, int64_t deadline_ms, int64_t wait_ms, F &&body) noexcept {
  return guarded([&] {
    std::unique_lock<std::timed_mutex> hold(s->lock, std::defer_lock);
    if (deadline_ms <= 0) {
      hold.lock();
    } else if (!hold.try_lock_for(milliseconds(deadline_ms))) {
      throw shim_error(TORCHSTORE_ERR_BUSY, "an earlier request held the store past the deadline");
    }
    if (s->broken) {
      throw shim_error(TORCHSTORE_ERR_BROKEN, "an earlier request failed half-way");
    }
    auto no_reply = [&] {
      s->broken = true;
      return shim_error(TORCHSTORE_ERR_NO_REPLY, "no answer within the deadline");
    };
    s->deadlines->arm(deadline_ms > 0 ? milliseconds(deadline_ms + wait_ms) : milliseconds(0));
    try {
      body(*s->store);
    } catch (const c10::DistNetworkError &) {
      // Whatever failed half-way, the reply stream is out of step now.
      s->broken = true;
      if (s->deadlines->disarm()) {
        throw no_reply();
      }
      throw;
    } catch (...) {
      if (s->deadlines->disarm()) {
        throw no_reply();
      }
      throw;
    }
    // An answer that came just as the socket was shut down still leaves the
    // connection unusable.
    if (s->deadlines->disarm()) {
      throw no_reply();
    }
  });
}

// get's and multiGet's wait for their keys uses the store's timeout.
template <typename F>
void with_wait_timeout(c10d::TCPStore &store, int64_t wait_ms, F &&body) {
  c10d::StoreTimeoutGuard guard(store, milliseconds(wait_ms));
  body();
}

// How long the constructor may take before its handshake counts as
// unanswered: torch's connect window, one retry delay past it
// (TCPStore::kConnectRetryDelay), then the timeout again for the PING.
milliseconds handshake_limit(milliseconds timeout) { return 2 * timeout + c10d::TCPStore::kConnectRetryDelay; }

// How long counting in may take: a client's is one ADD; the host then
// polls until waitForWorkers gives up, once more whole seconds than the
// timeout have passed (it truncates the elapsed time to seconds), then one
// more timeout for the request under way.
milliseconds join_limit(const c10d::TCPStoreOptions &opts) {
  if (!opts.isServer) {
    return opts.timeout;
  }
  return std::chrono::duration_cast<std::chrono::seconds>(opts.timeout) + std::chrono::seconds(1) + opts.timeout;
}

// The constructor, with waitWorkers deferred until the socket has deadlines.
std::unique_ptr<torchstore> construct(const std::string &host, const c10d::TCPStoreOptions &opts) {
  auto handle = std::make_unique<torchstore>();
  c10d::TCPStoreOptions first = opts;
  first.waitWorkers = false;
  {
    std::unique_ptr<Watchdog> watchdog;
    if (!opts.isServer && opts.timeout.count() > 0) {
      watchdog = std::make_unique<Watchdog>(handshake_limit(opts.timeout), opts.port);
    }
    const shim_error no_ping(TORCHSTORE_ERR_NO_REPLY, "the handshake got no answer", "PING",
                             handshake_limit(opts.timeout));
    try {
      handle->store = c10::make_intrusive<c10d::TCPStore>(host, first);
    } catch (...) {
      if (watchdog && watchdog->finish()) {
        throw no_ping;
      }
      throw;
    }
    if (watchdog && watchdog->finish()) {
      throw no_ping;
    }
  }
  handle->deadlines = std::make_unique<Deadlines>(client_fd(*handle->store));
  if (opts.waitWorkers) {
    const milliseconds limit = opts.timeout.count() > 0 ? join_limit(opts) : milliseconds(0);
    const shim_error no_reply(TORCHSTORE_ERR_NO_REPLY, "counting in got no answer", opts.isServer ? "ADD/GET" : "ADD",
                              limit);
    handle->deadlines->arm(limit);
    try {
      handle->store->waitForWorkers();
    } catch (...) {
      if (handle->deadlines->disarm()) {
        throw no_reply;
      }
      throw;
    }
    if (handle->deadlines->disarm()) {
      throw no_reply;
    }
  }
  return handle;
}

}  // namespace

extern "C" {

torchstore_error *torchstore_open(const char *host, uint16_t port, bool is_server, int64_t num_workers,
                                  bool wait_workers, int64_t timeout_ms, torchstore **out) {
  return guarded([&] {
    *out = nullptr;
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server;
    if (num_workers >= 0) {
      opts.numWorkers = static_cast<std::size_t>(num_workers);
    }
    opts.waitWorkers = wait_workers;
    opts.timeout = milliseconds(timeout_ms);
    *out = construct(std::string(host), opts).release();
  });
}

void torchstore_close(torchstore *store) {
  // The destructor stops the server thread; it is not expected to throw,
  // but nothing may escape into Rust.
  (void)guarded([&] { delete store; });
}

uint16_t torchstore_port(const torchstore *store) { return store->store->getPort(); }

torchstore_error *torchstore_set(torchstore *store, const char *key, size_t key_len, const uint8_t *value,
                                 size_t value_len, int64_t deadline_ms) {
  return request(store, deadline_ms, 0,
                 [&](c10d::TCPStore &s) { s.set(key_of(key, key_len), bytes_of(value, value_len)); });
}

torchstore_error *torchstore_get(torchstore *store, const char *key, size_t key_len, int64_t wait_ms,
                                 int64_t deadline_ms, torchstore_bytes *out) {
  return request(store, deadline_ms, wait_ms, [&](c10d::TCPStore &s) {
    with_wait_timeout(s, wait_ms, [&] { give(s.get(key_of(key, key_len)), out); });
  });
}

torchstore_error *torchstore_wait(torchstore *store, const char *const *keys, const size_t *key_lens, size_t n_keys,
                                  int64_t timeout_ms, int64_t deadline_ms) {
  return request(store, deadline_ms, timeout_ms, [&](c10d::TCPStore &s) {
    s.wait(keys_of(keys, key_lens, n_keys), milliseconds(timeout_ms));
  });
}

torchstore_error *torchstore_check(torchstore *store, const char *const *keys, const size_t *key_lens, size_t n_keys,
                                   int64_t deadline_ms, bool *out) {
  return request(store, deadline_ms, 0, [&](c10d::TCPStore &s) { *out = s.check(keys_of(keys, key_lens, n_keys)); });
}

torchstore_error *torchstore_add(torchstore *store, const char *key, size_t key_len, int64_t delta,
                                 int64_t deadline_ms, int64_t *out) {
  return request(store, deadline_ms, 0, [&](c10d::TCPStore &s) { *out = s.add(key_of(key, key_len), delta); });
}

torchstore_error *torchstore_compare_set(torchstore *store, const char *key, size_t key_len, const uint8_t *expected,
                                         size_t expected_len, const uint8_t *desired, size_t desired_len,
                                         int64_t deadline_ms, torchstore_bytes *out) {
  return request(store, deadline_ms, 0, [&](c10d::TCPStore &s) {
    give(s.compareSet(key_of(key, key_len), bytes_of(expected, expected_len), bytes_of(desired, desired_len)), out);
  });
}

torchstore_error *torchstore_multi_get(torchstore *store, const char *const *keys, const size_t *key_lens,
                                       size_t n_keys, int64_t wait_ms, int64_t deadline_ms, torchstore_bytes *out) {
  size_t given = 0;
  torchstore_error *err = request(store, deadline_ms, wait_ms, [&](c10d::TCPStore &s) {
    std::vector<std::vector<uint8_t>> values;
    with_wait_timeout(s, wait_ms, [&] { values = s.multiGet(keys_of(keys, key_lens, n_keys)); });
    if (values.size() != n_keys) {
      throw std::runtime_error("multiGet returned " + std::to_string(values.size()) + " values for " +
                               std::to_string(n_keys) + " keys");
    }
    for (; given < n_keys; ++given) {
      give(values[given], &out[given]);
    }
  });
  if (err != nullptr) {
    for (size_t i = 0; i < given; ++i) {
      torchstore_bytes_free(&out[i]);
    }
  }
  return err;
}

torchstore_error *torchstore_delete_key(torchstore *store, const char *key, size_t key_len, int64_t deadline_ms,
                                        bool *out) {
  return request(store, deadline_ms, 0, [&](c10d::TCPStore &s) { *out = s.deleteKey(key_of(key, key_len)); });
}

torchstore_error *torchstore_num_keys(torchstore *store, int64_t deadline_ms, int64_t *out) {
  return request(store, deadline_ms, 0, [&](c10d::TCPStore &s) { *out = s.getNumKeys(); });
}

void torchstore_error_free(torchstore_error *error) {
  if (error == nullptr || error == &oom_error) {
    return;
  }
  std::free(error->message);
  std::free(error);
}

void torchstore_bytes_free(torchstore_bytes *bytes) {
  if (bytes != nullptr) {
    std::free(bytes->data);
    bytes->data = nullptr;
    bytes->len = 0;
  }
}

}  // extern "C"
