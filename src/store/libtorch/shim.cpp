// The C API of shim.h over c10d::TCPStore. Every entry point runs its body
// inside guarded(), which turns any exception into a torchstore_error, so
// no C++ exception can unwind into Rust.

#include "shim.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

struct torchstore {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

namespace {

// Returned when even the error cannot be allocated; never freed.
torchstore_error oom_error{TORCHSTORE_ERR_UNKNOWN, const_cast<char *>("out of memory in the torchstore shim")};

torchstore_error *make_error(torchstore_error_kind kind, const char *message) {
  auto *err = static_cast<torchstore_error *>(std::malloc(sizeof(torchstore_error)));
  if (err == nullptr) {
    return &oom_error;
  }
  err->kind = kind;
  size_t len = std::strlen(message);
  err->message = static_cast<char *>(std::malloc(len + 1));
  if (err->message != nullptr) {
    std::memcpy(err->message, message, len + 1);
  }
  return err;
}

// Runs body; maps the exception type (most derived first) to an error kind.
template <typename F>
torchstore_error *guarded(F &&body) noexcept {
  try {
    body();
    return nullptr;
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

c10d::TCPStore &of(torchstore *s) { return *s->store; }

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
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    auto handle = std::make_unique<torchstore>();
    handle->store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    *out = handle.release();
  });
}

void torchstore_close(torchstore *store) {
  // The destructor stops the server thread; it is not expected to throw,
  // but nothing may escape into Rust.
  (void)guarded([&] { delete store; });
}

uint16_t torchstore_port(const torchstore *store) { return store->store->getPort(); }

torchstore_error *torchstore_set(torchstore *store, const char *key, size_t key_len, const uint8_t *value,
                                 size_t value_len) {
  return guarded([&] { of(store).set(key_of(key, key_len), bytes_of(value, value_len)); });
}

torchstore_error *torchstore_get(torchstore *store, const char *key, size_t key_len, torchstore_bytes *out) {
  return guarded([&] { give(of(store).get(key_of(key, key_len)), out); });
}

torchstore_error *torchstore_wait(torchstore *store, const char *const *keys, const size_t *key_lens, size_t n_keys,
                                  int64_t timeout_ms) {
  return guarded([&] { of(store).wait(keys_of(keys, key_lens, n_keys), std::chrono::milliseconds(timeout_ms)); });
}

torchstore_error *torchstore_check(torchstore *store, const char *const *keys, const size_t *key_lens, size_t n_keys,
                                   bool *out) {
  return guarded([&] { *out = of(store).check(keys_of(keys, key_lens, n_keys)); });
}

torchstore_error *torchstore_add(torchstore *store, const char *key, size_t key_len, int64_t delta, int64_t *out) {
  return guarded([&] { *out = of(store).add(key_of(key, key_len), delta); });
}

torchstore_error *torchstore_compare_set(torchstore *store, const char *key, size_t key_len, const uint8_t *expected,
                                         size_t expected_len, const uint8_t *desired, size_t desired_len,
                                         torchstore_bytes *out) {
  return guarded([&] {
    give(of(store).compareSet(key_of(key, key_len), bytes_of(expected, expected_len), bytes_of(desired, desired_len)),
         out);
  });
}

torchstore_error *torchstore_multi_get(torchstore *store, const char *const *keys, const size_t *key_lens,
                                       size_t n_keys, torchstore_bytes *out) {
  size_t given = 0;
  torchstore_error *err = guarded([&] {
    auto values = of(store).multiGet(keys_of(keys, key_lens, n_keys));
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

torchstore_error *torchstore_delete_key(torchstore *store, const char *key, size_t key_len, bool *out) {
  return guarded([&] { *out = of(store).deleteKey(key_of(key, key_len)); });
}

torchstore_error *torchstore_num_keys(torchstore *store, int64_t *out) {
  return guarded([&] { *out = of(store).getNumKeys(); });
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
