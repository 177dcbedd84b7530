//! A handler behind a layer with `request_info(true)` that says which store
//! decided the request, in the `x-decided-by` header (`primary` or
//! `fallback`). Shared through `#[path]`:
//! `#[path = "support/decided_by.rs"] mod decided_by;`.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower_throttle::decision::DecidedBy;
use tower_throttle::RateLimitInfo;

pub fn handler() -> impl tower::Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send {
    tower::service_fn(|req: Request<()>| async move {
        let info = req
            .extensions()
            .get::<RateLimitInfo>()
            .expect("request_info");
        let by = match info.decided_by() {
            DecidedBy::Primary => "primary",
            DecidedBy::Fallback => "fallback",
        };
        let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
        res.headers_mut()
            .insert("x-decided-by", http::HeaderValue::from_static(by));
        Ok::<_, Infallible>(res)
    })
}
