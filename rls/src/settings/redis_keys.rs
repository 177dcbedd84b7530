//! Where upstream-format counters live on Redis (`RLS_REDIS_KEYS`), and
//! upstream's `EXPIRATION_JITTER_MAX_SECONDS`.

use super::{Env, SettingsError};

/// `RLS_REDIS_KEYS`: the Redis keys and commands of upstream-format limits
/// (fixed windows without the extension), outside all-or-nothing mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisKeys {
    /// `upstream` (the default): upstream's keys (`CACHE_KEY_PREFIX +
    /// domain_key_value_..._windowstart`), `INCRBY` then `EXPIRE`, so that
    /// envoyproxy/ratelimit pods on the same Redis share every counter.
    Upstream,
    /// `crate`: the crate's keys and fixed-window script, as this server
    /// used before (`throttle:{tag}:f:=` before upstream's key): no
    /// counter shared with upstream.
    Crate,
}

pub(super) fn redis_keys(env: &Env<'_>) -> Result<RedisKeys, SettingsError> {
    match env.string("RLS_REDIS_KEYS", "upstream").as_str() {
        "upstream" => Ok(RedisKeys::Upstream),
        "crate" => Ok(RedisKeys::Crate),
        other => Err(SettingsError::invalid(
            "RLS_REDIS_KEYS",
            other,
            "expected upstream or crate",
        )),
    }
}

/// Go's `int64` as envconfig reads it; upstream adds no jitter unless the
/// value is above 0, so a negative one is 0 here.
pub(super) fn jitter(env: &Env<'_>) -> Result<u64, SettingsError> {
    const NAME: &str = "EXPIRATION_JITTER_MAX_SECONDS";
    let Some(raw) = (env.0)(NAME) else {
        return Ok(300);
    };
    let seconds = raw
        .trim()
        .parse::<i64>()
        .map_err(|_| SettingsError::invalid(NAME, &raw, "expected a whole number of seconds"))?;
    // Upstream adds no jitter below 1; Redis refuses an `EXPIRE` whose
    // time in ms overflows, from about 9.2e15 s on: refused here, before
    // every counting request fails.
    match u64::try_from(seconds).unwrap_or(0) {
        s if s > MAX_JITTER_SECONDS => Err(SettingsError::invalid(
            NAME,
            &raw,
            "at most 10^15 seconds (Redis refuses longer expiries)",
        )),
        s => Ok(s),
    }
}

/// The longest jitter: with a year's window, far below the expiry Redis
/// refuses (about 9.2e15 s).
const MAX_JITTER_SECONDS: u64 = 1_000_000_000_000_000;
