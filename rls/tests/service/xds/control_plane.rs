//! The control plane the xDS tests run: a tonic ADS server on its own
//! runtime that pushes snapshots, records every DiscoveryRequest and can
//! go away and come back on its port; and the binary under test.

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

use crate::process::{free_port, Proc};
use crate::support::*;

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
