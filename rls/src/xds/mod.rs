//! `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration from an xDS management
//! server, as upstream's `src/provider/xds_grpc_sotw_provider.go` takes it
//! (with go-control-plane's `pkg/client/sotw/v3` ADS client):
//!
//! * one ADS stream (`StreamAggregatedResources`, state of the world)
//!   subscribing to `type.googleapis.com/ratelimit.config.ratelimit.v3.
//!   RateLimitConfig` for the node `CONFIG_GRPC_XDS_NODE_ID` with the
//!   metadata `CONFIG_GRPC_XDS_NODE_METADATA`, the headers
//!   `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` sent as gRPC metadata;
//! * each response is a whole snapshot: every resource is loaded as a
//!   config file named by its `name` ([`convert`]), into one table. A good
//!   snapshot is put in force and ACKed (`version_info` the response's
//!   version, `response_nonce` its nonce); a bad one is NACKed (the last
//!   ACKed version, the nonce, `error_detail.message` the reason) and the
//!   table in force stays, `/rlconfig` showing the error as for files;
//! * a lost stream is logged at error level; the table in force stays;
//!   after upstream's backoff (`XDS_CLIENT_BACKOFF_*`) the client connects
//!   again (attempts `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` apart
//!   while the server cannot be reached) and says so at info level. As
//!   upstream's client, the first request of a new stream carries the
//!   version and nonce of the last response received.

pub mod backoff;
pub mod convert;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::LoadOptions;
use crate::service::RateLimiter;
use crate::settings::{Settings, XdsSettings};
use backoff::{jittered, Backoff};
use convert::TYPE_URL;

/// How long one connection attempt may take (TCP and TLS).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The xDS client of one server.
pub struct XdsClient {
    settings: XdsSettings,
    options: LoadOptions,
    limiter: Arc<RateLimiter>,
    node: Node,
    /// True once a snapshot was processed (loaded or refused by the loader),
    /// upstream's first "config update event".
    first: watch::Sender<bool>,
}

/// Resolves when the first snapshot was processed.
#[derive(Clone)]
pub struct FirstSnapshot(watch::Receiver<bool>);

impl FirstSnapshot {
    /// Waits for it (forever if it never comes, as upstream).
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|s| *s).await;
    }
}

/// What the stream has seen, kept across reconnections (go-control-plane's
/// `lastAckedResponse` / `lastReceivedResponse`).
#[derive(Default)]
struct State {
    acked_version: String,
    received_version: String,
    received_nonce: String,
}

