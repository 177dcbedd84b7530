//! Reading layer files: what is accepted, and what each refusal says.

use std::time::Duration;

use super::*;
use crate::policy::Policy;

const MIN: Duration = Duration::from_secs(60);

fn yaml_error(text: &str) -> ConfigError {
    LayerConfig::parse("limits.yaml", text).unwrap_err()
}

/// The same layer in the three formats reads the same.
#[test]
fn yaml_toml_and_json_say_the_same() {
    let yaml = "\
prefix: ugc
key: { header: x-user-id }
mode: { delay_up_to: 500ms }
on_store_failure: open
store_timeout: 50ms
lockout: { strikes: 3, within: 10m, lock: 1h }
rules:
  - name: reply
    policy: { sliding_log: { limit: 5, window: 60s } }
  - name: post
    policy: { cell: { max_burst: 15, count: 30, period: 1h } }
    key: { first_of: [bearer_token, { client_ip: { trust: [10.0.0.0/8], header: forwarded } }] }
    cost: 2
";
    let toml = r#"
prefix = "ugc"
key = { header = "x-user-id" }
mode = { delay_up_to = "500ms" }
on_store_failure = "open"
store_timeout = "50ms"
lockout = { strikes = 3, within = "10m", lock = "1h" }
[[rules]]
name = "reply"
policy = { sliding_log = { limit = 5, window = "60s" } }
[[rules]]
name = "post"
policy = { cell = { max_burst = 15, count = 30, period = "1h" } }
key = { first_of = ["bearer_token", { client_ip = { trust = ["10.0.0.0/8"], header = "forwarded" } }] }
cost = 2
"#;
    let json = r#"{"prefix": "ugc", "key": {"header": "x-user-id"},
 "mode": {"delay_up_to": "500ms"}, "on_store_failure": "open", "store_timeout": "50ms",
 "lockout": {"strikes": 3, "within": "10m", "lock": "1h"},
 "rules": [
  {"name": "reply", "policy": {"sliding_log": {"limit": 5, "window": "60s"}}},
  {"name": "post", "policy": {"cell": {"max_burst": 15, "count": 30, "period": "1h"}},
   "key": {"first_of": ["bearer_token", {"client_ip": {"trust": ["10.0.0.0/8"], "header": "forwarded"}}]},
   "cost": 2}]}"#;
    let read = [
        LayerConfig::parse_as("l.yaml", yaml, Format::Yaml).unwrap(),
        LayerConfig::parse_as("l.toml", toml, Format::Toml).unwrap(),
        LayerConfig::parse_as("l.json", json, Format::Json).unwrap(),
    ];
    for config in &read {
        assert_eq!(format!("{config:?}"), format!("{:?}", read[0]));
    }
    let c = &read[0];
    assert_eq!(c.prefix.as_deref(), Some("ugc"));
    assert_eq!(c.rules[0].policy.0, Policy::sliding_log(5, MIN).unwrap());
    let hour = Duration::from_secs(3600);
    assert_eq!(c.rules[1].policy.0, Policy::cell(15, 30, hour).unwrap());
    assert_eq!(c.rules[1].cost, Some(CostConfig::Fixed(2)));
    assert!(matches!(c.mode, ModeConfig::DelayUpTo(d) if d == Duration::from_millis(500)));
    assert!(matches!(c.on_store_failure, FailConfig::Open));
    assert_eq!(c.store_timeout, Some(Duration::from_millis(50)));
    assert_eq!(
        c.lockout.as_ref().map(|l| (l.strikes, l.lock)),
        Some((3, hour))
    );
}

#[test]
fn every_algorithm_reads_as_its_constructor_builds_it() {
    let cases = [
        (
            "{ token_bucket: { capacity: 10, per_second: 2.5 } }",
            Policy::token_bucket(10, 2.5),
        ),
        (
            "{ funnel: { capacity: 10, per_second: 0.5 } }",
            Policy::funnel(10, 0.5),
        ),
        (
            "{ fixed_window: { limit: 7, window: 1d } }",
            Policy::fixed_window(7, 1440 * MIN),
        ),
        (
            "{ sliding_window: { limit: 7, window: 15m } }",
            Policy::sliding_window(7, 15 * MIN),
        ),
        (
            "{ concurrency: { max_in_flight: 4 } }",
            Policy::concurrency(4),
        ),
        (
            "{ concurrency: { max_in_flight: 4, lease: 30s } }",
            Policy::concurrency_with_lease(4, Duration::from_secs(30)),
        ),
    ];
    for (policy, want) in cases {
        let text = format!("rules: [{{ name: r, policy: {policy} }}]");
        let config = LayerConfig::parse("l.yaml", &text).unwrap();
        assert_eq!(config.rules[0].policy.0, want.unwrap(), "{policy}");
    }
}

