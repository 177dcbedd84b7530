//! Statsd counters under upstream's names, received on real sockets (UDP
//! and TCP, upstream's default); Prometheus named by a statsd_exporter
//! mapping file (`PROMETHEUS_MAPPER_YAML`), Envoy Gateway's and a custom one.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, UdpSocket};

use crate::support::*;

const CFG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const HITS: &str = "ratelimit.service.rate_limit.d.k.total_hits";
const OVER: &str = "ratelimit.service.rate_limit.d.k.over_limit";
const WITHIN: &str = "ratelimit.service.rate_limit.d.k.within_limit";
const LOADS: &str = "ratelimit.service.config_load_success";

/// Adds `name:n|c` lines to `totals`; panics on anything else.
fn add_lines(totals: &mut HashMap<String, u64>, text: &str) {
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (name, rest) = line.split_once(':').expect("name:value|c");
        let n: u64 = rest.strip_suffix("|c").expect("a counter").parse().unwrap();
        assert!(n > 0, "a counter that did not move was sent: {line}");
        *totals.entry(name.to_owned()).or_default() += n;
    }
}

fn reached(totals: &HashMap<String, u64>, want: &[(&str, u64)]) -> bool {
    want.iter()
        .all(|(k, v)| totals.get(*k).copied().unwrap_or(0) >= *v)
}

fn env(port: &str, protocol: &'static str) -> Vec<(&'static str, String)> {
    vec![
        ("USE_STATSD", "true".into()),
        ("STATSD_HOST", "127.0.0.1".into()),
        ("STATSD_PORT", port.into()),
        ("STATSD_PROTOCOL", protocol.into()),
        ("STATS_FLUSH_INTERVAL", "50ms".into()),
    ]
}

async fn six_hits(rls: &mut Rls) {
    for _ in 0..6 {
        rls.ask("d", vec![d(&[("k", "v")])]).await;
    }
}

#[tokio::test]
async fn statsd_over_udp_sends_increases_under_upstream_names() {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = socket.local_addr().unwrap().port().to_string();
    let vars = env(&port, "udp");
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut rls = Rls::start(&[("d.yaml", CFG)], &vars).await;
    six_hits(&mut rls).await;
    let mut totals = HashMap::new();
    let mut buf = vec![0u8; 65_536];
    let first = [(HITS, 6), (WITHIN, 5), (OVER, 1), (LOADS, 1)];
    let mut asked_again = false;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut buf))
            .await
            .expect("a datagram within 10 s")
            .unwrap();
        assert!(n <= 1_432, "a datagram of {n} bytes");
        add_lines(&mut totals, std::str::from_utf8(&buf[..n]).unwrap());
        if !asked_again && reached(&totals, &first) {
            // Increases, not totals: two more hits add two.
            assert_eq!(totals[HITS], 6, "{totals:?}");
            asked_again = true;
            rls.ask("d", vec![d(&[("k", "v")])]).await;
            rls.ask("d", vec![d(&[("k", "v")])]).await;
        }
        if asked_again && reached(&totals, &[(HITS, 8), (OVER, 3)]) {
            break;
        }
    }
    assert_eq!((totals[HITS], totals[OVER], totals[LOADS]), (8, 3, 1));
    rls.stop().await;
}

#[tokio::test]
async fn statsd_over_tcp_by_default_as_upstreams_library() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let mut vars = env(&port, "udp");
    vars.retain(|(k, _)| *k != "STATSD_PROTOCOL");
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut rls = Rls::start(&[("d.yaml", CFG)], &vars).await;
    six_hits(&mut rls).await;
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("a connection within 10 s")
        .unwrap();
    let mut totals = HashMap::new();
    let mut text = String::new();
    let mut buf = vec![0u8; 8_192];
    while !reached(&totals, &[(HITS, 6), (WITHIN, 5), (OVER, 1), (LOADS, 1)]) {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("lines within 10 s")
            .unwrap();
        assert!(n > 0, "statsd connection closed");
        text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        // Whole lines only; a partial one waits for the next read.
        let done = text.rfind('\n').map_or(0, |i| i + 1);
        add_lines(&mut totals, &text[..done]);
        text.drain(..done);
    }
    rls.stop().await;
}

/// Envoy Gateway's mapping file (the same mappings as upstream's default
/// mapper, without the response-time scale).
pub const GATEWAY_MAPPER: &str = include_str!("envoy_gateway_statsd_conf.yaml");

async fn scrape(files: &[(&str, &str)], mapper: &str) -> String {
    let dir = Dir::new();
    dir.write("d.yaml", CFG);
    for (name, text) in files {
        dir.write(name, text);
    }
    let path = dir.0.join("mapper.yaml");
    std::fs::write(&path, mapper).unwrap();
    let path = path.display().to_string();
    let env = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("PROMETHEUS_MAPPER_YAML", path.as_str()),
    ];
    let settings = settings(&dir, &env);
    let mut rls = Rls::start_with(dir, &settings).await;
    six_hits(&mut rls).await;
    rls.ask("e", vec![d(&[("a", "1"), ("b", "2"), ("c", "3")])])
        .await;
    let (status, _, text) = http(rls.running().metrics_addr.unwrap(), "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    rls.stop().await;
    text
}

#[tokio::test]
async fn envoy_gateways_mapper_names_counters_as_the_built_in_names() {
    let deep = "domain: e\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n            rate_limit: {unit: minute, requests_per_unit: 9}\n";
    let text = scrape(&[("e.yaml", deep)], GATEWAY_MAPPER).await;
    for line in [
        r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="k"} 6"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="d",key1="k"} 1"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="e",key1="a",key2="b"} 1"#,
        "ratelimit_service_config_load_success 1",
        r#"ratelimit_service_rate_limit_within_limit{domain="d",key1="k"} 5"#,
        r#"ratelimit_service_rate_limit_near_limit{domain="e",key1="a",key2="b"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
}

#[tokio::test]
async fn a_custom_mapper_renames_relabels_and_drops() {
    let mapper = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "rls_refused"
    labels: {tenant: "$1", rule: "$2"}
  - match: "ratelimit\\.service\\.rate_limit\\..*"
    match_type: regex
    name: "dropped"
    action: drop
"#;
    let text = scrape(&[], mapper).await;
    assert!(
        text.lines()
            .any(|l| l == r#"rls_refused{rule="k",tenant="d"} 1"#),
        "{text}"
    );
    assert!(!text.contains("total_hits"), "{text}");
    assert!(
        text.contains("ratelimit_service_config_load_success 1"),
        "{text}"
    );
}

#[tokio::test]
async fn an_unusable_mapper_stops_the_start() {
    let dir = Dir::new();
    let path = dir.0.join("mapper.yaml");
    std::fs::write(&path, "mappings:\n  - match: a..b\n    name: x\n").unwrap();
    let path = path.display().to_string();
    let env = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("PROMETHEUS_MAPPER_YAML", path.as_str()),
    ];
    let err = throttle_rls::server::start(&settings(&dir, &env), Default::default())
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("PROMETHEUS_MAPPER_YAML") && err.contains("invalid glob"),
        "{err}"
    );
}
