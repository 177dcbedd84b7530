//! Concurrency permits of upgraded connections (WebSocket, `CONNECT`).
//!
//! The layer holds a request's permits until its response body ends. For a
//! `101 Switching Protocols` (or a `CONNECT` answered 2xx) that is the end of
//! the handshake: hyper drops the empty body, then hands the connection to
//! whoever awaits its `OnUpgrade`, out of the layer's reach (hyper offers no
//! way to wrap the upgraded I/O from a middleware). So the layer hands the
//! permits to the handler instead: an upgrade request carries an
//! [`UpgradePermit`] extension, and the handler moves what it
//! [claims](UpgradePermit::claim) into the task that serves the upgraded
//! connection; the permits are released when that task drops them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use http::{header, Method, Request, StatusCode};

use crate::body::Guard;

/// The concurrency permits of an upgrade request, for the handler to keep
/// until the upgraded connection closes.
///
/// The layer inserts it into the extensions of a request that asks for an
/// upgrade (`Connection: upgrade`, or `CONNECT`) and holds concurrency
/// permits. A handler that does not claim it gets the default: the permits
/// are released when the handshake response ends (logged once as a warning
/// when the upgrade succeeds).
///
/// ```
/// use axum::extract::ws::{WebSocket, WebSocketUpgrade};
/// use axum::response::Response;
/// use axum::Extension;
/// use tower_throttle::upgrade::UpgradePermit;
///
/// async fn ws(ws: WebSocketUpgrade, permit: Option<Extension<UpgradePermit>>) -> Response {
///     let held = permit.and_then(|Extension(p)| p.claim());
///     ws.on_upgrade(move |socket| async move {
///         serve(socket).await;
///         drop(held); // the connection is closed: release the permit
///     })
/// }
/// # async fn serve(_: WebSocket) {}
/// ```
#[derive(Clone, Debug)]
pub struct UpgradePermit {
    slot: Arc<Mutex<Option<Guard>>>,
}

/// Permits claimed from an [`UpgradePermit`]: released when dropped.
#[derive(Debug)]
#[must_use = "the permits are released when this is dropped"]
pub struct HeldPermit {
    _guard: Guard,
}

impl UpgradePermit {
    /// Takes the request's permits; `None` once claimed.
    pub fn claim(&self) -> Option<HeldPermit> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.take().map(|guard| HeldPermit { _guard: guard })
    }

    pub(crate) fn new(guard: Guard) -> Self {
        UpgradePermit {
            slot: Arc::new(Mutex::new(Some(guard))),
        }
    }

    /// The permits nobody claimed, to hold until the response body ends.
    /// `upgraded`: the response switched protocols (warned once: the
    /// permits then cover only the handshake).
    pub(crate) fn unclaimed(&self, upgraded: bool) -> Option<Guard> {
        let guard = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        static WARNED: AtomicBool = AtomicBool::new(false);
        if guard.is_some() && upgraded && !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "tower_throttle",
                "an upgraded connection's concurrency permits were not claimed: they are released \
                 at the end of the handshake; claim the request's UpgradePermit and hold it in the \
                 upgraded connection's task"
            );
        }
        guard
    }
}

/// Whether `req` asks to switch protocols (`Connection: upgrade`) or to
/// tunnel (`CONNECT`, including HTTP/2's extended CONNECT).
pub(crate) fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT
        || req.headers().get_all(header::CONNECTION).iter().any(|v| {
            v.as_bytes()
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
        })
}

/// Whether a response to an upgrade request (`connect`: it was a `CONNECT`)
/// handed the connection over.
pub(crate) fn upgraded(connect: bool, status: StatusCode) -> bool {
    status == StatusCode::SWITCHING_PROTOCOLS || (connect && status.is_success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_requests_are_recognised() {
        let req = |method: Method, connection: Option<&str>| {
            let mut b = Request::builder().method(method);
            if let Some(c) = connection {
                b = b.header(header::CONNECTION, c);
            }
            b.body(()).unwrap()
        };
        assert!(is_upgrade(&req(Method::GET, Some("Upgrade"))));
        assert!(is_upgrade(&req(Method::GET, Some("keep-alive, upgrade"))));
        assert!(is_upgrade(&req(Method::CONNECT, None)));
        assert!(!is_upgrade(&req(Method::GET, Some("keep-alive"))));
        assert!(!is_upgrade(&req(Method::GET, Some("upgraded"))));
        assert!(!is_upgrade(&req(Method::GET, None)));
        assert!(upgraded(false, StatusCode::SWITCHING_PROTOCOLS));
        assert!(upgraded(true, StatusCode::OK));
        assert!(!upgraded(false, StatusCode::OK));
        assert!(!upgraded(true, StatusCode::TOO_MANY_REQUESTS));
    }

    #[test]
    fn a_permit_is_claimed_once() {
        let permit = UpgradePermit::new(Guard::new(()));
        let other = permit.clone();
        assert!(permit.claim().is_some());
        assert!(other.claim().is_none());
        assert!(other.unclaimed(true).is_none());
        let unclaimed = UpgradePermit::new(Guard::new(()));
        assert!(unclaimed.unclaimed(false).is_some());
    }
}
