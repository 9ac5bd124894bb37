/*
 * A plain C API over c10d::TCPStore (libtorch), for the Rust `libtorch`
 * store backend (src/libtorch.rs binds it with bindgen).
 *
 * Conventions:
 * - A store is an opaque handle from torchstore_open, freed by
 *   torchstore_close.
 * - Keys are (pointer, length) byte strings given exactly as the user wrote
 *   them: c10d::TCPStore itself adds the "/" wire prefix.
 * - Every fallible function returns NULL on success, or an error that the
 *   caller must free with torchstore_error_free. No C++ exception ever leaves
 *   the shim.
 * - Byte buffers handed out (torchstore_bytes) are malloc'ed by the shim and
 *   freed with torchstore_bytes_free.
 * - Timeouts are milliseconds; 0 means "none" (torch's kNoTimeout).
 * - Every request has a deadline (deadline_ms; 0: none), which torch's own
 *   client lacks (it waits forever for a reply): a request that outlives it
 *   (plus the time it may wait for keys) has torch's client socket shut
 *   down under it and fails with TORCHSTORE_ERR_NO_REPLY; the store is
 *   broken from then on (replies could no longer be matched to requests).
 *   Requests are serialised by a lock that is waited for at most
 *   deadline_ms too (TORCHSTORE_ERR_BUSY).
 */
#ifndef NIXL_EXAMPLES_TORCHSTORE_SHIM_H
#define NIXL_EXAMPLES_TORCHSTORE_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which C++ exception type the failure was, most specific first. */
typedef enum torchstore_error_kind {
  /* c10d::TimeoutError: a socket-level timeout (e.g. connecting). */
  TORCHSTORE_ERR_NET_TIMEOUT = 1,
  /* c10d::SocketError: socket setup failed (e.g. bind: port in use). */
  TORCHSTORE_ERR_SOCKET = 2,
  /* c10::DistNetworkError: other network failures (peer closed, ...). */
  TORCHSTORE_ERR_NETWORK = 3,
  /* c10::DistStoreError: store-level failures (wait timeout, join timeout). */
  TORCHSTORE_ERR_STORE = 4,
  /* Any other c10::Error (TORCH_CHECK failures, ...). */
  TORCHSTORE_ERR_TORCH = 5,
  /* Any other std::exception. */
  TORCHSTORE_ERR_STD = 6,
  /* Anything else thrown. */
  TORCHSTORE_ERR_UNKNOWN = 7,
  /* The store did not answer (or take) a request within its deadline. */
  TORCHSTORE_ERR_NO_REPLY = 8,
  /* An earlier request held the store past this one's deadline. */
  TORCHSTORE_ERR_BUSY = 9,
  /* An earlier request got no answer: the connection is unusable. */
  TORCHSTORE_ERR_BROKEN = 10,
} torchstore_error_kind;

typedef struct torchstore_error {
  torchstore_error_kind kind;
  /* NUL-terminated message (c10::Error::what_without_backtrace for torch). */
  char *message;
  /* For TORCHSTORE_ERR_NO_REPLY from torchstore_open: the request that got
   * no answer, "PING" (the constructor's handshake), "ADD" (a client counting
   * in on init/) or "ADD/GET" (the host counting in, then polling init/), and
   * the limit that passed (ms); NULL and 0 otherwise. Static storage: not
   * freed. */
  const char *stage;
  int64_t stage_limit_ms;
} torchstore_error;

typedef struct torchstore_bytes {
  uint8_t *data;
  size_t len;
} torchstore_bytes;

/* Opaque: a c10d::TCPStore. */
typedef struct torchstore torchstore;

/*
 * c10d::TCPStore(host, TCPStoreOptions{port, is_server, num_workers (< 0:
 * none), wait_workers, timeout_ms}). Blocks like the constructor does
 * (connect retries; with wait_workers the server waits for num_workers).
 * Unlike torch's, a client's handshake is bounded: a server that accepts
 * but never answers the PING fails it after 2 x timeout_ms + 1 s (torch's
 * connect window and retry delay, then the timeout again for the answer),
 * and counting in (wait_workers) must end within timeout_ms for a client
 * (one ADD), within torch's own limit for it (the timeout in whole seconds,
 * rounded up) + timeout_ms for the host.
 */
torchstore_error *torchstore_open(const char *host, uint16_t port, bool is_server, int64_t num_workers,
                                  bool wait_workers, int64_t timeout_ms, torchstore **out);
/* Destroys the store (and the server it hosts). NULL is ignored. */
void torchstore_close(torchstore *store);
/* TCPStore::getPort(): the bound port when hosting with port 0. */
uint16_t torchstore_port(const torchstore *store);

/* Each request below takes deadline_ms (0: none), see the conventions. */
torchstore_error *torchstore_set(torchstore *store, const char *key, size_t key_len, const uint8_t *value,
                                 size_t value_len, int64_t deadline_ms);
/* wait_ms bounds the wait for the key (torch's store timeout, which must not
 * be 0 here); deadline_ms the requests. */
torchstore_error *torchstore_get(torchstore *store, const char *key, size_t key_len, int64_t wait_ms,
                                 int64_t deadline_ms, torchstore_bytes *out);
/* keys[i] has key_lens[i] bytes; timeout_ms bounds the wait for the keys. */
torchstore_error *torchstore_wait(torchstore *store, const char *const *keys, const size_t *key_lens, size_t n_keys,
                                  int64_t timeout_ms, int64_t deadline_ms);
torchstore_error *torchstore_check(torchstore *store, const char *const *keys, const size_t *key_lens, size_t n_keys,
                                   int64_t deadline_ms, bool *out);
torchstore_error *torchstore_add(torchstore *store, const char *key, size_t key_len, int64_t delta,
                                 int64_t deadline_ms, int64_t *out);
torchstore_error *torchstore_compare_set(torchstore *store, const char *key, size_t key_len, const uint8_t *expected,
                                         size_t expected_len, const uint8_t *desired, size_t desired_len,
                                         int64_t deadline_ms, torchstore_bytes *out);
/* out points to n_keys slots; on error none of them needs freeing. wait_ms
 * as for torchstore_get. */
torchstore_error *torchstore_multi_get(torchstore *store, const char *const *keys, const size_t *key_lens,
                                       size_t n_keys, int64_t wait_ms, int64_t deadline_ms, torchstore_bytes *out);
torchstore_error *torchstore_delete_key(torchstore *store, const char *key, size_t key_len, int64_t deadline_ms,
                                        bool *out);
torchstore_error *torchstore_num_keys(torchstore *store, int64_t deadline_ms, int64_t *out);

void torchstore_error_free(torchstore_error *error);
void torchstore_bytes_free(torchstore_bytes *bytes);

#ifdef __cplusplus
}
#endif

#endif /* NIXL_EXAMPLES_TORCHSTORE_SHIM_H */
