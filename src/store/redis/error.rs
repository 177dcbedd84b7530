//! redis-rs errors as typed [`StoreError`]s, for the layer's fail mode.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::{Outage, StoreError};

/// A server wanting credentials the URL does not carry.
pub(crate) const AUTH_REQUIRED: &str = "this Redis server requires a password or an ACL user: \
    put them in the URL (redis://user:password@host/)";

/// A server refusing the credentials of the URL.
pub(crate) const AUTH_REFUSED: &str = "the Redis server refused the credentials in the URL \
    (wrong password, or an unknown or disabled ACL user): check the user and password in \
    redis://user:password@host/";

/// Where the minimal ACL rule is documented, appended to ACL errors.
pub(crate) const ACL_DOCS: &str =
    "the minimal rule is in the docs of RedisStoreBuilder::connect (\"Access control\")";

/// Maps a redis-rs error; `timeout` is the store's configured timeout.
///
/// Outages (the server answers that it cannot decide now: [`outage`]) are
/// [`StoreError::Unavailable`]; what this crate does not recognise is a
/// defect ([`StoreError::Script`], [`StoreError::Protocol`]), logged by
/// [`surfaced`] at the store's boundary.
pub(crate) fn map(e: RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(timeout);
    }
    if let Some(fix) = setup(&e) {
        return StoreError::Config(fix);
    }
    // A refund or release that found foreign data at its key (deleted by
    // the script): the same typed, logged error as a check's.
    if e.code() == Some("FOREIGN") {
        return failed(format!("FOREIGN {}", e.detail().unwrap_or("")));
    }
    if let Some(why) = outage(&e) {
        return StoreError::Unavailable(why);
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Client
        | ErrorKind::RESP3NotSupported => StoreError::Connection(Box::new(e)),
        ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(
            ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::CrossSlot,
        ) => StoreError::Cluster(Box::new(e)),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Protocol(e.to_string()),
        _ => StoreError::Script(Box::new(e)),
    }
}

/// The outage a server's error reply reports, if it is one: its code
/// (`OOM`, `BUSY`, `LOADING`, `READONLY`, `MASTERDOWN`, `CLUSTERDOWN`,
/// `TRYAGAIN`), whether the server refused the command itself or a command
/// a script ran and did not catch (Redis 7 passes the code on; Redis 6 wraps
/// it in `ERR Error running script`). `NOSCRIPT` is one too: every call
/// site loads the script again and retries once before giving up, so a
/// `NOSCRIPT` that reaches here survived a reload.
pub(crate) fn outage(e: &RedisError) -> Option<Outage> {
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
        return Some(Outage::ScriptsLost);
    }
    let code = e.code()?;
    outage_of_code(code).or_else(|| {
        let detail = e.detail()?;
        (code == "ERR").then(|| wrapped(detail)).flatten()
    })
}

/// The outage an error message from a script reports, if it is one: the
/// error of a `redis.call` the script caught and returned as a check's own
/// failure ("OOM command not allowed when used memory > 'maxmemory'.",
/// "READONLY You can't write against a read only replica.").
pub(crate) fn outage_in(message: &str) -> Option<Outage> {
    let code = message.split_ascii_whitespace().next()?;
    outage_of_code(code.trim_start_matches('-')).or_else(|| wrapped(message))
}

fn outage_of_code(code: &str) -> Option<Outage> {
    Some(match code {
        "OOM" => Outage::OutOfMemory,
        "BUSY" => Outage::Busy,
        "LOADING" => Outage::Loading,
        "READONLY" => Outage::ReadOnly,
        "MASTERDOWN" => Outage::MasterDown,
        "CLUSTERDOWN" => Outage::ClusterDown,
        "TRYAGAIN" => Outage::TryAgain,
        _ => return None,
    })
}

