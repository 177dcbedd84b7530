//! Bad requests get gRPC errors, never a panic; memory stays bounded.

use tonic::Code;

use crate::support::*;

const CFG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

#[tokio::test]
async fn upstream_service_errors() {
    let mut rls = Rls::start(&[("d.yaml", CFG)], &[]).await;
    let e = rls
        .try_ask(request("", vec![d(&[("k", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::Unknown, "rate limit domain must not be empty")
    );
    let e = rls.try_ask(request("d", vec![])).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::Unknown,
            "rate limit descriptor list must not be empty"
        )
    );
    let e = rls
        .try_ask(request("d", vec![dl(&[("k", "v")], 1, 99)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // The server still answers.
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
        vec![(OK, 4)]
    );
    rls.stop().await;
}

#[tokio::test]
async fn no_configuration_loaded() {
    let mut rls = Rls::start(&[("d.yaml", "domain: d\ndescriptors:\n  - key: ''\n")], &[]).await;
    let e = rls
        .try_ask(request("d", vec![d(&[("k", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (Code::Unknown, "no rate limit configuration loaded")
    );
    rls.stop().await;
}

#[tokio::test]
async fn oversized_requests_are_refused() {
    let env = [
        ("RLS_MAX_DESCRIPTORS", "4"),
        ("RLS_MAX_ENTRIES", "3"),
        ("RLS_MAX_VALUE_BYTES", "64"),
    ];
    let mut rls = Rls::start(&[("d.yaml", CFG)], &env).await;
    let many = vec![d(&[("k", "v")]); 5];
    let e = rls.try_ask(request("d", many)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("5 descriptors (at most 4)"),
        "{}",
        e.message()
    );
    let deep = vec![d(&[("a", "1"), ("b", "2"), ("c", "3"), ("k", "v")])];
    assert_eq!(
        rls.try_ask(request("d", deep)).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let long = "x".repeat(65);
    let e = rls
        .try_ask(request("d", vec![d(&[("k", &long)])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(!e.message().contains(&long), "the value is not echoed");
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
        vec![(OK, 4)]
    );
    rls.stop().await;
}

#[tokio::test]
async fn attacker_chosen_values_cannot_grow_the_memory_store() {
    let mut rls = Rls::start(&[("d.yaml", CFG)], &[("RLS_MEMORY_MAX_KEYS", "100")]).await;
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "known")])]).await),
        vec![(OK, 4)]
    );
    for chunk in 0..20 {
        let flood: Vec<_> = (0..50).map(|i| format!("attacker-{chunk}-{i}")).collect();
        let descriptors = flood.iter().map(|v| d(&[("k", v)])).collect();
        rls.ask("d", descriptors).await;
    }
    let memory = rls.running().memory.clone().unwrap();
    assert!(memory.len() <= 100, "{} keys held", memory.len());
    // A key held before the flood keeps its exact count.
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "known")])]).await),
        vec![(OK, 3)]
    );
    rls.stop().await;
}
