//! gRPC health (`""` and `ratelimit`), `/healthcheck`, and shutdown.

use std::time::{Duration, Instant};

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::support::*;

const CFG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

pub async fn grpc_status(addr: std::net::SocketAddr, service: &str) -> i32 {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let req = HealthCheckRequest {
        service: service.to_owned(),
    };
    client.check(req).await.unwrap().into_inner().status
}

/// Waits (polling, bounded) until the gRPC status of `ratelimit` is `want`.
pub async fn until_status(addr: std::net::SocketAddr, want: ServingStatus) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = grpc_status(addr, "ratelimit").await;
        if status == want as i32 || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn serving_until_shutdown_begins() {
    let rls = Rls::start(&[("d.yaml", CFG)], &[]).await;
    let (grpc, http_addr) = (rls.running().grpc_addr, rls.running().http_addr);
    assert_eq!(grpc_status(grpc, "").await, ServingStatus::Serving as i32);
    assert_eq!(
        until_status(grpc, ServingStatus::Serving).await,
        ServingStatus::Serving as i32
    );
    // What SIGTERM does first: health fails, the listeners still answer.
    rls.running().health.stopping();
    assert_eq!(
        until_status(grpc, ServingStatus::NotServing).await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(
        grpc_status(grpc, "").await,
        ServingStatus::Serving as i32,
        "\"\" is always SERVING"
    );
    let (status, _, body) = http(http_addr, "GET", "/healthcheck", "").await;
    assert_eq!((status, body.as_str()), (500, ""));
    rls.stop().await;
    assert!(
        tokio::net::TcpStream::connect(http_addr).await.is_err(),
        "stopped listening"
    );
}

#[tokio::test]
async fn healthy_with_at_least_one_config_loaded() {
    let env = [("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")];
    let rls = Rls::start(&[], &env).await;
    let addr = rls.running().http_addr;
    assert_eq!(http(addr, "GET", "/healthcheck", "").await.0, 500);
    rls.rewrite("d.yaml", CFG).await.unwrap();
    assert_eq!(http(addr, "GET", "/healthcheck", "").await.0, 200);
    rls.stop().await;
}

/// A memory store whose checks wait at a gate: a call can be held in
/// flight for as long as a test needs.
#[derive(Clone)]
struct Gated {
    inner: tower_throttle::MemoryStore,
    entered: std::sync::Arc<tokio::sync::Notify>,
    open: std::sync::Arc<tokio::sync::Semaphore>,
}

impl tower_throttle::Store for Gated {
    fn decide<'a>(
        &'a self,
        charges: &'a [tower_throttle::store::Charge<'a>],
    ) -> tower_throttle::store::Answer<
        impl std::future::Future<
                Output = Result<tower_throttle::store::Decisions, tower_throttle::StoreError>,
            > + Send
            + 'a,
    > {
        tower_throttle::store::Answer::Later(async move {
            self.entered.notify_one();
            let _pass = self.open.acquire().await;
            self.inner.decide(charges).await
        })
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &tower_throttle::Policy,
        receipt: &tower_throttle::decision::Receipt,
    ) -> Result<(), tower_throttle::StoreError> {
        self.inner.refund(key, policy, receipt).await
    }

    async fn reset(
        &self,
        key: &[u8],
        policy: &tower_throttle::Policy,
    ) -> Result<(), tower_throttle::StoreError> {
        self.inner.reset(key, policy).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_finish_after_shutdown_begins() {
    let gated = Gated {
        inner: tower_throttle::MemoryStore::new(),
        entered: Default::default(),
        open: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let dir = Dir::new();
    dir.write("d.yaml", CFG);
    let settings = settings(&dir, &[]);
    let store = tower_throttle::store::BoxStore::new(gated.clone());
    let mut rls = Rls::start_hooked(dir, &settings, Some(store)).await;
    let mut client = rls.client.clone();
    let call = tokio::spawn(async move {
        client
            .should_rate_limit(request("d", vec![d(&[("k", "v")])]))
            .await
    });
    gated.entered.notified().await;
    let running = rls.running.take().unwrap();
    running.shutdown();
    assert!(!running.health.is_healthy(), "unhealthy at once");
    let http_addr = running.http_addr;
    let done = tokio::spawn(running.wait());
    gated.open.add_permits(1_000);
    let answer = call
        .await
        .unwrap()
        .expect("the call in flight is answered")
        .into_inner();
    assert_eq!(codes(&answer), vec![(OK, 4)]);
    done.await.unwrap();
    assert!(tokio::net::TcpStream::connect(http_addr).await.is_err());
}