/// The node sent on every request: upstream's `getClientNode`.
pub fn node(s: &XdsSettings) -> Node {
    let fields = s
        .node_metadata
        .iter()
        .map(|(k, v)| {
            let value = Value {
                kind: Some(Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: s.node_id.clone(),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

/// An error and its causes, `a: b: c`.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

impl XdsClient {
    /// A client for `settings.xds` (which must be set) feeding `limiter`.
    pub fn new(
        settings: &Settings,
        limiter: Arc<RateLimiter>,
    ) -> Option<(XdsClient, FirstSnapshot)> {
        let xds = settings.xds.clone()?;
        let (first, rx) = watch::channel(false);
        Some((
            XdsClient {
                node: node(&xds),
                settings: xds,
                options: LoadOptions {
                    merge_domains: settings.merge_domain_config,
                    strict_upstream_keys: settings.strict_upstream_keys,
                    ignore_dotfiles: false,
                },
                limiter,
                first,
            },
            FirstSnapshot(rx),
        ))
    }

    /// Connects, follows the stream, and connects again, forever.
    pub async fn run(self) {
        let url = self.settings.server_url.clone();
        tracing::info!(server = %url, node = %self.settings.node_id,
            "starting the xDS client for rate-limit configurations");
        let mut state = State::default();
        let mut backoff = Backoff::new(self.settings.backoff);
        let mut connected_before = false;
        loop {
            let channel = self.dial().await;
            if connected_before {
                tracing::info!(server = %url, "connected to the xDS server again");
            } else {
                tracing::info!(server = %url, "connected to the xDS server");
            }
            connected_before = true;
            let lost = self.follow(channel, &mut state).await;
            let pause = backoff.duration();
            let kept = if self.limiter.table().is_some() {
                "the configuration in force stays"
            } else {
                "no configuration is in force yet"
            };
            tracing::error!(server = %url, error = %lost,
                "lost the xDS server; {kept}; connecting again in {pause:?}");
            tokio::time::sleep(pause).await;
        }
    }

    /// Connects, retrying every `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`
    /// (±50%) until it can.
    async fn dial(&self) -> Channel {
        let mut failures = 0u64;
        loop {
            match self.connect().await {
                Ok(channel) => return channel,
                Err(e) => {
                    let pause = jittered(self.settings.connect_retry_interval, 0.5);
                    if failures == 0 {
                        tracing::error!(server = %self.settings.server_url, error = %e,
                            "cannot connect to the xDS server; trying again every {:?}",
                            self.settings.connect_retry_interval);
                    } else {
                        tracing::debug!(server = %self.settings.server_url, error = %e,
                            attempt = failures + 1, "cannot connect to the xDS server");
                    }
                    failures += 1;
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    async fn connect(&self) -> Result<Channel, String> {
        let s = &self.settings;
        let host = if s.host.contains(':') {
            format!("[{}]", s.host)
        } else {
            s.host.clone()
        };
        let scheme = if s.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{host}:{}", s.port))
            .map_err(|e| chain(&e))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        if s.tls.is_some() {
            endpoint = endpoint.tls_config(self.tls()?).map_err(|e| chain(&e))?;
        }
        endpoint.connect().await.map_err(|e| chain(&e))
    }

    /// Upstream's `ConfigGrpcXdsServerTlsConfig`: the client certificate,
    /// the system's roots plus the CA file, the server name (SAN or host).
    /// The files are read on every connection, so rotated ones are used.
    fn tls(&self) -> Result<ClientTlsConfig, String> {
        let s = &self.settings;
        let Some(t) = &s.tls else {
            return Ok(ClientTlsConfig::new());
        };
        let read = |name: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{name}: cannot read {}: {e}", path.display()))
        };
        let mut config =
            ClientTlsConfig::new().domain_name(t.san.clone().unwrap_or_else(|| s.host.clone()));
        if let Some((cert, key)) = &t.client {
            config = config.identity(Identity::from_pem(
                read("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert)?,
                read("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key)?,
            ));
        }
        let native = rustls_native_certs::load_native_certs();
        let anchors: Vec<_> = native
            .certs
            .iter()
            .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
            .map(|a| a.to_owned())
            .collect();
        config = config.trust_anchors(anchors);
        if let Some(ca) = &t.ca {
            let pem = read("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca)?;
            config = config.ca_certificate(Certificate::from_pem(pem));
        }
        Ok(config)
    }

    /// The request: upstream's `send` (node on every request).
    fn request(&self, state: &State, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: state.acked_version.clone(),
            node: Some(self.node.clone()),
            type_url: TYPE_URL.to_owned(),
            response_nonce: state.received_nonce.clone(),
            error_detail: error.map(|message| Status {
                message,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// One stream, until it fails: why.
    async fn follow(&self, channel: Channel, state: &mut State) -> String {
        let s = &self.settings;
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        if let Some(n) = s.max_msg_size {
            client = client.max_decoding_message_size(n);
        }
        let (tx, rx) = mpsc::channel(8);
        // go-control-plane's InitConnect: Ack() of the last response received.
        state.acked_version = state.received_version.clone();
        let _ = tx.send(self.request(state, None)).await;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        for (k, v) in &s.additional_headers {
            let md = request.metadata_mut();
            if k.ends_with("-bin") {
                if let Ok(key) = tonic::metadata::BinaryMetadataKey::from_bytes(k.as_bytes()) {
                    md.append_bin(
                        key,
                        tonic::metadata::BinaryMetadataValue::from_bytes(v.as_bytes()),
                    );
                }
            } else if let (Ok(key), Ok(value)) = (
                tonic::metadata::AsciiMetadataKey::from_bytes(k.as_bytes()),
                v.parse(),
            ) {
                md.append(key, value);
            }
        }
        let mut responses = match client.stream_aggregated_resources(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => return status_text(&status),
        };
        loop {
            match responses.message().await {
                Ok(Some(response)) => {
                    let reply = self.apply(response, state);
                    if tx.send(reply).await.is_err() {
                        return "the request stream closed".into();
                    }
                }
                Ok(None) => return "the server ended the stream".into(),
                Err(status) => return status_text(&status),
            }
        }
    }

    /// Loads a snapshot; the ACK or NACK to send.
    fn apply(&self, response: DiscoveryResponse, state: &mut State) -> DiscoveryRequest {
        state.received_version = response.version_info.clone();
        state.received_nonce = response.nonce.clone();
        let version = &response.version_info;
        let decoded: Result<Vec<_>, String> =
            response.resources.iter().map(convert::decode).collect();
        let configs = match decoded {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(version = %version, error = %e,
                    "xDS snapshot refused (NACK): a resource is not a RateLimitConfig; \
                     the configuration in force stays");
                self.limiter.set_error(e.clone());
                return self.request(state, Some(e));
            }
        };
        // Upstream's first config update event is sent below, once the
        // snapshot was loaded, well or not.
        let loaded = convert::load(&configs, self.options)
            .and_then(|table| self.limiter.check_table(&table).map(|()| table));
        match loaded {
            Ok(table) => {
                let (domains, limits) = table.summary();
                tracing::info!(version = %version, domains = domains.len(), limits,
                    "loaded the rate-limit configuration from the xDS server (ACK)");
                self.limiter.set_table(table);
                self.first.send_replace(true);
                state.acked_version = version.clone();
                self.request(state, None)
            }
            Err(e) => {
                let kept = if self.limiter.table().is_some() {
                    "the previous one stays in force"
                } else {
                    "none is in force, so every request fails until a valid one arrives"
                };
                tracing::error!(version = %version, error = %e,
                    "xDS snapshot refused (NACK); {kept}");
                let text = e.to_string();
                self.limiter.set_error(text.clone());
                self.first.send_replace(true);
                self.request(state, Some(text))
            }
        }
    }
}

fn status_text(status: &tonic::Status) -> String {
    let mut out = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = std::error::Error::source(status) {
        out.push_str(": ");
        out.push_str(&chain(source));
    }
    out
}
