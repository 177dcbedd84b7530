//! Builder methods of [`ThrottleLayer`]: what it does with requests beyond
//! the check (skips, counting by outcome, lock-outs), denied requests
//! (the mode) and a failing store.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::ThrottleLayer;
use crate::key::RequestHead;
use crate::mode::{FailMode, Mode, OnMissingKey};
use crate::outcome::Outcome;
use crate::store::Store;

impl<St: Store> ThrottleLayer<St> {
    /// Lets requests for which `skip` returns true through without any
    /// check, key or store call (health checks, internal networks).
    ///
    /// Security: decide only from what the client cannot forge. The peer
    /// address of a direct connection, a path, or a header your own trusted
    /// proxy sets (and strips from client requests) are fine; a header the
    /// client sends is not — anyone who learns `X-Internal: 1` bypasses the
    /// limit. Skipped requests get no rate-limit headers; with
    /// [`request_info(true)`](crate::ThrottleLayer::request_info) their
    /// [`RateLimitInfo`](crate::RateLimitInfo) says they were skipped
    /// ([`NotLimited::Skipped`](crate::info::NotLimited::Skipped)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
    ///
    /// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_window(100, Duration::from_secs(60))?)
    ///     .skip_if(|req| req.uri().path() == "/healthz");
    /// # let _ = layer;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn skip_if(
        mut self,
        skip: impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settings.skip = Some(Arc::new(skip));
        self
    }

    /// Counts only requests whose response status satisfies `counts`: the
    /// others are refunded once their outcome is known. Failed logins
    /// only: `count_if(|s| s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN)`;
    /// refund server errors: `count_if(|s| !s.is_server_error())`. An inner
    /// service error counts as a 500.
    ///
    /// A gRPC call is always HTTP 200: its outcome is its `grpc-status`,
    /// which `counts` sees as its HTTP equivalent
    /// ([`GrpcCode::http_equivalent`](crate::grpc::GrpcCode::http_equivalent):
    /// `UNAUTHENTICATED` → 401, `PERMISSION_DENIED` → 403, `INTERNAL` →
    /// 500…), so the failed-login predicate above counts failed gRPC logins
    /// too. To tell gRPC codes apart that share an HTTP status, or gRPC
    /// from HTTP, use [`count_if_outcome`](Self::count_if_outcome), which
    /// also says when a gRPC call's outcome is known and what counts when
    /// it is not.
    ///
    /// Exact by reservation: every admitted request is charged up front
    /// and refunded if it does not count, so the limit is never exceeded.
    /// Sequential requests see exactly the limit (with 5 failed logins per
    /// 15 minutes, the 6th failed attempt in a row is refused; successful
    /// ones leave no trace). Concurrent ones can only be refused early:
    /// while requests are in flight their charges are held, so a request
    /// may be refused because of in-flight requests that later turn out
    /// not to count (it may retry after them; `Retry-After` reflects the
    /// held charges). A request abandoned before its response keeps its
    /// charge: hanging up does not dodge the count. Concurrency rules
    /// release their permits as usual and are not refunded.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::StatusCode;
    /// use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
    ///
    /// // 5 failed logins per 15 minutes per client address, HTTP 401 or gRPC UNAUTHENTICATED.
    /// let login = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(5, Duration::from_secs(900))?)
    ///     .count_if(|status| status == StatusCode::UNAUTHORIZED);
    /// # let _ = login;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn count_if(self, counts: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.count_if_outcome(move |outcome| counts(outcome.http_equivalent()))
    }

    /// Counts only requests whose [`Outcome`] satisfies `counts`: an HTTP
    /// response's status ([`Outcome::Http`]), or a gRPC call's
    /// `grpc-status` ([`Outcome::Grpc`]); the others are refunded once
    /// their outcome is known. Otherwise as [`count_if`](Self::count_if)
    /// (charged when admitted, never over the limit).
    ///
    /// When the outcome is known:
    ///
    /// - a response with `grpc-status` in its headers (a gRPC
    ///   *Trailers-Only* response, what tonic sends when a unary handler
    ///   fails), or without a gRPC `content-type`: when its head is back;
    /// - any other gRPC call (`content-type: application/grpc…`, a
    ///   streamed or successful one): when the trailers that end its body
    ///   go through, so a stream's charge is held until it ends;
    /// - an inner service error: at once, as `Outcome::Http(500)`.
    ///
    /// An outcome that is never known counts, like a request abandoned
    /// before its response: a gRPC body dropped before its trailers (the
    /// client cancelled), one that fails or ends without `grpc-status`,
    /// and a malformed `grpc-status` (not a decimal number) keep their
    /// charge without asking `counts`.
    ///
    /// gRPC-Web carries its trailers inside the body, where the layer does
    /// not look: a gRPC-Web call is judged by its head alone (its
    /// `grpc-status` if Trailers-Only, else `Outcome::Http(200)`). Put the
    /// layer inside the gRPC-Web translation (tonic-web's `GrpcWebLayer`
    /// outside it) to count gRPC-Web calls by their trailers too.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::outcome::Outcome;
    /// use tower_throttle::{grpc::GrpcCode, key::Global, MemoryStore, Policy, ThrottleLayer};
    ///
    /// // 5 failed gRPC logins a minute for everyone: calls answered
    /// // UNAUTHENTICATED or PERMISSION_DENIED; successful ones leave no trace.
    /// let login = ThrottleLayer::new(MemoryStore::new(), Policy::fixed_window(5, Duration::from_secs(60))?)
    ///     .key(Global)
    ///     .count_if_outcome(|outcome| {
    ///         matches!(outcome, Outcome::Grpc(GrpcCode::UNAUTHENTICATED | GrpcCode::PERMISSION_DENIED))
    ///     });
    /// // tonic::transport::Server::builder().layer(login).add_service(…)
    /// # let _ = login;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn count_if_outcome(
        mut self,
        counts: impl Fn(Outcome) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settings.count_if = Some(Arc::new(counts));
        self
    }

    /// Locks a rule's key out for a while after repeated denials (see
    /// [`Penalty`](crate::lockout::Penalty)): once a rule of this layer has
    /// refused a key `strikes` times within the penalty's window, every
    /// request of that key is answered `429` (gRPC: `RESOURCE_EXHAUSTED`)
    /// for the lock's duration, without being charged, with `Retry-After`
    /// (and the `RateLimit` reset) = the time left on the lock and nothing
    /// remaining. The denial that locks already answers with the lock's time.
    ///
    /// It applies to every rule of the layer, each rule key on its own
    /// (`<penalty prefix>:lock:<layer prefix>:<rule>:<key>`), except rules
    /// whose key every client shares ([`Global`](crate::key::Global), a
    /// route: see [`KeyExtractor::per_client`](crate::key::KeyExtractor::per_client)):
    /// their denials collect no strikes, so that one client's denials never
    /// lock out another; their own limit still applies. It works on
    /// every store; on Redis it costs one more round trip per rule and
    /// request, and a denial one to three more. Counted are the requests the
    /// layer rejects: in delay mode a request that waits for its quota is no
    /// strike, and a locked key is refused at once; a dry run neither checks
    /// nor records lock-outs. Lock checks honour the
    /// [`store_timeout`](Self::store_timeout) and [`FailMode`]. Layers
    /// without a lock-out pay nothing for it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{key::PeerIp, lockout::Penalty, MemoryStore, Policy, ThrottleLayer};
    ///
    /// let min = Duration::from_secs(60);
    /// // 5 logins a minute per client; 3 refusals within 10 minutes lock the
    /// // client out for 5.
    /// let login = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(5, min)?)
    ///     .name("login")
    ///     .key(PeerIp::new())
    ///     .lockout(Penalty::new(3, 10 * min, 5 * min)?);
    /// # let _ = login;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn lockout(mut self, penalty: crate::lockout::Penalty) -> Self {
        self.settings.lockout = Some(Arc::new(penalty));
        self
    }

    /// What to do with a denied request (default [`Mode::Reject`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// [`Mode::Delay`]: hold a denied request up to `max_wait` for its quota.
    pub fn delay_up_to(self, max_wait: Duration) -> Self {
        self.mode(Mode::Delay { max_wait })
    }

    /// [`Mode::DryRun`]: evaluate and report, never reject.
    pub fn dry_run(self) -> Self {
        self.mode(Mode::DryRun)
    }

    /// The share of a rule's limit past which an admission is counted in
    /// `tower_throttle_near_limit_total` (default 0.8, as Envoy's
    /// rate-limit service: the 5th request of 5 and the 81st of 100). A
    /// value outside `0.0..=1.0` is clamped into it; NaN keeps the default.
    /// At 1.0 nothing is counted, and a layer of one plain rule asks the
    /// store for no admission's figures, as it does without the feature.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn near_limit_ratio(mut self, ratio: f64) -> Self {
        if !ratio.is_nan() {
            self.settings.near_limit = ratio.clamp(0.0, 1.0);
        }
        self
    }

    /// What to do when the store fails or times out (default [`FailMode::Closed`]).
    pub fn fail_mode(mut self, fail: FailMode) -> Self {
        self.settings.fail = fail;
        self
    }

    /// Forwards requests unlimited when the store fails.
    pub fn fail_open(self) -> Self {
        self.fail_mode(FailMode::Open)
    }

    /// Answers 503 when the store fails (the default).
    pub fn fail_closed(self) -> Self {
        self.fail_mode(FailMode::Closed)
    }

    /// Gives up on a store call after `timeout`, then applies the fail mode
    /// (default: no limit beyond the store's own). Needs a tokio runtime
    /// with time enabled.
    ///
    /// It may be shorter than the store's own timeout: the layer gives up
    /// first. A [`FallbackStore`](crate::store::FallbackStore) fits in it:
    /// its primary gets three quarters of it and its fallback answers
    /// within the rest, so a stalled primary gets the fallback's decisions,
    /// not the fail mode (see
    /// [Within a caller's budget](crate::store::fallback#within-a-callers-budget)).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = Some(timeout);
        self
    }

    /// What to do when a rule finds no key the client should have sent
    /// (default 401 with an explanation). A key the server cannot build (no
    /// peer address) is always a 500: see [`OnMissingKey`].
    pub fn on_missing_key(mut self, on_missing: OnMissingKey) -> Self {
        self.settings.on_missing = on_missing;
        self
    }
}