/// Redis 6 and older end a script whose `redis.call` failed with
/// "ERR Error running script (call to f_<sha>): @user_script:1:
/// @user_script: 1: OOM command not allowed ...": the code is a word of
/// the message.
fn wrapped(message: &str) -> Option<Outage> {
    if !message.contains("Error running script") {
        return None;
    }
    message
        .split(|c: char| c.is_ascii_whitespace() || c == ':')
        .find_map(|w| outage_of_code(w.trim_start_matches('-')))
}

/// The most distinct defects logged; past it one more line says so and
/// the rest are not logged (the fail mode or the caller still sees each).
const MAX_DEFECTS_LOGGED: usize = 64;

/// The causes of the defects logged so far.
static DEFECTS_LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Logs `r`'s error at error level if it is a defect (a reply this crate
/// does not understand: [`StoreError::Script`], [`StoreError::Protocol`]),
/// once per distinct cause, not per call; returns `r`. Outages and
/// misconfigurations are not logged here: the fallback store or the
/// layer's fail mode answers them (and the layer logs each failed check).
pub(crate) fn surfaced<T>(r: Result<T, StoreError>) -> Result<T, StoreError> {
    if let Err(e @ (StoreError::Script(_) | StoreError::Protocol(_))) = &r {
        let text = e.to_string();
        if let Some(last) = first_report(cause(&text)) {
            tracing::error!(target: "tower_throttle", error = %text,
                "rate-limit store replied something this crate does not understand (a defect, \
                 not an outage, so no fallback store answers it: please report it); such calls \
                 fail (a layer answers them by its fail mode), and this cause is logged once");
            if last {
                tracing::error!(target: "tower_throttle", limit = MAX_DEFECTS_LOGGED,
                    "distinct rate-limit store defects reached the logging limit: further \
                     causes are not logged");
            }
        }
    }
    r
}

/// Whether a defect of `cause` is to be logged: `Some` the first time (and
/// `Some(true)` for the last cause the limit lets through), `None` after.
fn first_report(cause: String) -> Option<bool> {
    let mut seen = DEFECTS_LOGGED
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let seen = seen.get_or_insert_with(HashSet::new);
    if seen.len() >= MAX_DEFECTS_LOGGED || !seen.insert(cause) {
        return None;
    }
    Some(seen.len() == MAX_DEFECTS_LOGGED)
}

/// What tells two defects apart: the message with each run of digits made
/// one `#` (a count, a time or a line number does not make a new cause),
/// at most 200 bytes of it.
fn cause(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(200));
    let mut in_number = false;
    for c in text.chars() {
        if out.len() >= 200 {
            break;
        }
        if c.is_ascii_digit() {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// The fix for an error caused by the server's setup (credentials, ACL),
/// if `e` is one. Built from the error's code and the command named by the
/// server, never from the URL, so it holds no password.
pub(crate) fn setup(e: &RedisError) -> Option<String> {
    let code = e.code().unwrap_or("");
    let text = e.to_string();
    // A server with `requirepass` answers NOAUTH, or, to a large argument
    // sent before authenticating (a script), a protocol error.
    if code == "NOAUTH"
        || text.contains("NOAUTH")
        || text.contains("unauthenticated bulk length")
        || text.contains("unauthenticated multibulk length")
    {
        return Some(AUTH_REQUIRED.to_owned());
    }
    if code == "WRONGPASS"
        || text.contains("WRONGPASS")
        || e.kind() == ErrorKind::AuthenticationFailed
    {
        return Some(AUTH_REFUSED.to_owned());
    }
    // A script refused a command or key after connect (the ACL changed):
    // Redis 6 and 7.0 say "The user executing the script can't ...", 7.2
    // and later "ACL failure in script".
    if text.contains("user executing the script") || text.contains("ACL failure in script") {
        return Some(format!(
            "the Redis ACL user may not run a command or access a key this store's scripts \
             need (the server said: {}); {ACL_DOCS}",
            e.detail().unwrap_or("permission denied")
        ));
    }
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        let detail = e.detail().unwrap_or("");
        return Some(match quoted(detail) {
            Some(cmd) if detail.contains("command") => acl_commands(&[cmd.to_owned()]),
            _ => format!(
                "the Redis ACL user may not access a key of this store: give it the store's \
                 key pattern (`~<prefix>:*`); {ACL_DOCS}"
            ),
        });
    }
    None
}

/// The fix for an ACL user missing `commands`.
pub(crate) fn acl_commands(commands: &[String]) -> String {
    let names: Vec<String> = commands.iter().map(|c| format!("`{c}`")).collect();
    let rules: Vec<String> = commands.iter().map(|c| format!("+{c}")).collect();
    format!(
        "the Redis ACL user may not run {}: add `{}` to its rule (ACL SETUSER <user> {}); {ACL_DOCS}",
        names.join(", "),
        rules.join(" "),
        rules.join(" "),
    )
}

/// The first `'...'`-quoted word of a server message (Redis names the
/// refused command that way: "no permissions to run the 'time' command").
fn quoted(detail: &str) -> Option<&str> {
    let start = detail.find('\'')? + 1;
    let len = detail[start..].find('\'')?;
    Some(&detail[start..start + len]).filter(|c| !c.is_empty() && !c.contains(' '))
}

/// Runs `fut` under the store timeout, mapping its error.
pub(crate) async fn timed<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map_err(|e| map(e, timeout)),
        Err(_) => Err(StoreError::Timeout(timeout)),
    }
}

