//! Exactness across replicas: several instances on one Redis, one hot
//! key, every call at once; and the migration from upstream pods to
//! throttle-rls pods on one Redis.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::load::{connect, drive, user, Client, MakeRequest, Sample, IN_FLIGHT};
use crate::procs::{Bins, Kind, Limit, Redis, Server, Store};

/// The hot key's limit, per minute.
const LIMIT: u32 = 500;
/// Fresh keys tried per server.
const TRIALS: usize = 3;
/// Calls per trial, as a multiple of the limit.
const OFFERED: u64 = 4;

/// Waits, if need be, until a minute has begun: the calls of one trial
/// then all fall in one of upstream's epoch-aligned windows (they take a
/// few seconds; 40 s are left).
pub async fn align_to_window() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let into = now % 60;
    if !(1..20).contains(&into) {
        let wait = (61 - into) % 60 + 1;
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
}

async fn clients(servers: &[Server]) -> Result<Vec<Client>, String> {
    let mut all = Vec::new();
    for s in servers {
        all.push(connect(s.addr).await?);
    }
    Ok(all)
}

async fn start(
    bins: &Bins,
    kinds: &[Kind],
    redis: &Redis,
    limit: &Limit,
    env: &[(&str, &str)],
) -> Result<Vec<Server>, String> {
    let mut servers = Vec::new();
    for &kind in kinds {
        servers.push(Server::start(bins, kind, Store::Redis(redis), limit, env).await?);
    }
    Ok(servers)
}

/// `count` calls on `key` spread over `clients` round robin, `in_flight` at once.
async fn burst(clients: &[Client], in_flight: u64, key: String, count: u64) -> Sample {
    let make: MakeRequest = Arc::new(move |_| user(key.clone()));
    drive(clients, in_flight, 30.0, count, &make).await
}

fn cell(s: &Sample) -> String {
    let errors = if s.errors > 0 {
        format!(" ({} failed)", s.errors)
    } else {
        String::new()
    };
    format!("{}{errors}", s.ok)
}

/// 4 instances of each server on one Redis, one key: admitted ÷ limit.
pub async fn exactness(bins: &Bins) -> Result<(), String> {
    let limit = Limit {
        per: LIMIT,
        unit: "minute",
    };
    let redis = Redis::start()?;
    println!(
        "4 instances per server on one Redis; key limited to {LIMIT}/min; {} calls per trial, \
         {IN_FLIGHT} in flight, round robin over the instances; load average {}",
        OFFERED * LIMIT as u64,
        crate::loadavg()
    );
    println!("| server | admitted per trial | admitted ÷ limit, highest |\n|---|---|---|");
    // throttle-rls on upstream's keys (the default) and on the crate's.
    let crate_keys: &[(&str, &str)] = &[("RLS_REDIS_KEYS", "crate")];
    let runs = [
        (Kind::Ours, "", &[][..]),
        (Kind::Ours, ", RLS_REDIS_KEYS=crate", crate_keys),
        (Kind::Upstream, "", &[][..]),
        (Kind::Limitador, "", &[][..]),
    ];
    for (kind, label, env) in runs {
        if bins.get(kind).is_none() {
            continue;
        }
        let servers = start(bins, &[kind; 4], &redis, &limit, env).await?;
        let clients = clients(&servers).await?;
        let mut cells = Vec::new();
        let mut worst = 0.0f64;
        for trial in 0..TRIALS {
            align_to_window().await;
            let key = format!("{kind:?}{}-{trial}-{}", env.len(), std::process::id());
            let s = burst(&clients, IN_FLIGHT, key, OFFERED * LIMIT as u64).await;
            worst = worst.max(s.ok as f64 / LIMIT as f64);
            cells.push(cell(&s));
        }
        println!(
            "| {}{label} | {} | {worst:.3} |",
            kind.name(),
            cells.join(", ")
        );
    }
    Ok(())
}

/// Every key in `redis` with its value and TTL.
async fn keys(redis: &Redis) -> Result<Vec<(String, String, i64)>, String> {
    let e = |e: redis::RedisError| e.to_string();
    let client = redis::Client::open(format!("redis://{}/", redis.addr())).map_err(e)?;
    let mut con = client.get_multiplexed_async_connection().await.map_err(e)?;
    let mut names: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut con)
        .await
        .map_err(e)?;
    names.sort();
    let mut all = Vec::new();
    for name in names {
        let value: String = redis::cmd("GET")
            .arg(&name)
            .query_async(&mut con)
            .await
            .map_err(e)?;
        let ttl: i64 = redis::cmd("TTL")
            .arg(&name)
            .query_async(&mut con)
            .await
            .map_err(e)?;
        all.push((name, value, ttl));
    }
    Ok(all)
}

/// 2 upstream pods and 2 throttle-rls pods (default `RLS_REDIS_KEYS`,
/// upstream's keys) on one Redis, one key limited to 100 a minute: calls
/// alternate over the 4 pods one at a time, then all at once; then the
/// keys Redis holds.
pub async fn migrate(bins: &Bins) -> Result<(), String> {
    if bins.get(Kind::Upstream).is_none() {
        return Err("migrate needs RLS_PEER_UPSTREAM".into());
    }
    let per = 100u32;
    let limit = Limit {
        per,
        unit: "minute",
    };
    let redis = Redis::start()?;
    let pods = [Kind::Upstream, Kind::Ours, Kind::Upstream, Kind::Ours];
    let servers = start(bins, &pods, &redis, &limit, &[]).await?;
    let clients = clients(&servers).await?;
    let offered = 3 * per as u64;
    align_to_window().await;
    let pid = std::process::id();
    let one = burst(&clients, 1, format!("alternate-{pid}"), offered).await;
    let all = burst(&clients, IN_FLIGHT, format!("concurrent-{pid}"), offered).await;
    println!("pods: upstream, throttle-rls, upstream, throttle-rls on one Redis; limit {per}/min");
    println!("| calls | offered | admitted | admitted ÷ limit |\n|---|---|---|---|");
    for (what, s) in [
        ("alternating, one at a time", one),
        ("round robin, 64 at once", all),
    ] {
        let ratio = s.ok as f64 / per as f64;
        println!("| {what} | {offered} | {} | {ratio:.3} |", cell(&s));
    }
    println!("Redis keys (name, value, TTL s):");
    for (name, value, ttl) in keys(&redis).await? {
        println!("  {name} = {value}, TTL {ttl}");
    }
    Ok(())
}
