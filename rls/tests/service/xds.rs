//! `CONFIG_TYPE=GRPC_XDS_SOTW`: the binary against a control plane the
//! test runs (a tonic ADS server on its own runtime, on a loopback port),
//! which pushes snapshots, records every DiscoveryRequest (ACK, NACK, the
//! node and the headers), goes away (its runtime dropped: every socket
//! closed) and comes back on the same port.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Channel, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use crate::process::{free_port, until_healthy, Proc};
use crate::support::*;
use crate::tls_pki::Pki;

pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// One DiscoveryRequest as the control plane saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub stream: u64,
    pub version: String,
    pub nonce: String,
    pub error: Option<String>,
    pub node_id: String,
    pub metadata: HashMap<String, String>,
    pub headers: HashMap<String, String>,
    pub type_url: String,
}

/// A version and its resources.
type Snapshot = Option<(String, Vec<Any>)>;

#[derive(Default)]
struct Shared {
    snapshot: Mutex<Option<watch::Sender<Snapshot>>>,
    seen: Mutex<Vec<Seen>>,
    /// `(version, nonce)` of every response sent.
    sent: Mutex<Vec<(String, String)>>,
    streams: AtomicU64,
    nonces: AtomicU64,
}

impl Shared {
    fn subscribe(&self) -> watch::Receiver<Snapshot> {
        let mut s = self.snapshot.lock().unwrap();
        s.get_or_insert_with(|| watch::channel(None).0).subscribe()
    }
}

