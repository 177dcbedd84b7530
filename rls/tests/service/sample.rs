//! The sample runtime directory (`rls/runtime/current`) that README's
//! one-command start points at: it loads and answers as its comments say.

use std::path::Path;

use crate::support::*;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/runtime/current");

#[tokio::test]
async fn the_sample_configuration_answers_as_its_comments_say() {
    let dir = Dir::new();
    let settings = settings(&dir, &[("RUNTIME_ROOT", ROOT)]);
    let mut rls = Rls::start_with(dir, &settings).await;
    let ip = |a: &str| vec![d(&[("remote_address", a)])];
    for left in (0..10).rev() {
        let r = rls.ask("example", ip("10.0.0.1")).await;
        assert_eq!(codes(&r), vec![(OK, left)]);
    }
    assert_eq!(
        codes(&rls.ask("example", ip("10.0.0.1")).await),
        vec![(OVER, 0)]
    );
    assert_eq!(
        codes(&rls.ask("example", ip("10.0.0.2")).await),
        vec![(OK, 9)]
    );
    rls.advance(1);
    assert_eq!(
        codes(&rls.ask("example", ip("10.0.0.1")).await),
        vec![(OK, 9)]
    );
    let login = || vec![d(&[("header_match", "login")])];
    for left in (0..5).rev() {
        assert_eq!(codes(&rls.ask("example", login()).await), vec![(OK, left)]);
    }
    assert_eq!(codes(&rls.ask("example", login()).await), vec![(OVER, 0)]);
    let user = rls.ask("example", vec![d(&[("user", "alice")])]).await;
    assert_eq!(codes(&user), vec![(OK, 999)]);
    let health = rls
        .ask(
            "example",
            vec![d(&[("user", "alice"), ("path", "/healthz")])],
        )
        .await;
    assert_eq!(codes(&health), vec![(OK, u32::MAX)]);
    let other = rls
        .ask(
            "example",
            vec![d(&[("user", "alice"), ("path", "/orders")])],
        )
        .await;
    assert_eq!(codes(&other), vec![(OK, 0)]);
    assert_eq!(limit_of(&other.statuses[0]), None);
    rls.stop().await;
}

#[test]
fn readmes_one_command_start_points_at_the_sample() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["README.md", "runtime/current/config/example.yaml"] {
        let text = std::fs::read_to_string(manifest.join(file)).unwrap();
        let root = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("RUNTIME_ROOT="))
            .unwrap_or_else(|| panic!("no RUNTIME_ROOT= in {file}"));
        // Run from the workspace root.
        let config = manifest.parent().unwrap().join(root).join("config");
        assert!(
            config.join("example.yaml").is_file(),
            "{file}: {}",
            config.display()
        );
    }
}
