//! The same requests to envoyproxy/ratelimit and to throttle-rls, each
//! fresh on a Redis of its own with the same configuration; every
//! difference in the answers is printed (`duration_until_reset` may differ
//! by one second: the two calls are not at the same instant).
//! `PEERS_VERBOSE=1` prints every answer of throttle-rls too.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::load::{connect, Client};
use crate::procs::{Bins, Kind, Redis, Server, Store};

/// Times each request is sent, so that limits are reached.
const REPEAT: usize = 4;

/// Upstream's README shapes: key-only, named, replaces, nested,
/// unlimited, shadow, wildcard, zero, allow-listed, quota.
const YAML: &str = r#"domain: cmp
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /a
    rate_limit: {unit: hour, requests_per_unit: 2, name: path_a}
  - key: tier
    value: gold
    rate_limit:
      unit: hour
      requests_per_unit: 5
      replaces: [{name: path_a}]
  - key: org
    value: acme
    descriptors:
      - key: team
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ip
    value: "10.*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: allow
    value: me
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

fn d(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    let entries = entries.iter().map(|&(key, value)| Entry {
        key: key.into(),
        value: value.into(),
    });
    RateLimitDescriptor {
        entries: entries.collect(),
        ..Default::default()
    }
}

fn hits(entries: &[(&str, &str)], value: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value }),
        ..d(entries)
    }
}

fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend,
    }
}

/// The shapes sent, each `REPEAT` times in a row.
fn shapes() -> Vec<(&'static str, RateLimitRequest)> {
    let override_limit = RateLimitDescriptor {
        // Unit 2 is MINUTE in envoy.type.v3.RateLimitUnit.
        limit: Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 2,
        }),
        ..d(&[("user", "override")])
    };
    vec![
        ("key-only", req("cmp", vec![d(&[("user", "a")])], 0)),
        (
            "request hits_addend 2",
            req("cmp", vec![d(&[("user", "b")])], 2),
        ),
        (
            "descriptor hits_addend 0",
            req("cmp", vec![hits(&[("user", "c")], 0)], 0),
        ),
        (
            "descriptor hits_addend 2 over request 5",
            req("cmp", vec![hits(&[("user", "c")], 2)], 5),
        ),
        (
            "hits_addend u32::MAX",
            req("cmp", vec![d(&[("user", "huge")])], u32::MAX),
        ),
        ("named", req("cmp", vec![d(&[("path", "/a")])], 0)),
        (
            "replaces",
            req("cmp", vec![d(&[("path", "/a")]), d(&[("tier", "gold")])], 0),
        ),
        (
            "nested",
            req("cmp", vec![d(&[("org", "acme"), ("team", "x")])], 0),
        ),
        (
            "nested, placeholder only",
            req("cmp", vec![d(&[("org", "acme")])], 0),
        ),
        (
            "nested, one entry too many",
            req(
                "cmp",
                vec![d(&[("org", "acme"), ("team", "x"), ("more", "1")])],
                0,
            ),
        ),
        ("unlimited", req("cmp", vec![d(&[("free", "x")])], 0)),
        ("shadow", req("cmp", vec![d(&[("shadow", "x")])], 0)),
        (
            "wildcard",
            req(
                "cmp",
                vec![d(&[("ip", "10.1.2.3")]), d(&[("ip", "11.0.0.1")])],
                0,
            ),
        ),
        ("zero", req("cmp", vec![d(&[("blocked", "x")])], 0)),
        ("allow-listed", req("cmp", vec![d(&[("allow", "me")])], 0)),
        ("quota", req("cmp", vec![d(&[("quota", "x")])], 0)),
        ("unmatched", req("cmp", vec![d(&[("nomatch", "1")])], 0)),
        ("unknown domain", req("nope", vec![d(&[("user", "a")])], 0)),
        ("limit override", req("cmp", vec![override_limit], 0)),
        (
            "same counter twice",
            req(
                "cmp",
                vec![d(&[("user", "twice")]), d(&[("user", "twice")])],
                0,
            ),
        ),
        (
            "one of two over",
            req("cmp", vec![d(&[("user", "e")]), d(&[("blocked", "x")])], 0),
        ),
        ("no descriptors", req("cmp", vec![], 0)),
        ("empty domain", req("", vec![d(&[("user", "a")])], 0)),
        ("empty value", req("cmp", vec![d(&[("user", "")])], 0)),
        ("empty entries", req("cmp", vec![d(&[])], 0)),
    ]
}

