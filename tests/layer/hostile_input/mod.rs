//! Hostile input: policy values at and past every limit, keys an attacker
//! chooses (1 MB, NUL, newlines, braces, invalid UTF-8), spoofed forwarding
//! headers, malformed `Authorization`, and a flood of distinct keys.
//!
//! Every case must end in a typed error or a correct decision: no panic, no
//! broken Redis command, no key that escapes its slot, no key an untrusted
//! client can change at will, no memory beyond the store's cap.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Empty;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::key::HeaderKey;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy, PolicyError, Store, StoreError, ThrottleLayer};

mod authorization;
mod client_addresses;
mod flood;
mod keys;
#[cfg(feature = "redis")]
mod on_redis;
mod policies;

// -------------------------------------------------------------- policies ---

const YEAR: u64 = 365 * 86_400 + 86_400 / 4;

fn counts() -> Vec<u64> {
    vec![0, 1, 2, 1_000_000, u64::MAX / 2, u64::MAX - 1, u64::MAX]
}

fn durations() -> Vec<Duration> {
    vec![
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_nanos(999),
        Duration::from_micros(1),
        Duration::from_secs(1),
        Duration::from_secs(500 * YEAR),
        Duration::from_secs(584 * YEAR),
        Duration::from_nanos(u64::MAX),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ]
}

fn rates() -> Vec<f64> {
    vec![
        0.0,
        -0.0,
        -1.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN_POSITIVE,
        5e-324,
        1e-300,
        1e-10,
        0.5,
        1e9,
        1e9 + 1.0,
        1e10,
        f64::MAX,
    ]
}

/// Every constructor over the grid: each answer is `Ok` or a typed error.
fn all_policies() -> Vec<(String, Result<Policy, PolicyError>)> {
    let mut out = Vec::new();
    for &n in &counts() {
        for &d in &durations() {
            for &burst in &[0, 1, u64::MAX - 1, u64::MAX] {
                out.push((
                    format!("cell({burst}, {n}, {d:?})"),
                    Policy::cell(burst, n, d),
                ));
            }
            out.push((
                format!("sliding_log({n}, {d:?})"),
                Policy::sliding_log(n, d),
            ));
            out.push((
                format!("fixed_window({n}, {d:?})"),
                Policy::fixed_window(n, d),
            ));
            out.push((
                format!("sliding_window({n}, {d:?})"),
                Policy::sliding_window(n, d),
            ));
            out.push((
                format!("concurrency_with_lease({n}, {d:?})"),
                Policy::concurrency_with_lease(n, d),
            ));
        }
        out.push((format!("concurrency({n})"), Policy::concurrency(n)));
        for &r in &rates() {
            out.push((format!("funnel({n}, {r})"), Policy::funnel(n, r)));
            out.push((
                format!("token_bucket({n}, {r})"),
                Policy::token_bucket(n, r),
            ));
        }
    }
    out
}

// ------------------------------------------------------------------ keys ---

/// Keys an attacker picks: huge, binary, brace-laden, invalid UTF-8.
fn hostile_keys() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = [
        &b""[..],
        b"\0",
        b"a\0b",
        b"\n",
        b"\r\n*1\r\n$8\r\nFLUSHALL\r\n",
        b"{",
        b"}",
        b"{}",
        b"{a}",
        b"}{",
        b"x{y}z",
        b"\xff\xfe\xfd",
        b"\xc3\x28",
        b"%7c|~#=",
    ]
    .iter()
    .map(|k| k.to_vec())
    .collect();
    let mb = 1 << 20;
    keys.push(vec![0u8; mb]);
    keys.push(vec![b'{'; mb]);
    keys.push(vec![b'}'; mb]);
    keys.push(vec![b'\n'; mb]);
    keys.push((0..mb).map(|i| (i * 7919 % 256) as u8).collect());
    let mut one_off = vec![b'a'; mb];
    one_off[mb - 1] = b'b';
    keys.push(one_off);
    keys
}

/// A store that records the keys it is asked about (and decides in memory,
/// on a manual clock: a minute boundary mid-test would reopen the windows).
#[derive(Clone)]
struct Recorder {
    inner: MemoryStore<ManualClock>,
    keys: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            inner: MemoryStore::builder().clock(ManualClock::new()).build(),
            keys: Arc::default(),
        }
    }
}

impl Store for Recorder {
    fn decide<'a>(
        &'a self,
        charges: &'a [tower_throttle::store::Charge<'a>],
    ) -> tower_throttle::store::Answer<
        impl std::future::Future<
                Output = Result<
                    tower_throttle::store::Decisions,
                    tower_throttle::store::StoreError,
                >,
            > + Send
            + 'a,
    > {
        tower_throttle::store::Answer::Later(async move {
            for r in charges {
                self.keys.lock().unwrap().push(r.key.to_vec());
            }
            self.inner.decide(charges).await
        })
    }
    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        self.inner.refund(key, policy, receipt).await
    }
    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }
    async fn release(&self, key: &[u8], policy: &Policy, id: PermitId) -> Result<(), StoreError> {
        self.inner.release(key, policy, id).await
    }
}

fn ok_service() -> impl tower::Service<
    Request<()>,
    Response = Response<Empty<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::new()))
    })
}

fn from_peer(peer: &str, headers: &[(&str, HeaderValue)]) -> Request<()> {
    let mut req = Request::new(());
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        req.headers_mut().append(name, value.clone());
    }
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

/// Header values a client controls: invalid UTF-8, braces, separators, 1 MB.
fn hostile_header_values() -> Vec<HeaderValue> {
    let mut v: Vec<HeaderValue> = [
        &b"\xff\xfe"[..],
        b"\x80",
        b"{tag}",
        b"}{",
        b"a|b",
        b"a%7cb",
        b"~x",
        b"#0123456789abcdef0123456789abcdef",
        b"  spaced  ",
        b"tab\there",
    ]
    .iter()
    .map(|b| HeaderValue::from_bytes(b).unwrap())
    .collect();
    v.push(HeaderValue::from_bytes(&vec![b'{'; 1 << 20]).unwrap());
    v.push(HeaderValue::from_bytes(&vec![0xff; 1 << 20]).unwrap());
    let mut near = vec![b'x'; 1 << 20];
    near[0] = b'y';
    v.push(HeaderValue::from_bytes(&near).unwrap());
    v
}
