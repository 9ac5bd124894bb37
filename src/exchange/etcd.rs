//! A minimal etcd v3 client over etcd's JSON gateway (HTTP/1.0 + JSON), for
//! what the examples and tests do around NIXL's own etcd exchange: check
//! that the server answers, list keys, delete stale keys under a prefix.
//!
//! NIXL talks to etcd itself (gRPC, `etcd-cpp-apiv3`) once
//! `NIXL_ETCD_ENDPOINTS` is set; this client never publishes agent metadata.
//! It exists so that an unreachable server is reported before NIXL silently
//! logs and retries, and so that a run can clear what a crashed earlier run
//! left behind (the seeds run `etcdctl del --prefix /nixl/`, which Debian
//! ships in a separate package). Plain `http://` endpoints only.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The key prefix NIXL's etcd backend puts agent metadata under
/// (`NIXL_ETCD_NAMESPACE`, default `/nixl/agents/`).
pub const DEFAULT_NAMESPACE: &str = "/nixl/agents/";

/// Why an etcd request failed. Messages name the endpoint and the fix.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The endpoint is not `http://host:port`.
    #[error(
        "etcd endpoint {0:?} is not of the form http://host:port (TLS endpoints are not supported by this helper)"
    )]
    BadEndpoint(String),
    /// Nothing answered at the endpoint.
    #[error(
        "no etcd server at {endpoint}: {source}. Start one (e.g. `etcd --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379`) or point --etcd-endpoints / NIXL_ETCD_ENDPOINTS at a running server"
    )]
    Unreachable {
        /// `http://host:port` as given.
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    /// The server answered with an HTTP error.
    #[error("etcd at {endpoint} answered {path} with HTTP {status}: {body}")]
    Http {
        endpoint: String,
        path: String,
        status: u16,
        body: String,
    },
    /// The reply was not what etcd's gateway sends (not etcd on that port?).
    #[error("unexpected reply from {endpoint} to {path}: {what} (is that port an etcd v3 server?)")]
    BadReply {
        endpoint: String,
        path: String,
        what: String,
    },
}

/// One etcd server, reached through its JSON gateway.
#[derive(Clone, Debug)]
pub struct Etcd {
    endpoint: String,
    addr: String,
    timeout: Duration,
}

impl Etcd {
    /// Uses the first endpoint of a comma-separated list in the format of
    /// `NIXL_ETCD_ENDPOINTS` (`http://127.0.0.1:2379,http://...`); every
    /// request (connect, send, receive) is bounded by `timeout`.
    pub fn from_endpoints(endpoints: &str, timeout: Duration) -> Result<Self, EtcdError> {
        let first = endpoints
            .split(',')
            .map(str::trim)
            .find(|s| !s.is_empty())
            .unwrap_or("");
        let rest = first
            .strip_prefix("http://")
            .ok_or_else(|| EtcdError::BadEndpoint(first.to_string()))?;
        let addr = rest.trim_end_matches('/');
        if addr.is_empty() || !addr.contains(':') || addr.contains('/') {
            return Err(EtcdError::BadEndpoint(first.to_string()));
        }
        Ok(Self {
            endpoint: first.to_string(),
            addr: addr.to_string(),
            timeout,
        })
    }

    /// The endpoint as given (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The server's version (`GET /version`, e.g. `3.4.23`); the cheapest
    /// proof that an etcd server answers.
    pub fn version(&self) -> Result<String, EtcdError> {
        let v = self.request("GET", "/version", None)?;
        v.get("etcdserver")
            .and_then(|s| s.as_str())
            .map(str::to_string)
            .ok_or_else(|| self.bad("/version", "no \"etcdserver\" field"))
    }