struct Ads(Arc<Shared>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let headers: HashMap<String, String> = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let stream = self.0.streams.fetch_add(1, Ordering::SeqCst) + 1;
        let mut inbound = request.into_inner();
        let shared = self.0.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = inbound.message().await {
                let node = r.node.unwrap_or_default();
                let metadata = node
                    .metadata
                    .map(|m| {
                        m.fields
                            .into_iter()
                            .map(|(k, v)| match v.kind {
                                Some(Kind::StringValue(s)) => (k, s),
                                other => (k, format!("{other:?}")),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                shared.seen.lock().unwrap().push(Seen {
                    stream,
                    version: r.version_info,
                    nonce: r.response_nonce,
                    error: r.error_detail.map(|e| e.message),
                    node_id: node.id,
                    metadata,
                    headers: headers.clone(),
                    type_url: r.type_url,
                });
            }
        });
        let (tx, rx) = mpsc::channel(16);
        let mut snapshots = self.0.subscribe();
        let shared = self.0.clone();
        tokio::spawn(async move {
            loop {
                let current = snapshots.borrow_and_update().clone();
                if let Some((version, resources)) = current {
                    let nonce =
                        format!("nonce-{}", shared.nonces.fetch_add(1, Ordering::SeqCst) + 1);
                    shared
                        .sent
                        .lock()
                        .unwrap()
                        .push((version.clone(), nonce.clone()));
                    let response = DiscoveryResponse {
                        version_info: version,
                        resources,
                        type_url: TYPE_URL.into(),
                        nonce,
                        ..Default::default()
                    };
                    if tx.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
                if snapshots.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// The test's control plane.
pub struct ControlPlane {
    pub port: u16,
    shared: Arc<Shared>,
    tls: Option<ServerTlsConfig>,
    rt: Option<tokio::runtime::Runtime>,
}

impl ControlPlane {
    /// Serving on a free loopback port, with `snapshot` if any.
    pub fn start(snapshot: Option<(&str, Vec<Any>)>, tls: Option<ServerTlsConfig>) -> ControlPlane {
        let mut cp = ControlPlane {
            port: 0,
            shared: Arc::default(),
            tls,
            rt: None,
        };
        if let Some((v, r)) = snapshot {
            cp.push(v, r);
        }
        cp.serve();
        cp
    }

    /// A port for a control plane started later ([`ControlPlane::serve`]).
    pub fn later(port: u16, tls: Option<ServerTlsConfig>) -> ControlPlane {
        ControlPlane {
            port,
            shared: Arc::default(),
            tls,
            rt: None,
        }
    }

    /// Listens (again) on its port.
    pub fn serve(&mut self) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = {
            let _in = rt.enter();
            let mut tries = 0;
            loop {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.set_reuseaddr(true).unwrap();
                let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
                match socket.bind(addr).and_then(|()| socket.listen(128)) {
                    Ok(l) => break l,
                    Err(e) => {
                        tries += 1;
                        assert!(tries < 100, "cannot listen on {addr}: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        };
        self.port = listener.local_addr().unwrap().port();
        let mut builder = Server::builder();
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(tls.clone()).unwrap();
        }
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(Ads(self
            .shared
            .clone())));
        rt.spawn(router.serve_with_incoming(TcpListenerStream::new(listener)));
        self.rt = Some(rt);
    }

    /// Gone: its runtime dropped, every connection closed.
    pub fn go_away(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    /// Sets the snapshot; every open stream gets it.
    pub fn push(&self, version: &str, resources: Vec<Any>) {
        let mut s = self.shared.snapshot.lock().unwrap();
        s.get_or_insert_with(|| watch::channel(None).0)
            .send_replace(Some((version.to_owned(), resources)));
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// The nonces sent with `version`.
    pub fn nonces_of(&self, version: &str) -> Vec<String> {
        let sent = self.shared.sent.lock().unwrap();
        sent.iter()
            .filter(|(v, _)| v == version)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// The first request that satisfies `what` (at most 30 s).
    pub async fn wait_for(&self, what: impl Fn(&Seen) -> bool) -> Seen {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.seen().into_iter().find(|s| what(s)) {
                return s;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no such request within 30 s; seen: {:#?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The ACK of `version`.
    pub async fn acked(&self, version: &str) -> Seen {
        self.wait_nonces(version).await;
        // Nonces are looked up afresh: a stream may get the version again.
        self.wait_for(|s| {
            s.version == version && s.error.is_none() && self.nonces_of(version).contains(&s.nonce)
        })
        .await
    }

    /// The NACK of `version`.
    pub async fn nacked(&self, version: &str) -> Seen {
        self.wait_nonces(version).await;
        self.wait_for(|s| s.error.is_some() && self.nonces_of(version).contains(&s.nonce))
            .await
    }

    async fn wait_nonces(&self, version: &str) {
        for _ in 0..1500 {
            if !self.nonces_of(version).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("version {version} was never sent");
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.go_away();
    }
}

pub fn descriptor(key: &str, n: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        rate_limit: Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A `RateLimitConfig` resource.
pub fn resource(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> Any {
    Any {
        type_url: TYPE_URL.into(),
        value: RateLimitConfig {
            name: name.into(),
            domain: domain.into(),
            descriptors,
        }
        .encode_to_vec(),
    }
}

/// `domain: d`, each `(key, requests_per_unit)` a DAY limit.
pub fn day_limits(limits: &[(&str, u32)]) -> Vec<Any> {
    let d = limits
        .iter()
        .map(|(k, n)| descriptor(k, *n, RateLimitUnit::Day))
        .collect();
    vec![resource("d-config", "d", d)]
}

pub struct Rls {
    pub p: Proc,
    pub grpc: u16,
    pub http: u16,
    pub debug: u16,
}

impl Rls {
    /// The binary with xDS from `cp_port` (short backoff), then `extra`.
    pub fn launch(cp_port: u16, extra: &[(&str, &str)]) -> Rls {
        let (grpc, http, debug) = (free_port(), free_port(), free_port());
        let url = format!("127.0.0.1:{cp_port}");
        let ports = [grpc.to_string(), http.to_string(), debug.to_string()];
        let mut env: Vec<(&str, &str)> = vec![
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &url),
            ("CONFIG_GRPC_XDS_NODE_ID", "test-node"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "300ms"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", &ports[0]),
            ("HOST", "127.0.0.1"),
            ("PORT", &ports[1]),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", &ports[2]),
        ];
        env.extend_from_slice(extra);
        Rls {
            p: Proc::spawn(&env),
            grpc,
            http,
            debug,
        }
    }

    pub fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .unwrap()
    }

    /// `(code, remaining)` for `k=v` in domain `d`.
    pub async fn ask(&self, key: &str) -> Result<(i32, u32), Status> {
        let r = self
            .client()
            .await
            .should_rate_limit(request("d", vec![d(&[(key, "v")])]))
            .await?
            .into_inner();
        Ok(codes(&r)[0])
    }

    pub async fn rlconfig(&self) -> String {
        http(Self::addr(self.debug), "GET", "/rlconfig", "").await.2
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_enforced_updated_and_bad_ones_nacked() {
    let cp = ControlPlane::start(Some(("1", day_limits(&[("k", 3), ("j", 2)]))), None);
    let mut rls = Rls::launch(
        cp.port,
        &[
            (
                "CONFIG_GRPC_XDS_NODE_METADATA",
                "cluster=rl,zone=z1,ignored",
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-tenant:t1,X-Team:rl",
            ),
        ],
    );
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    let source = format!("configuration xDS server 127.0.0.1:{} (node id test-node, plain text): 1 domain (d), 2 limits", cp.port);
    assert!(line.contains(&source), "{line}");
    until_healthy(Rls::addr(rls.http)).await;
    // The first request: the node, its metadata, the headers, the type.
    let first = cp.wait_for(|_| true).await;
    assert_eq!(first.node_id, "test-node");
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!((first.version.as_str(), first.nonce.as_str()), ("", ""));
    let metadata: HashMap<String, String> = [("cluster", "rl"), ("zone", "z1")]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
    assert_eq!(first.metadata, metadata);
    assert_eq!(
        first.headers.get("x-tenant").map(String::as_str),
        Some("t1")
    );
    assert_eq!(first.headers.get("x-team").map(String::as_str), Some("rl"));
    let ack = cp.acked("1").await;
    assert_eq!(ack.nonce, cp.nonces_of("1")[0]);
    // Upstream's remaining counts: 2, 1, 0, then over.
    for left in [2, 1, 0] {
        assert_eq!(rls.ask("k").await.unwrap(), (OK, left));
    }
    assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
    assert_eq!(rls.ask("j").await.unwrap(), (OK, 1));

    // An update: k unchanged (its count carries over), j raised, m new.
    cp.push("2", day_limits(&[("k", 3), ("j", 5), ("m", 1)]));
    cp.acked("2").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
    assert_eq!(rls.ask("j").await.unwrap(), (OK, 3));
    assert_eq!(rls.ask("m").await.unwrap(), (OK, 0));
    assert_eq!(rls.ask("m").await.unwrap(), (OVER, 0));

    // Bad snapshots: NACKed with the last ACKed version and the reason;
    // the limits in force still answer and /rlconfig shows the error.
    let dup = vec![resource(
        "dup-config",
        "d",
        vec![
            descriptor("k", 9, RateLimitUnit::Day),
            descriptor("k", 9, RateLimitUnit::Day),
        ],
    )];
    let unknown = vec![resource(
        "unit-config",
        "d",
        vec![descriptor("k", 9, RateLimitUnit::Unknown)],
    )];
    let garbage = vec![Any {
        type_url: TYPE_URL.into(),
        value: vec![0xff, 0xff, 0xff, 0xff],
    }];
    for (version, resources, reason) in [
        (
            "3",
            dup,
            "dup-config: descriptors[1]: duplicate descriptor composite key 'k'",
        ),
        (
            "4",
            unknown,
            "unit-config: descriptors[0].rate_limit: invalid rate limit unit 'UNKNOWN'",
        ),
        (
            "5",
            garbage,
            "cannot decode a resource as ratelimit.config.ratelimit.v3.RateLimitConfig",
        ),
    ] {
        cp.push(version, resources);
        let nack = cp.nacked(version).await;
        assert_eq!(nack.version, "2", "{nack:?}");
        let error = nack.error.unwrap();
        assert!(error.contains(reason), "{error}");
        assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
        assert_eq!(rls.ask("j").await.unwrap().0, OK);
        let dump = rls.rlconfig().await;
        assert!(dump.contains("d.k: unit=DAY requests_per_unit=3"), "{dump}");
        assert!(
            dump.contains("last configuration load failed, previous configuration kept")
                && dump.contains(reason),
            "{dump}"
        );
        rls.p
            .line(|l| {
                l.contains("ERROR")
                    && l.contains("xDS snapshot refused (NACK)")
                    && l.contains(reason)
            })
            .await;
    }
    // A good one again: in force, the error gone.
    cp.push("6", day_limits(&[("k", 100)]));
    cp.acked("6").await;
    // k was asked 8 times (over the limit too counts, as upstream).
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 91));
    assert_eq!(
        rls.ask("j").await.unwrap(),
        (OK, 0),
        "no limit for j any more"
    );
    let dump = rls.rlconfig().await;
    assert!(!dump.contains("failed"), "{dump}");
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_goes_away_and_comes_back() {
    let mut cp = ControlPlane::start(Some(("1", day_limits(&[("k", 5)]))), None);
    let mut rls = Rls::launch(cp.port, &[]);
    until_healthy(Rls::addr(rls.http)).await;
    cp.acked("1").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 4));
    cp.go_away();
    let lost = rls.p.line(|l| l.contains("lost the xDS server")).await;
    assert!(
        lost.contains("ERROR") && lost.contains("the configuration in force stays"),
        "{lost}"
    );
    // Meanwhile the last table answers; the client keeps trying.
    for left in [3, 2] {
        assert_eq!(rls.ask("k").await.unwrap(), (OK, left));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    // Back on the same port with a new snapshot.
    cp.push("2", day_limits(&[("k", 5), ("n", 1)]));
    cp.serve();
    let again = rls
        .p
        .line(|l| l.contains("connected to the xDS server again"))
        .await;
    assert!(again.contains("INFO"), "{again}");
    let ack = cp.acked("2").await;
    // As upstream's client, the new stream's first request carried the
    // version and nonce of the last response received.
    let reconnect = cp.wait_for(|s| s.stream == ack.stream).await;
    assert_eq!(reconnect.version, "1");
    assert_eq!(rls.ask("n").await.unwrap(), (OK, 0));
    assert_eq!(
        rls.ask("k").await.unwrap(),
        (OK, 0),
        "k's count carried over"
    );
    assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_updates_under_load() {
    const LIMIT: u32 = 60;
    const CALLS: usize = 240;
    const TASKS: usize = 12;
    let cp = ControlPlane::start(Some(("1", day_limits(&[("k", LIMIT), ("other", 1)]))), None);
    let mut rls = Rls::launch(cp.port, &[]);
    until_healthy(Rls::addr(rls.http)).await;
    cp.acked("1").await;
    let client = rls.client().await;
    let pushing = async {
        for v in 2..=12u32 {
            cp.push(&v.to_string(), day_limits(&[("k", LIMIT), ("other", v)]));
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    };
    let calling = async {
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u32;
                for _ in 0..CALLS / TASKS {
                    let r = client
                        .should_rate_limit(request("d", vec![d(&[("k", "v")])]))
                        .await
                        .unwrap_or_else(|s| panic!("task {t}: {s:?}"))
                        .into_inner();
                    match codes(&r)[0].0 {
                        OK => ok += 1,
                        OVER => {}
                        other => panic!("code {other}"),
                    }
                }
                ok
            }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += t.await.unwrap();
        }
        ok
    };
    let ((), admitted) = tokio::join!(pushing, calling);
    assert_eq!(admitted, LIMIT);
    cp.acked("12").await;
    assert_eq!(rls.ask("other").await.unwrap(), (OK, 11));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_serves_before_the_first_snapshot() {
    let mut cp = ControlPlane::later(free_port(), None);
    let mut rls = Rls::launch(cp.port, &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")]);
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    assert!(line.contains(": none yet"), "{line}");
    rls.p
        .line(|l| {
            l.contains("WARN") && l.contains("every request fails until the xDS server sends one")
        })
        .await;
    until_healthy(Rls::addr(rls.http)).await;
    // As upstream: no configuration, so the call fails.
    let e = rls.ask("k").await.unwrap_err();
    assert!(e.message().contains("no rate limit configuration"), "{e:?}");
    cp.push("1", day_limits(&[("k", 2)]));
    cp.serve();
    cp.acked("1").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_nothing_listens_before_the_first_snapshot() {
    let mut cp = ControlPlane::later(free_port(), None);
    let mut rls = Rls::launch(cp.port, &[]);
    rls.p
        .line(|l| l.contains("waiting for the first rate-limit configuration"))
        .await;
    rls.p
        .line(|l| l.contains("cannot connect to the xDS server"))
        .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    for port in [rls.http, rls.grpc] {
        assert!(
            tokio::net::TcpStream::connect(Rls::addr(port))
                .await
                .is_err(),
            "port {port} answers before the first snapshot"
        );
    }
    assert!(!rls
        .p
        .drain()
        .iter()
        .any(|l| l.contains("throttle-rls started")));
    cp.push("1", day_limits(&[("k", 2)]));
    cp.serve();
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    assert!(line.contains("1 domain (d), 1 limit"), "{line}");
    until_healthy(Rls::addr(rls.http)).await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

/// The control plane over TLS, asking for a client certificate `ca` issued.
pub fn mtls(pki: &Pki, cert: &str, key: &str) -> ServerTlsConfig {
    use tonic::transport::{Certificate, Identity};
    ServerTlsConfig::new()
        .identity(Identity::from_pem(pki.read(cert), pki.read(key)))
        .client_ca_root(Certificate::from_pem(pki.read("ca.crt")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_to_the_control_plane() {
    let pki = Pki::new();
    let cp = ControlPlane::start(
        Some(("1", day_limits(&[("k", 2)]))),
        Some(mtls(&pki, "server.crt", "server.key")),
    );
    let (cert, key, ca, ca2) = (
        pki.path("client.crt"),
        pki.path("client.key"),
        pki.path("ca.crt"),
        pki.path("ca2.crt"),
    );
    let tls = |ca: &str| -> Vec<(&'static str, String)> {
        vec![
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.clone()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.clone()),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca.to_owned()),
            // The certificate is for 127.0.0.1 and localhost.
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost".into()),
        ]
    };
    let good = tls(&ca);
    let env: Vec<(&str, &str)> = good.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut rls = Rls::launch(cp.port, &env);
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    assert!(
        line.contains("TLS with a client certificate, server verified as localhost): 1 domain"),
        "{line}\n{}",
        rls.p.lines.join("\n")
    );
    cp.acked("1").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    assert_eq!(rls.p.terminate().await.code(), Some(0));

    // A CA that did not issue the server's certificate: refused, retried.
    let streams = cp.seen().len();
    let mut bad_env = tls(&ca2);
    bad_env.push(("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()));
    let env: Vec<(&str, &str)> = bad_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut rls = Rls::launch(cp.port, &env);
    let refused = rls
        .p
        .line(|l| l.contains("cannot connect to the xDS server"))
        .await;
    assert!(
        refused.contains("ERROR") && refused.to_lowercase().contains("certificate"),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cp.seen().len(), streams, "no request got through");
    assert_eq!(rls.p.terminate().await.code(), Some(0));

    // No client certificate: the control plane refuses the handshake.
    let env: Vec<(&str, &str)> = vec![
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];
    let mut rls = Rls::launch(cp.port, &env);
    rls.p
        .line(|l| {
            l.contains("lost the xDS server") || l.contains("cannot connect to the xDS server")
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cp.seen().len(), streams, "no request got through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_above_the_max_message_size_is_not_received() {
    let big: Vec<(String, u32)> = (0..40).map(|i| (format!("key-{i:03}"), 5)).collect();
    let limits: Vec<(&str, u32)> = big.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    let cp = ControlPlane::start(Some(("1", day_limits(&limits))), None);
    let mut rls = Rls::launch(
        cp.port,
        &[
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "300"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
    );
    let lost = rls.p.line(|l| l.contains("lost the xDS server")).await;
    assert!(lost.contains("too large"), "{lost}");
    assert!(!cp.nonces_of("1").is_empty());
    assert!(cp
        .seen()
        .iter()
        .all(|s| s.version.is_empty() && s.error.is_none()));
    // A small one passes.
    cp.push("2", day_limits(&[("k", 1)]));
    cp.acked("2").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 0));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}