/// A check the script ran but that failed there (for example a key of
/// another type under one of its names).
#[derive(Debug)]
pub(crate) struct CheckFailed(pub String);

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CheckFailed {}

/// The error of a check that failed alone. Foreign data at a key (a value of
/// another type, or a string that is no state of this crate) was deleted by
/// the script, so the key starts fresh on the next check: the error names
/// the key, and is logged here because a fail-open layer would otherwise
/// swallow it. A command the script ran that the server refused for an
/// outage (`OOM`, `READONLY`, ...: see [`outage_in`]) is
/// [`StoreError::Unavailable`]; anything else is a defect.
pub(crate) fn failed(msg: String) -> StoreError {
    match msg.strip_prefix("FOREIGN ") {
        Some(rest) => {
            let (what, key) = rest.split_once(" at ").unwrap_or((rest, ""));
            let err = StoreError::ForeignData {
                key: key.to_owned(),
                found: what.to_owned(),
            };
            tracing::warn!(%err, "rate-limit key repaired");
            err
        }
        None => match outage_in(&msg) {
            Some(why) => StoreError::Unavailable(why),
            None => StoreError::Script(Box::new(CheckFailed(msg))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error redis-rs makes of the server's reply `line` (without `-`).
    fn reply(line: &str) -> RedisError {
        redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    fn mapped(line: &str) -> StoreError {
        map(reply(line), Duration::from_millis(5))
    }

    /// The replies of a server that cannot decide now, as Redis 7.0 words
    /// them (checked against redis-server 7.0.15), plus `CLUSTERDOWN` and
    /// `TRYAGAIN`, which only a cluster gives.
    #[test]
    fn outage_replies_are_unavailable() {
        let cases = [
            (
                "OOM command not allowed when used memory > 'maxmemory'. script: \
                 e984b76882c219d9da245b525c16ffbd79bf8b25, on @user_script:1.",
                Outage::OutOfMemory,
            ),
            (
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or \
                 SHUTDOWN NOSAVE.",
                Outage::Busy,
            ),
            (
                "LOADING Redis is loading the dataset in memory",
                Outage::Loading,
            ),
            (
                "READONLY You can't write against a read only replica. script: \
                 756928dd1246249109cfe8475bfa267e967ea948, on @user_script:1.",
                Outage::ReadOnly,
            ),
            (
                "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
                Outage::MasterDown,
            ),
            ("CLUSTERDOWN The cluster is down", Outage::ClusterDown),
            ("CLUSTERDOWN Hash slot not served", Outage::ClusterDown),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                Outage::TryAgain,
            ),
            // Every call site reloads and retries once before this.
            (
                "NOSCRIPT No matching script. Please use EVAL.",
                Outage::ScriptsLost,
            ),
            // Redis 6 wraps the error of a script's redis.call.
            (
                "ERR Error running script (call to f_e984b76882c219d9da245b525c16ffbd79bf8b25): \
                 @user_script:1: @user_script: 1: -OOM command not allowed when used memory > \
                 'maxmemory'.",
                Outage::OutOfMemory,
            ),
            (
                "ERR Error running script (call to f_756928dd1246249109cfe8475bfa267e967ea948): \
                 @user_script:1: @user_script: 1: READONLY You can't write against a read only \
                 replica.",
                Outage::ReadOnly,
            ),
        ];
        for (line, why) in cases {
            let e = mapped(line);
            assert!(
                matches!(e, StoreError::Unavailable(w) if w == why) && e.is_unavailable(),
                "{line}: {e:?}"
            );
            // What a response or a log line shows names the state only.
            assert_eq!(
                e.to_string(),
                format!("rate-limit store cannot decide now: {why}")
            );
        }
    }

    /// The same codes in the message of a check a script failed on its own
    /// (a `redis.call` error the script caught).
    #[test]
    fn outage_messages_of_caught_script_errors() {
        let cases = [
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                Some(Outage::OutOfMemory),
            ),
            (
                "READONLY You can't write against a read only replica.",
                Some(Outage::ReadOnly),
            ),
            ("-BUSY Redis is busy running a script.", Some(Outage::Busy)),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                Some(Outage::TryAgain),
            ),
            ("ERR value is not an integer or out of range", None),
            ("user_script:12: attempt to compare nil with number", None),
            // A word of a message is no code outside a wrapped script error.
            ("ERR unknown command 'OOM'", None),
            ("", None),
        ];
        for (message, why) in cases {
            assert_eq!(outage_in(message), why, "{message}");
        }
        assert!(matches!(
            super::failed("OOM command not allowed".into()),
            StoreError::Unavailable(Outage::OutOfMemory)
        ));
    }

    /// What the crate does not understand is a defect, not an outage.
    #[test]
    fn defects_are_not_unavailable() {
        for line in [
            "ERR user_script:12: attempt to compare nil with number script: \
             e984b76882c219d9da245b525c16ffbd79bf8b25, on @user_script:12.",
            "ERR unknown command 'EVALSHA', with args beginning with:",
            "WEIRD a code nobody knows",
            "BUSYKEY Target key name already exists.",
            "EXECABORT Transaction discarded because of previous errors.",
        ] {
            let e = mapped(line);
            assert!(
                matches!(e, StoreError::Script(_)) && !e.is_unavailable(),
                "{line}: {e:?}"
            );
        }
        let odd = redis::RedisError::from((ErrorKind::UnexpectedReturnType, "odd reply"));
        assert!(matches!(map(odd, Duration::ZERO), StoreError::Protocol(_)));
        // Connections, redirections and timeouts stay what they were.
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(map(io, Duration::ZERO), StoreError::Connection(_)));
        assert!(matches!(
            mapped("MOVED 3999 127.0.0.1:6381"),
            StoreError::Cluster(_)
        ));
    }

    /// One log line per cause (the integration tests read the lines: see
    /// `tests/redis_outages.rs`).
    #[test]
    fn defects_are_reported_once_per_cause() {
        let causes: Vec<String> = [1, 22, 333, 1]
            .iter()
            .map(|n| cause(&format!("unit-test defect: {n} items left")))
            .collect();
        assert!(causes.iter().all(|c| c == "unit-test defect: # items left"));
        let reported: Vec<_> = causes.into_iter().map(first_report).collect();
        assert_eq!(reported, [Some(false), None, None, None]);
        assert_eq!(
            first_report(cause("unit-test defect: another")),
            Some(false)
        );
    }
}
