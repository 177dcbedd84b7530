//! redis-rs errors as typed [`StoreError`]s, for the layer's fail mode.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::StoreError;

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
        return super::reply::failed(format!("FOREIGN {}", e.detail().unwrap_or("")));
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Client
        | ErrorKind::RESP3NotSupported
        | ErrorKind::Server(ServerErrorKind::BusyLoading) => StoreError::Connection(Box::new(e)),
        ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => StoreError::Cluster(Box::new(e)),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Protocol(e.to_string()),
        _ => StoreError::Script(Box::new(e)),
    }
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
            "the Redis ACL user may not run a command or access a key this store's scripts              need (the server said: {}); {ACL_DOCS}",
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
