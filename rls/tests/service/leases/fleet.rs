//! Four processes of the real binary on one `redis-server`, their clocks
//! set to one instant (`RLS_TEST_CLOCK`), so that every process counts in
//! the same window whatever the wall clock does during the test.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::process::{free_port, until_healthy, Proc};
use crate::redis::redis_support::RedisServer;
use crate::support::*;

/// The hot key's limit, per hour: the window outlasts any test.
pub const LIMIT: u64 = 1_000;

pub const CFG: &str = "domain: lease\ndescriptors:\n  - key: hot\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// Upstream's key of the hot descriptor in the hour of `T0`.
pub fn key() -> String {
    format!("lease_hot_all_{}", T0 / 3_600 * 3_600)
}

/// One process.
pub struct Server {
    proc: Proc,
    grpc: SocketAddr,
    /// Its start line.
    pub start_line: String,
}

impl Server {
    /// SIGTERM, then its exit status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        self.proc.terminate().await
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("a gRPC connection")
    }
}

/// The processes.
pub struct Fleet {
    pub servers: Vec<Server>,
    _dir: Dir,
}

impl Fleet {
    /// Four processes on `redis`, with `extra` settings.
    pub async fn start(redis: &RedisServer, extra: &[(&str, &str)]) -> Fleet {
        let dir = Dir::new();
        dir.write("lease.yaml", CFG);
        let mut servers = Vec::new();
        for _ in 0..4 {
            servers.push(start_one(redis, &dir, extra).await);
        }
        Fleet { servers, _dir: dir }
    }
}

pub async fn start_one(redis: &RedisServer, dir: &Dir, extra: &[(&str, &str)]) -> Server {
    let (grpc, web, debug) = (free_port(), free_port(), free_port());
    let (grpc_s, http_s, debug_s) = (grpc.to_string(), web.to_string(), debug.to_string());
    let url = format!("127.0.0.1:{}", redis.port);
    let root = dir.0.to_str().unwrap();
    let mut env = vec![
        ("RUNTIME_ROOT", root),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", grpc_s.as_str()),
        ("HOST", "127.0.0.1"),
        ("PORT", http_s.as_str()),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", debug_s.as_str()),
        ("USE_STATSD", "false"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("RLS_TEST_CLOCK", "true"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0"),
    ];
    env.extend_from_slice(extra);
    let mut proc = Proc::spawn(&env);
    let start_line = proc.line(|l| l.contains("throttle-rls started")).await;
    if !extra.iter().any(|(k, _)| *k == "RLS_LEASES") {
        assert!(
            start_line.contains("served from leases, exact (RLS_LEASES=on"),
            "on by default with Redis: {start_line}"
        );
    }
    let debug_addr = SocketAddr::from(([127, 0, 0, 1], debug));
    let path = format!("/test/clock?now_unix={T0}");
    assert_eq!(http(debug_addr, "POST", &path, "").await.0, 204);
    until_healthy(SocketAddr::from(([127, 0, 0, 1], web))).await;
    Server {
        proc,
        grpc: SocketAddr::from(([127, 0, 0, 1], grpc)),
        start_line,
    }
}

/// One hit of the hot key: admitted or not (panics on an error).
pub async fn hot(client: &mut RateLimitServiceClient<Channel>) -> bool {
    let r = client
        .should_rate_limit(request("lease", vec![d(&[("hot", "all")])]))
        .await
        .expect("an answer")
        .into_inner();
    codes(&r)[0].0 == OK
}

/// `INCRBY`s the server has run so far.
pub fn incrby_calls(redis: &RedisServer) -> u64 {
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_incrby:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}
