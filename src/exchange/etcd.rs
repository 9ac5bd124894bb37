//! A small etcd v3 client over etcd's JSON gateway, for what the examples
//! and tests do around NIXL's own etcd exchange: check that the server
//! answers, list keys, delete stale keys under a prefix.
//!
//! NIXL talks to etcd itself (gRPC, `etcd-cpp-apiv3`) once
//! `NIXL_ETCD_ENDPOINTS` is set; this client never publishes agent metadata.
//! It exists so that an unreachable server is reported before NIXL silently
//! logs and retries, and so that a run can clear what a crashed earlier run
//! left behind (upstream's Python examples, NIXL PR #980, run
//! `etcdctl del --prefix /nixl/`, which Debian
//! ships in a separate package). Plain `http://` endpoints only.
//!
//! Why `ureq` against the gateway and not `etcd-client`: four requests
//! (version, range, deleterange, put), each a blocking JSON POST with a
//! deadline, in programs that have no async runtime. `etcd-client` is the
//! full gRPC API over tokio + tonic + prost (a runtime to start for four
//! calls, and a build that needs `protoc`); `ureq` is a small blocking HTTP
//! client with its own timeouts, and etcd serves the same KV API as JSON at
//! `/v3/kv/*` (keys and values base64, int64s as strings) since 3.4.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

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
    /// Nothing answered at the endpoint (within the deadline).
    #[error(
        "no etcd server at {endpoint}: {source}. Start one (e.g. `etcd --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379`) or point --etcd-endpoints / NIXL_ETCD_ENDPOINTS at a running server"
    )]
    Unreachable {
        /// `http://host:port` as given.
        endpoint: String,
        #[source]
        source: ureq::Error,
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
    agent: ureq::Agent,
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
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            // etcd's error statuses carry a JSON body worth showing.
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Self {
            endpoint: first.to_string(),
            addr: addr.to_string(),
            agent,
        })
    }

    /// The endpoint as given (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The server's version (`GET /version`, e.g. `3.4.23`); the cheapest
    /// proof that an etcd server answers.
    pub fn version(&self) -> Result<String, EtcdError> {
        let v = self.request("/version", None)?;
        v.get("etcdserver")
            .and_then(|s| s.as_str())
            .map(str::to_string)
            .ok_or_else(|| self.bad("/version", "no \"etcdserver\" field"))
    }

    /// Deletes every key starting with `prefix` (`/v3/kv/deleterange`);
    /// returns how many were deleted.
    pub fn delete_prefix(&self, prefix: &str) -> Result<u64, EtcdError> {
        let body = serde_json::json!({
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix.as_bytes())),
        });
        let v = self.request("/v3/kv/deleterange", Some(&body))?;
        Ok(count_field(&v, "deleted"))
    }

    /// The keys starting with `prefix` (`/v3/kv/range`, keys only), sorted.
    pub fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, EtcdError> {
        let body = serde_json::json!({
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix.as_bytes())),
            "keys_only": true,
        });
        let path = "/v3/kv/range";
        let v = self.request(path, Some(&body))?;
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
            let bytes = B64
                .decode(raw)
                .map_err(|_| self.bad(path, "a key that is not base64"))?;
            keys.push(String::from_utf8_lossy(&bytes).into_owned());
        }
        keys.sort();
        Ok(keys)
    }

    /// Sets `key` to `value` (`/v3/kv/put`).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), EtcdError> {
        let body = serde_json::json!({ "key": B64.encode(key), "value": B64.encode(value) });
        self.request("/v3/kv/put", Some(&body)).map(|_| ())
    }

    fn bad(&self, path: &str, what: &str) -> EtcdError {
        EtcdError::BadReply {
            endpoint: self.endpoint.clone(),
            path: path.to_string(),
            what: what.to_string(),
        }
    }

    /// One request: a GET without `body`, else a JSON POST; the reply as
    /// JSON. Bounded by the timeout given at construction.
    fn request(
        &self,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, EtcdError> {
        let url = format!("http://{}{path}", self.addr);
        let sent = match body {
            None => self.agent.get(&url).call(),
            Some(b) => self.agent.post(&url).send_json(b),
        };
        let unreachable = |source| EtcdError::Unreachable {
            endpoint: self.endpoint.clone(),
            source,
        };
        let mut reply = sent.map_err(unreachable)?;
        let status = reply.status().as_u16();
        let text = reply.body_mut().read_to_string().map_err(unreachable)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_port_is_unreachable_and_the_message_says_how_to_start_etcd() {
        // Port 1 on loopback: refused at once, nothing waits for a deadline.
        let e = Etcd::from_endpoints("http://127.0.0.1:1", Duration::from_secs(5)).unwrap();
        let err = e.version().unwrap_err();
        assert!(matches!(err, EtcdError::Unreachable { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("http://127.0.0.1:1") && msg.contains("--etcd-endpoints"),
            "{msg}"
        );
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
