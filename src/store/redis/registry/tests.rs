//! The registry's table, checked whole.

use super::{lua, ScriptAlgorithm, ScriptId, UniformBatch, SCRIPTS};

#[test]
fn every_script_is_in_the_table_and_every_code_maps_to_one() {
    // ALL holds each variant once, at its discriminant: load_scripts
    // (which loads ALL) loads every script.
    for (i, id) in ScriptId::ALL.iter().enumerate() {
        assert_eq!(*id as usize, i, "{id:?}");
    }
    assert_eq!(ScriptId::ALL.len(), ScriptId::Release as usize + 1);
    assert_eq!(SCRIPTS.len(), ScriptId::ALL.len());
    let mut hashes: Vec<&str> = SCRIPTS.iter().map(|s| s.get_hash()).collect();
    hashes.sort_unstable();
    hashes.dedup();
    assert_eq!(
        hashes.len(),
        ScriptId::ALL.len(),
        "two scripts are identical"
    );
    // Every algorithm has a check script that defines it, and its uniform
    // batches (whatever the unit of its duration) a script in the table.
    let mut wires = Vec::new();
    for algorithm in ScriptAlgorithm::ALL {
        let check = algorithm.check_script();
        assert!(ScriptId::ALL.contains(&check));
        for source in algorithm.sources() {
            assert!(check.sources().contains(source), "{algorithm:?}");
            assert!(ScriptId::Check.sources().contains(source), "{algorithm:?}");
            assert!(ScriptId::Refund.sources().contains(source), "{algorithm:?}");
        }
        for whole_us in [true, false] {
            match algorithm.uniform_batch(whole_us) {
                UniformBatch::Gcra(id) => assert!(ScriptId::ALL.contains(&id)),
                UniformBatch::SharedArguments(id) | UniformBatch::Fixed(id) => {
                    // The check script's arguments: its algorithm's sources.
                    assert!(ScriptId::ALL.contains(&id));
                    for source in algorithm.sources() {
                        assert!(id.sources().contains(source), "{algorithm:?}");
                    }
                }
                UniformBatch::PerCheck => {}
            }
        }
        wires.push(algorithm.wire());
    }
    wires.sort_unstable();
    wires.dedup();
    assert_eq!(
        wires.len(),
        ScriptAlgorithm::ALL.len(),
        "two algorithms share a wire code"
    );
    // Each Lua source is used by some script.
    let all: Vec<&str> = ScriptId::ALL.iter().flat_map(|id| id.sources()).collect();
    for source in [lua::GCRA_BATCH, lua::FIXED_BATCH, lua::RELEASE, lua::CHECK] {
        assert!(all.contains(&source));
    }
    assert!(ScriptId::Release.sources().contains(&lua::CONCURRENCY));
}

/// Globals of Lua 5.1 that 5.2+ engines dropped: a script naming one
/// fails there on first use (traefik/traefik#13824). `unpack` is
/// allowed only through common.lua's alias (`SCRIPTS` prepends common.lua
/// to every script).
#[test]
fn the_scripts_use_no_global_that_lua_5_4_dropped() {
    const DROPPED: [&str; 10] = [
        "setfenv",
        "getfenv",
        "loadstring",
        "module",
        "table.getn",
        "table.setn",
        "table.maxn",
        "math.mod",
        "math.pow",
        "string.gfind",
    ];
    const ALIAS: &str = "local unpack = table.unpack or unpack\n";
    assert_eq!(
        lua::COMMON.matches(ALIAS).count(),
        1,
        "common.lua defines the alias"
    );
    let mut found = Vec::new();
    for (n, source) in super::lua_sources().iter().enumerate() {
        let source = source.replacen(ALIAS, "", 1);
        for line in source.lines() {
            let code = line.split("--").next().unwrap_or("");
            let bytes = code.as_bytes();
            for name in DROPPED.iter().chain(&["unpack"]) {
                for (i, _) in code.match_indices(name) {
                    let before = i.checked_sub(1).map(|j| bytes[j]);
                    let after = bytes.get(i + name.len()).copied();
                    let word =
                        |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
                    // A global, not a field (`x.unpack`) or a longer name.
                    if word(before) || before == Some(b'.') || word(after) {
                        continue;
                    }
                    // `unpack(…)` through the alias is fine; a new
                    // 5.1-only name is not.
                    if *name == "unpack" && after == Some(b'(') {
                        continue;
                    }
                    found.push(format!("source {n}: {name} in `{}`", line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "Lua 5.1-only globals:\n{}",
        found.join("\n")
    );
    // The scan sees what it looks for.
    assert!(super::lua_sources().iter().any(|s| s.contains("unpack(")));
}
