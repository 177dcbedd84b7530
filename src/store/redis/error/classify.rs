//! What a server's error reply means: an outage (the server cannot decide
//! now), or a setup to fix (credentials, ACL). Read from the reply's code
//! and words, never from the URL.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::Outage;

/// A server wanting credentials the URL does not carry.
pub(crate) const AUTH_REQUIRED: &str = "this Redis server requires a password or an ACL user: \
    put them in the URL (redis://user:password@host/)";

/// A server refusing the credentials of the URL.
pub(crate) const AUTH_REFUSED: &str = "the Redis server refused the credentials in the URL \
    (wrong password, or an unknown or disabled ACL user): check the user and password in \
    redis://user:password@host/";

/// A server in protected mode refusing a connection from another host.
pub(crate) const PROTECTED_MODE: &str = "the Redis server runs in protected mode and refuses \
    connections from other hosts: give it a password (requirepass, or an ACL user) and put it \
    in the URL (redis://user:password@host/)";

/// Where the minimal ACL rule is documented, appended to ACL errors.
pub(crate) const ACL_DOCS: &str =
    "the minimal rule is in the docs of RedisStoreBuilder::connect (\"Access control\")";

/// The outage a server's error reply reports, if it is one: its code
/// (`OOM`, `BUSY`, `LOADING`, `READONLY`, `MASTERDOWN`, `CLUSTERDOWN`,
/// `TRYAGAIN`, `MISCONF`, `NOREPLICAS`), whether the server refused the
/// command itself or a command a script ran and did not catch (Redis 7
/// passes the code on; Redis 6 wraps it in `ERR Error running script`).
/// `NOSCRIPT` is one too: every call site loads the script again and
/// retries once before giving up, so a `NOSCRIPT` that reaches here
/// survived a reload. So is a connection refused for `maxclients`, which
/// has no code of its own (`ERR max number of clients reached`, on a
/// cluster `ERR max number of clients + cluster connections reached`).
pub(crate) fn outage(e: &RedisError) -> Option<Outage> {
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
        return Some(Outage::ScriptsLost);
    }
    if e.to_string().contains(MAX_CLIENTS) {
        return Some(Outage::TooManyClients);
    }
    let code = e.code()?;
    outage_of_code(code).or_else(|| {
        let detail = e.detail()?;
        (code == "ERR").then(|| wrapped(detail)).flatten()
    })
}

/// What a server at its `maxclients` writes to a new connection before
/// closing it (Redis and Valkey alike). Looked for in the whole error's
/// text: redis-rs may report it inside the error of the connection setup.
const MAX_CLIENTS: &str = "max number of clients";

/// The outage an error message from a script reports, if it is one: the
/// error of a `redis.call` the script caught and returned as a check's own
/// failure ("OOM command not allowed when used memory > 'maxmemory'.",
/// "READONLY You can't write against a read only replica.").
pub(crate) fn outage_in(message: &str) -> Option<Outage> {
    let code = message.split_ascii_whitespace().next()?;
    outage_of_code(code.trim_start_matches('-')).or_else(|| wrapped(message))
}

/// The outage a reply's code names. The credential codes are not among
/// them here: `credentials.rs` classifies those (and logs their fix).
fn outage_of_code(code: &str) -> Option<Outage> {
    Outage::from_redis_code(code)
        .filter(|o| !matches!(o, Outage::AuthRequired | Outage::AuthRefused))
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
    // Protected mode (no password, not bound to loopback only) answers
    // other hosts `-DENIED` and closes the connection.
    if code == "DENIED" || (text.contains("DENIED") && text.contains("protected mode")) {
        return Some(PROTECTED_MODE.to_owned());
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