/// An answer with the reset durations taken out (compared apart, with
/// one second's slack), as text.
fn split(r: Result<RateLimitResponse, tonic::Status>) -> (String, Vec<Option<i64>>) {
    match r {
        Ok(mut r) => {
            let resets = r
                .statuses
                .iter_mut()
                .map(|s| s.duration_until_reset.take().map(|d| d.seconds))
                .collect();
            (format!("{r:?}"), resets)
        }
        Err(s) => (format!("gRPC error {:?}", s.code()), Vec::new()),
    }
}

fn close(a: &[Option<i64>], b: &[Option<i64>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => (x - y).abs() <= 1,
            (None, None) => true,
            _ => false,
        })
}

async fn ask(c: &mut Client, r: &RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
    c.should_rate_limit(r.clone()).await.map(|r| r.into_inner())
}

/// Global settings tried, each on a fresh pair of servers.
/// (`RESPONSE_DYNAMIC_METADATA=true` is not among them: throttle-rls
/// refuses it at start.)
const SETTINGS: &[&[(&str, &str)]] = &[
    &[],
    &[("SHADOW_MODE", "true")],
    // Different on purpose (rls/README.md): one atomic all-or-nothing
    // check where upstream reads, then increments the exceeding keys.
    &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    &[("CACHE_KEY_PREFIX", "pre:"), ("QUOTA_MODE", "true")],
];

/// Sends every shape `REPEAT` times to both, under each of `SETTINGS`, and
/// prints the differences.
pub async fn compare(bins: &Bins) -> Result<(), String> {
    if bins.get(Kind::Upstream).is_none() {
        return Err("compare needs RLS_PEER_UPSTREAM".into());
    }
    let verbose = std::env::var_os("PEERS_VERBOSE").is_some();
    let (mut sent, mut differ) = (0, 0);
    for env in SETTINGS {
        let (r1, r2) = (Redis::start()?, Redis::start()?);
        let up = Server::upstream_like(bins, Kind::Upstream, Store::Redis(&r1), YAML, env).await?;
        let ours = Server::upstream_like(bins, Kind::Ours, Store::Redis(&r2), YAML, env).await?;
        let (mut cu, mut co) = (connect(up.addr).await?, connect(ours.addr).await?);
        // Minute limits: both answers of a shape fall in one window.
        crate::exact::align_to_window().await;
        let before = differ;
        for (name, r) in shapes() {
            for i in 1..=REPEAT {
                let (a, ra) = split(ask(&mut cu, &r).await);
                let (b, rb) = split(ask(&mut co, &r).await);
                sent += 1;
                if verbose {
                    println!("{env:?} {name}, call {i}: {b} resets {rb:?}");
                }
                if a != b || !close(&ra, &rb) {
                    differ += 1;
                    println!("DIFFERENT with {env:?}: {name}, call {i}\n  upstream:     {a} resets {ra:?}\n  throttle-rls: {b} resets {rb:?}");
                }
            }
        }
        if differ > before {
            println!(
                "upstream log:\n{}\nthrottle-rls log:\n{}",
                up.log(),
                ours.log()
            );
        }
    }
    println!(
        "{sent} calls ({} shapes × {REPEAT} × {} settings): {differ} answered differently",
        shapes().len(),
        SETTINGS.len()
    );
    Ok(())
}