/// Each refusal names the file, the line and column, and the field.
#[test]
fn refusals_name_the_file_the_line_and_the_field() {
    let e = yaml_error(
        "rules:\n  - name: reply\n    polcy: { sliding_log: { limit: 5, window: 60s } }\n",
    );
    assert_eq!((e.line, e.column), (Some(3), Some(5)));
    assert_eq!(e.field.as_deref(), Some("rules[0].polcy"));
    assert!(e.message.starts_with("unknown field `polcy`"), "{e}");
    assert!(
        e.to_string()
            .starts_with("limits.yaml:3:5: rules[0].polcy: "),
        "{e}"
    );

    let e = yaml_error("rules:\n  - name: reply\n    policy:\n      sliding_log:\n        limit: 5\n        window: 60\n");
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(6), Some("rules[0].policy.sliding_log.window"))
    );
    assert!(e.message.contains("needs a unit"), "{e}");

    let e = yaml_error(
        "rules:\n  - name: reply\n    policy: { sliding_log: { limit: 0, window: 60s } }\n",
    );
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(3), Some("rules[0].policy"))
    );
    assert!(e.message.contains("at least 1"), "{e}");

    let e = yaml_error("rules:\n  - name: a\n    policy: { leaky: { limit: 5 } }\n");
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(3), Some("rules[0].policy.leaky"))
    );
    assert!(e.message.starts_with("unknown variant `leaky`"), "{e}");

    let e = yaml_error(
        "rules:\n  - name: 'bad name'\n    policy: { sliding_log: { limit: 5, window: 60s } }\n",
    );
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(2), Some("rules[0].name"))
    );

    let twice = "  - name: a\n    policy: { sliding_log: { limit: 5, window: 60s } }\n";
    let e = yaml_error(&format!("rules:\n{twice}{twice}"));
    assert_eq!(
        (e.field.as_deref(), &*e.message),
        (Some("rules"), "two rules are named \"a\"")
    );

    let e = yaml_error("key: { client_ip: { trust: [10.0.0.0/33] } }\nrules: []\n");
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(1), Some("key.client_ip.trust"))
    );
    assert!(e.message.contains("not a CIDR"), "{e}");

    let e = yaml_error("key: { header: 'x user' }\nrules: []\n");
    assert_eq!(e.field.as_deref(), Some("key.header"));

    let e = yaml_error("rules: []\n");
    assert_eq!(e.message, "a layer needs at least one rule");

    let e = yaml_error("rules: [\n");
    assert_eq!(e.line, Some(2), "a syntax error has its place too: {e}");
}

#[test]
fn toml_and_json_refusals_have_their_place_too() {
    let toml =
        "[[rules]]\nname = \"a\"\npolicy = { sliding_log = { limit = 0, window = \"60s\" } }\n";
    let e = LayerConfig::parse_as("l.toml", toml, Format::Toml).unwrap_err();
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(3), Some("rules[0].policy"))
    );
    let json = "{\"rules\": [{\"name\": \"a\",\n \"policy\": {\"sliding_log\": {\"limit\": 0, \"window\": \"60s\"}}}]}";
    let e = LayerConfig::parse_as("l.json", json, Format::Json).unwrap_err();
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(2), Some("rules[0].policy"))
    );
    let e = LayerConfig::parse_as("l.json", "{\"rules\": []} trailing", Format::Json).unwrap_err();
    assert_eq!(e.line, Some(1));
}

