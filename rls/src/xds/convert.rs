//! A snapshot's resources into a [`Table`], as upstream does it
//! (`src/config/config_xds.go`, then the file loader): each
//! `RateLimitConfig` becomes the YAML a file would hold and is loaded by the
//! same code as files, named by the resource's `name`, so the errors, the
//! strictness and `MERGE_DOMAIN_CONFIG` are those of files.

use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use serde_json::{json, Map, Value};

use crate::config::{self, ConfigError, LoadOptions, Table};

/// The resource type subscribed to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Go's `anypb.UnmarshalTo`: the type must be `RateLimitConfig` (the part
/// of the URL after its last `/`), and the bytes must decode.
pub fn decode(any: &Any) -> Result<RateLimitConfig, String> {
    let want = "ratelimit.config.ratelimit.v3.RateLimitConfig";
    let got = any.type_url.rsplit('/').next().unwrap_or_default();
    if got != want {
        return Err(format!(
            "mismatched message type: got {got:?}, want {want:?}"
        ));
    }
    RateLimitConfig::decode(any.value.as_slice())
        .map_err(|e| format!("cannot decode a resource as {want}: {e}"))
}

/// Every resource loaded into one table, in the snapshot's order.
pub fn load(configs: &[RateLimitConfig], options: LoadOptions) -> Result<Table, ConfigError> {
    let mut table = Table::default();
    for c in configs {
        let text = to_yaml(c);
        config::add_file(&mut table, &c.name, &text, options).map_err(|e| ConfigError {
            // Lines of the generated YAML would mean nothing to the reader.
            line: None,
            ..e
        })?;
    }
    Ok(table)
}

/// Upstream's `ConfigXdsProtoToYaml`, as YAML text.
pub fn to_yaml(c: &RateLimitConfig) -> String {
    let root = json!({
        "domain": c.domain,
        "descriptors": descriptors(&c.descriptors),
    });
    // Serializing a JSON value cannot fail.
    yaml_serde::to_string(&root).unwrap_or_default()
}

fn descriptors(list: &[RateLimitDescriptor]) -> Value {
    Value::Array(list.iter().map(descriptor).collect())
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        m.insert("value".into(), d.value.clone().into());
    }
    if let Some(rl) = &d.rate_limit {
        m.insert("rate_limit".into(), policy(rl));
    }
    if !d.descriptors.is_empty() {
        m.insert("descriptors".into(), descriptors(&d.descriptors));
    }
    for (name, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            m.insert(name.into(), true.into());
        }
    }
    // `metadata` is carried by upstream and read by neither loader.
    Value::Object(m)
}