    /// Deletes every key starting with `prefix` (`/v3/kv/deleterange`);
    /// returns how many were deleted.
    pub fn delete_prefix(&self, prefix: &str) -> Result<u64, EtcdError> {
        let body = serde_json::json!({
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix.as_bytes())),
        });
        let v = self.request("POST", "/v3/kv/deleterange", Some(&body))?;
        Ok(count_field(&v, "deleted"))
    }

    /// The keys starting with `prefix` (`/v3/kv/range`, keys only), sorted.
    pub fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, EtcdError> {
        let body = serde_json::json!({
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix.as_bytes())),
            "keys_only": true,
        });
        let path = "/v3/kv/range";
        let v = self.request("POST", path, Some(&body))?;
        let mut keys = Vec::new();
        for kv in v
            .get("kvs")
            .and_then(|k| k.as_array())
            .map(Vec::as_slice)
            .unwrap_or(&[])
        {
            let raw = kv
                .get("key")
                .and_then(|k| k.as_str())
                .ok_or_else(|| self.bad(path, "a kv without \"key\""))?;
            let bytes = unb64(raw).ok_or_else(|| self.bad(path, "a key that is not base64"))?;
            keys.push(String::from_utf8_lossy(&bytes).into_owned());
        }
        keys.sort();
        Ok(keys)
    }

    /// Sets `key` to `value` (`/v3/kv/put`).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), EtcdError> {
        let body = serde_json::json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        self.request("POST", "/v3/kv/put", Some(&body)).map(|_| ())
    }

    fn bad(&self, path: &str, what: &str) -> EtcdError {
        EtcdError::BadReply {
            endpoint: self.endpoint.clone(),
            path: path.to_string(),
            what: what.to_string(),
        }
    }

    /// One HTTP/1.0 exchange: HTTP/1.0 so the gateway closes the connection
    /// after the reply and never answers in chunks.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, EtcdError> {
        let unreachable = |source| EtcdError::Unreachable {
            endpoint: self.endpoint.clone(),
            source,
        };
        let addrs: Vec<_> = self.addr.to_socket_addrs().map_err(unreachable)?.collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
        let mut stream = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, self.timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let mut s = stream.ok_or_else(|| unreachable(last))?;
        s.set_read_timeout(Some(self.timeout))
            .map_err(unreachable)?;
        s.set_write_timeout(Some(self.timeout))
            .map_err(unreachable)?;
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
            self.addr,
            payload.len()
        );
        s.write_all(req.as_bytes()).map_err(unreachable)?;
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).map_err(unreachable)?;
        let split = reply
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| self.bad(path, "no HTTP header"))?;
        let head = String::from_utf8_lossy(&reply[..split]);
        let text = String::from_utf8_lossy(&reply[split + 4..]).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| self.bad(path, "no HTTP status"))?;
        if status != 200 {
            return Err(EtcdError::Http {
                endpoint: self.endpoint.clone(),
                path: path.to_string(),
                status,
                body: text,
            });
        }
        serde_json::from_str(&text).map_err(|e| self.bad(path, &format!("not JSON ({e})")))
    }
}

/// The gateway encodes int64 fields as JSON strings and omits zeros.
fn count_field(v: &serde_json::Value, name: &str) -> u64 {
    match v.get(name) {
        Some(serde_json::Value::String(s)) => s.parse().unwrap_or(0),
        Some(serde_json::Value::Number(n)) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of the key range holding every key that starts with `prefix`
/// (etcd's `GetPrefixRangeEnd`): the prefix with its last byte below 0xff
/// incremented and the rest dropped; `\0` (everything) if there is none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().unwrap() += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = B64.iter().position(|&x| x == c)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for s in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"/nixl/agents/",
            &[0xff, 0, 0x80],
        ] {
            assert_eq!(unb64(&b64(s)).as_deref(), Some(s));
        }
        assert_eq!(b64(b"/nixl/"), "L25peGwv");
    }

    #[test]
    fn prefix_range_end() {
        assert_eq!(prefix_end(b"/nixl/"), b"/nixl0");
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b");
        assert_eq!(prefix_end(&[0xff]), [0]);
    }

    #[test]
    fn endpoints_parse() {
        let e = Etcd::from_endpoints("http://127.0.0.1:2379,http://x:1", Duration::from_secs(1))
            .unwrap();
        assert_eq!(e.addr, "127.0.0.1:2379");
        assert!(Etcd::from_endpoints("https://a:1", Duration::from_secs(1)).is_err());
        assert!(Etcd::from_endpoints("127.0.0.1:2379", Duration::from_secs(1)).is_err());
    }
}
