//! A throttle-rls server on free loopback ports, with its config in a temp
//! directory and time on a manual clock; a tonic client; a tiny HTTP/1.1
//! client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use throttle_rls::backend::TestHooks;
use throttle_rls::server::{start, Running};
use throttle_rls::settings::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tower_throttle::clock::ManualClock;

/// A day-aligned instant (so minute and hour windows start here too).
pub const T0: u64 = 86_400 * 19_675;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A config directory of its own, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new() -> Dir {
        let root = std::env::temp_dir().join(format!(
            "throttle-rls-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(root.join("config")).unwrap();
        Dir(root)
    }

    pub fn config(&self) -> PathBuf {
        self.0.join("config")
    }

    pub fn write(&self, name: &str, text: &str) {
        std::fs::write(self.config().join(name), text).unwrap();
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server and a client.
pub struct Rls {
    pub running: Option<Running>,
    pub clock: ManualClock,
    pub dir: Dir,
    pub client: RateLimitServiceClient<Channel>,
}

/// The settings of a test server: loopback, port 0, the temp config
/// directory, no automatic reload (tests call `reload`), and `env`.
pub fn settings(dir: &Dir, env: &[(&str, &str)]) -> Settings {
    let mut vars: HashMap<String, String> = [
        ("RUNTIME_ROOT", dir.0.to_str().unwrap()),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RLS_RELOAD_INTERVAL", "1h"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
        ("RLS_SHUTDOWN_GRACE", "5s"),
        // Upstream's default is on (to localhost:8125); tests that want it say so.
        ("USE_STATSD", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in env {
        vars.insert((*k).to_owned(), (*v).to_owned());
    }
    Settings::from_lookup(&move |name| vars.get(name).cloned()).expect("valid settings")
}

impl Rls {
    /// A memory-store server with these config files and settings.
    pub async fn start(files: &[(&str, &str)], env: &[(&str, &str)]) -> Rls {
        let dir = Dir::new();
        for (name, text) in files {
            dir.write(name, text);
        }
        let settings = settings(&dir, env);
        Self::start_with(dir, &settings).await
    }

    pub async fn start_with(dir: Dir, settings: &Settings) -> Rls {
        Self::start_hooked(dir, settings, None).await
    }

    /// With a store of the test's own.
    pub async fn start_hooked(
        dir: Dir,
        settings: &Settings,
        store: Option<tower_throttle::store::BoxStore>,
    ) -> Rls {
        let clock = ManualClock::starting_at(T0 * 1_000_000_000);
        let hooks = TestHooks {
            clock: Some(Arc::new(clock.clone())),
            store,
        };
        let running = start(settings, hooks).await.expect("the server starts");
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
            .await
            .expect("a gRPC connection");
        Rls {
            running: Some(running),
            clock,
            dir,
            client,
        }
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().unwrap()
    }

    /// Asks for `descriptors` in `domain`; panics on a gRPC error.
    pub async fn ask(
        &mut self,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> RateLimitResponse {
        self.try_ask(request(domain, descriptors))
            .await
            .expect("an answer")
    }

    pub async fn try_ask(
        &mut self,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(req)
            .await
            .map(tonic::Response::into_inner)
    }

    pub fn advance(&self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
    }

    /// Writes a file and reloads now; the result of the load.
    pub async fn rewrite(&self, name: &str, text: &str) -> Result<(), String> {
        self.dir.write(name, text);
        self.running()
            .reloader
            .load()
            .await
            .map_err(|e| e.to_string())
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown();
            r.wait().await;
        }
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// A descriptor of `(key, value)` entries.
pub fn d(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// The same with a descriptor-level `hits_addend`.
pub fn dh(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..d(entries)
    }
}

/// The same with a `limit` override.
pub fn dl(entries: &[(&str, &str)], requests_per_unit: u32, unit: i32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit,
            unit,
        }),
        ..d(entries)
    }
}

pub const OK: i32 = Code::Ok as i32;
pub const OVER: i32 = Code::OverLimit as i32;
pub const SECOND: i32 = 1;
pub const MINUTE: i32 = 2;
pub const HOUR: i32 = 3;
pub const DAY: i32 = 4;

/// `(code, limit_remaining)` of each status.
pub fn codes(r: &RateLimitResponse) -> Vec<(i32, u32)> {
    r.statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

/// `(requests_per_unit, unit)` of a status's current limit.
pub fn limit_of(s: &DescriptorStatus) -> Option<(u32, i32)> {
    s.current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit))
}

pub fn reset_of(s: &DescriptorStatus) -> Option<i64> {
    s.duration_until_reset.as_ref().map(|d| d.seconds)
}

/// A one-shot HTTP/1.1 request: `(status, content type, body)`.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String, String) {
    http_bytes(addr, method, path, body.as_bytes()).await
}

/// The same with a body of any bytes.
pub async fn http_bytes(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}