fn policy(p: &RateLimitPolicy) -> Value {
    // Go's enum `String()`: the name, or the number when not one.
    let unit = RateLimitUnit::try_from(p.unit)
        .map_or_else(|_| p.unit.to_string(), |u| u.as_str_name().to_owned());
    let mut m = Map::new();
    m.insert("requests_per_unit".into(), p.requests_per_unit.into());
    m.insert("unit".into(), unit.into());
    if p.unlimited {
        m.insert("unlimited".into(), true.into());
    }
    if !p.name.is_empty() {
        m.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        let replaces = p
            .replaces
            .iter()
            .map(|r| json!({ "name": r.name }))
            .collect();
        m.insert("replaces".into(), Value::Array(replaces));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn limit(key: &str, value: &str, n: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn conf(name: &str, domain: &str, d: Vec<RateLimitDescriptor>) -> RateLimitConfig {
        RateLimitConfig {
            name: name.into(),
            domain: domain.into(),
            descriptors: d,
        }
    }

    #[test]
    fn upstreams_provider_test_dumps_the_same() {
        let t = load(
            &[conf(
                "foo",
                "foo",
                vec![limit("k1", "v1", 3, RateLimitUnit::Minute)],
            )],
            LoadOptions::default(),
        )
        .unwrap();
        assert_eq!(
            t.dump(),
            "foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false\n"
        );
    }

    #[test]
    fn nested_replaces_modes_and_strings_that_look_like_yaml() {
        let mut outer = limit("yes", "on", 1, RateLimitUnit::Week);
        outer.shadow_mode = true;
        outer.descriptors = vec![limit("k", "1.5", 2, RateLimitUnit::Second)];
        if let Some(rl) = &mut outer.rate_limit {
            rl.name = "a".into();
        }
        let mut other = limit("x", "", 9, RateLimitUnit::Hour);
        if let Some(rl) = &mut other.rate_limit {
            rl.replaces = vec![RateLimitReplace { name: "a".into() }];
        }
        let t = load(
            &[conf("n", "d", vec![outer, other])],
            LoadOptions::default(),
        )
        .unwrap();
        let dump = t.dump();
        assert!(
            dump.contains("d.yes_on: unit=WEEK requests_per_unit=1, shadow_mode: true"),
            "{dump}"
        );
        assert!(
            dump.contains("d.yes_on.k_1.5: unit=SECOND requests_per_unit=2"),
            "{dump}"
        );
        assert!(
            dump.contains("d.x: unit=HOUR requests_per_unit=9"),
            "{dump}"
        );
    }

    #[test]
    fn errors_are_the_files_errors_named_by_the_resource() {
        let unknown = limit("k", "", 1, RateLimitUnit::Unknown);
        let e = load(&[conf("res", "d", vec![unknown])], LoadOptions::default()).unwrap_err();
        assert_eq!(e.file, "res");
        assert_eq!(e.line, None);
        assert!(
            e.to_string().contains("invalid rate limit unit 'UNKNOWN'"),
            "{e}"
        );
        let mut unlimited = limit("k", "", 0, RateLimitUnit::Unknown);
        if let Some(rl) = &mut unlimited.rate_limit {
            rl.unlimited = true;
        }
        load(&[conf("res", "d", vec![unlimited])], LoadOptions::default()).unwrap();
        let dup = vec![
            limit("k", "v", 1, RateLimitUnit::Second),
            limit("k", "v", 2, RateLimitUnit::Second),
        ];
        let e = load(&[conf("dup", "d", dup)], LoadOptions::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("duplicate descriptor composite key 'k_v'"),
            "{e}"
        );
        let two = [
            conf("a", "d", vec![limit("k", "", 1, RateLimitUnit::Second)]),
            conf("b", "d", vec![limit("j", "", 1, RateLimitUnit::Second)]),
        ];
        let e = load(&two, LoadOptions::default()).unwrap_err();
        assert_eq!(e.to_string(), "b: duplicate domain 'd' in config file");
        let merged = LoadOptions {
            merge_domains: true,
            ..Default::default()
        };
        assert_eq!(load(&two, merged).unwrap().summary().1, 2);
        let e = load(&[conf("e", "", vec![])], LoadOptions::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("config file cannot have empty domain"),
            "{e}"
        );
        let odd = RateLimitDescriptor {
            key: "k".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: 42,
                requests_per_unit: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = load(&[conf("o", "d", vec![odd])], LoadOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains("invalid rate limit unit '42'"),
            "{e}"
        );
    }

    #[test]
    fn resources_of_another_type_or_bad_bytes_are_refused() {
        let ok = conf("a", "d", vec![]);
        let any = |url: &str, value: Vec<u8>| Any {
            type_url: url.into(),
            value,
        };
        assert_eq!(decode(&any(TYPE_URL, ok.encode_to_vec())).unwrap(), ok);
        let e = decode(&any("type.googleapis.com/google.protobuf.Empty", vec![])).unwrap_err();
        assert!(e.starts_with("mismatched message type"), "{e}");
        assert!(decode(&any(TYPE_URL, vec![0xff, 0xff, 0xff])).is_err());
    }
}