#[test]
fn files_are_read_by_their_extension() {
    let dir = std::env::temp_dir().join(format!("tower-throttle-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = "rules: [{ name: r, policy: { sliding_log: { limit: 5, window: 60s } } }]";
    std::fs::write(dir.join("a.yml"), rules).unwrap();
    assert_eq!(
        LayerConfig::from_path(dir.join("a.yml")).unwrap().rules[0].name,
        "r"
    );
    std::fs::write(dir.join("a.txt"), rules).unwrap();
    let e = LayerConfig::from_path(dir.join("a.txt")).unwrap_err();
    assert!(e.message.contains(".yaml"), "{e}");
    let e = LayerConfig::from_path(dir.join("missing.yaml")).unwrap_err();
    assert!(
        e.to_string().contains("missing.yaml") && e.message.contains("cannot be read"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The file README.md shows reads, and says what README.md says it does.
#[test]
fn the_readme_file_reads() {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("# limits.yaml: one route")
        .expect("README shows limits.yaml");
    let text = &readme[start..];
    let text = &text[..text.find("```").unwrap()];
    let config = ServiceConfig::parse("limits.yaml", text).unwrap();
    let routes: Vec<&str> = config.routes().map(|(name, _)| name).collect();
    assert_eq!(routes, ["completions", "reply"]);
    let reply = config.route("reply").unwrap();
    let names: Vec<&str> = reply.rules.iter().map(|r| &*r.name).collect();
    assert_eq!(names, ["per-minute", "per-day"]);
    assert_eq!(
        reply.rules[0].policy.0,
        Policy::sliding_log(5, MIN).unwrap()
    );
    assert_eq!(reply.lockout.as_ref().map(|l| l.strikes), Some(3));
    let e = ServiceConfig::parse(
        "limits.yaml",
        &text.replacen("window: 60s", "window: 60", 1),
    )
    .unwrap_err();
    assert_eq!(
        e.field.as_deref(),
        Some("routes.reply.rules[0].policy.sliding_log.window")
    );
    let shown = e.to_string();
    let shown = &shown[..shown.find(" (").unwrap_or(shown.len())];
    assert!(
        readme.contains(shown),
        "README.md shows the error as it is: {shown}"
    );
}

/// Every builder option of `ThrottleLayer` and `Rule` has a row in the
/// module's table of file forms (a new option without one fails here).
#[test]
fn every_builder_option_has_a_file_form_or_says_why_not() {
    let sources = [
        include_str!("../layer/behaviour.rs"),
        include_str!("../layer/responses.rs"),
        include_str!("../layer/rules.rs"),
        include_str!("../rule.rs"),
    ];
    // Not options: constructors, getters and checks.
    let not_options = [
        "new",
        "name_of",
        "policy",
        "rules",
        "store_error",
        "validate",
        "store",
    ];
    let table = include_str!("mod.rs");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("//! | `")).collect();
    let mut missing = Vec::new();
    for source in sources {
        let mut in_impl_rule_error = false;
        for line in source.lines() {
            if line.starts_with("impl RuleError") {
                in_impl_rule_error = true;
            } else if line.starts_with("impl ") {
                in_impl_rule_error = false;
            }
            let Some(rest) = line.trim_start().strip_prefix("pub fn ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if in_impl_rule_error
                || not_options.contains(&name.as_str())
                || rest.contains("(&self)")
            {
                continue;
            }
            let cell = format!("`{name}`");
            if !rows
                .iter()
                .any(|row| row.split('|').nth(1).is_some_and(|c| c.contains(&cell)))
            {
                missing.push(name);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "builder options without a row in config's table: {missing:?}"
    );
}

/// `cell` says `max_burst` (redis-cell's name: admitted at once is one
/// more); the older `burst` reads the same, with a warning; both, or
/// neither, is an error naming the field.
#[test]
fn a_cell_says_max_burst_and_reads_the_old_burst_with_a_warning() {
    let policy = |text: &str| {
        let rules = format!(
            "rules: [{{ name: r, policy: {{ cell: {{ {text}, count: 3, period: 1h }} }} }}]"
        );
        LayerConfig::parse("l.yaml", &rules)
    };
    let new = policy("max_burst: 2").unwrap();
    let old = policy("burst: 2").unwrap();
    assert_eq!(new.rules[0].policy, old.rules[0].policy);
    assert_eq!(
        new.rules[0].policy.0,
        Policy::cell(2, 3, Duration::from_secs(3600)).unwrap()
    );
    let both = policy("max_burst: 2, burst: 2").unwrap_err();
    assert!(both.message.contains("max_burst` alone"), "{both}");
    let neither = LayerConfig::parse(
        "l.yaml",
        "rules: [{ name: r, policy: { cell: { count: 3, period: 1h } } }]",
    )
    .unwrap_err();
    assert!(neither.message.contains("max_burst"), "{neither}");
}
