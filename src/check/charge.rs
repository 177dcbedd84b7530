//! Charges settled after the response: counting by outcome (a request is
//! charged when admitted, a reservation, and refunded once its response
//! shows it does not count), costs known only from the response (see
//! [`crate::meter`]), and the slot a delayed request reserved (refunded if
//! the request is dropped while it waits).

use std::sync::Arc;

use http::Response;

use super::{LayerState, Plan};
use crate::body::{BodyEnd, BodySettle};
use crate::decision::Receipt;
use crate::info::RateLimitInfo;
use crate::meter::{ActualCost, ReportedCost};
use crate::outcome::{in_trailers, AtHead, Outcome};
use crate::policy::Policy;
use crate::settings::CountIf;
use crate::store::release_detached;
use crate::store::{Charge, Store};

/// What an admitted request was charged, to settle once its response shows
/// whether it counts and what it cost. Dropped without a response (the
/// client went away, the inner service's future was dropped), the charge
/// stands: an attempt whose outcome is unknown counts, so hanging up cannot
/// dodge the limit.
pub(crate) struct HeldCharge<St: Store> {
    store: Arc<St>,
    count_if: Option<CountIf>,
    held: Vec<Held>,
}

/// One rule's charge of an admitted request.
struct Held {
    key: Vec<u8>,
    policy: Policy,
    /// `None` for an estimate of 0, which charged nothing.
    receipt: Option<Receipt>,
    /// Where the actual cost comes from, if settled after the response.
    actual: Option<ActualCost>,
}

/// What settling one rule's charge comes to.
enum Settlement {
    Refund(Receipt),
    /// Charged on top of the estimate, as far as the quota has room.
    Overage(u64),
}

impl<St: Store> HeldCharge<St> {
    pub(super) fn collect(
        shared: &LayerState<St>,
        plan: &Plan,
        info: &RateLimitInfo,
    ) -> Option<Box<Self>> {
        let count_if = shared.settings.count_if.clone();
        if count_if.is_none() && !shared.settings.settles_cost {
            return None;
        }
        let held: Vec<Held> = (plan.actives().iter())
            .zip(info.iter())
            .filter(|(_, (_, policy, _))| !policy.is_concurrency())
            .filter_map(|(a, (_, policy, d))| {
                let actual = shared.rules[a.rule].actual.clone();
                let receipt = d.receipt();
                // Counting by outcome refunds what was charged; settling a
                // cost may charge on top of an estimate of 0.
                let settles = actual.is_some() || (count_if.is_some() && receipt.is_some());
                settles.then(|| Held {
                    key: plan.key(a).to_vec(),
                    policy: *policy,
                    receipt,
                    actual,
                })
            })
            .collect();
        (!held.is_empty()).then(|| {
            Box::new(HeldCharge {
                store: shared.store.clone(),
                count_if,
                held,
            })
        })
    }

    /// Settles what the head of the inner service's answer tells, and hands
    /// the rest (a gRPC call's trailers, bytes sent, a cost in trailers) to
    /// the body. An inner service error counts as a 500 that sent nothing;
    /// a malformed `grpc-status`, unknown, counts.
    pub(crate) fn at_head<B, E>(
        self: Box<Self>,
        result: &Result<Response<B>, E>,
    ) -> Option<BodySettle> {
        let (head, reported) = match result {
            Ok(response) => (
                AtHead::of(response.status(), response.headers()),
                response.extensions().get::<ReportedCost>().copied(),
            ),
            Err(_) => {
                let error = Outcome::Http(http::StatusCode::INTERNAL_SERVER_ERROR);
                (AtHead::Known(error), None)
            }
        };
        let counts = match (&self.count_if, head) {
            (None, _) | (Some(_), AtHead::Unknown) => Some(true),
            (Some(count_if), AtHead::Known(outcome)) => Some(count_if(outcome)),
            (Some(_), AtHead::InTrailers) => None,
        };
        let from_body = (self.held.iter()).any(|h| {
            matches!(
                h.actual,
                Some(ActualCost::ResponseBytes | ActualCost::Trailer(_))
            )
        });
        match counts {
            Some(counts) if !counts || !from_body => (*self).settle(counts, reported, None),
            _ if result.is_err() => {
                let end = BodyEnd {
                    trailers: None,
                    bytes: 0,
                };
                (*self).settle(counts.unwrap_or(true), reported, Some(&end));
            }
            _ => {
                return Some(BodySettle::new(move |end| {
                    // A gRPC call that ends without a `grpc-status` counts.
                    let counts = counts.unwrap_or_else(|| {
                        let outcome = end.trailers.and_then(in_trailers);
                        match (outcome, &self.count_if) {
                            (Some(outcome), Some(count_if)) => count_if(outcome),
                            _ => true,
                        }
                    });
                    (*self).settle(counts, reported, Some(&end));
                }));
            }
        }
        None
    }

    /// Refunds everything if the response does not count; else settles
    /// each rule's actual cost against its estimate (at once for an
    /// in-process store; else on the current runtime). A cost never known
    /// leaves the estimate charged.
    fn settle(self, counts: bool, reported: Option<ReportedCost>, end: Option<&BodyEnd>) {
        let HeldCharge { store, held, .. } = self;
        let settlements: Vec<_> = (held.into_iter())
            .filter_map(|h| {
                let settlement = if counts {
                    let actual = actual_cost(h.actual.as_ref()?, reported, end)?;
                    let estimate = h.receipt.map_or(0, |r| r.units());
                    match actual.cmp(&estimate) {
                        std::cmp::Ordering::Less => {
                            Settlement::Refund(h.receipt?.part(estimate - actual))
                        }
                        std::cmp::Ordering::Greater => Settlement::Overage(actual - estimate),
                        std::cmp::Ordering::Equal => return None,
                    }
                } else {
                    Settlement::Refund(h.receipt?)
                };
                Some((h.key, h.policy, settlement))
            })
            .collect();
        if settlements.is_empty() {
            return;
        }
        release_detached(async move {
            for (key, policy, settlement) in settlements {
                match settlement {
                    // Into the slot the units were taken from (a window that
                    // has ended since keeps them). A failed refund leaves
                    // them counted: the limit holds.
                    Settlement::Refund(receipt) => {
                        let _ = store.refund(&key, &policy, &receipt).await;
                    }
                    Settlement::Overage(units) => overage(&*store, &key, &policy, units).await,
                }
            }
        });
    }
}

/// The actual cost `actual` names, if the response told it.
fn actual_cost(
    actual: &ActualCost,
    reported: Option<ReportedCost>,
    end: Option<&BodyEnd>,
) -> Option<u64> {
    let reported = reported.map(|r| r.0);
    match actual {
        ActualCost::Reported => reported,
        ActualCost::ResponseBytes => end.map(|end| end.bytes),
        ActualCost::Trailer(name) => (end.and_then(|end| end.trailers))
            .and_then(|trailers| trailers.get(name))
            .and_then(|value| value.to_str().ok()?.trim().parse().ok())
            .or(reported),
    }
}

/// Charges `units` beyond an estimate; when the quota has less room, what
/// is left of it, so the next request finds it spent. A store may answer
/// a part from more than one place (a lease's units in process, then the
/// shared count), so the parts are charged until none is left: a few
/// rounds at most.
async fn overage<St: Store>(store: &St, key: &[u8], policy: &Policy, units: u64) {
    let mut left = units;
    for _ in 0..4 {
        let Ok(d) = store.check(Charge::new(key, policy, left)).await else {
            return;
        };
        if d.allowed || d.remaining == 0 {
            return;
        }
        let part = d.remaining.min(left);
        match store.check(Charge::new(key, policy, part)).await {
            Ok(d) if d.allowed => left -= part,
            // The room shrank meanwhile (another charge, a lease's block):
            // look again.
            Ok(_) => continue,
            Err(_) => return,
        }
        if left == 0 {
            return;
        }
    }
}
