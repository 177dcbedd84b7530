//! The asynchronous path: a store that answers over the network, and delay
//! mode, which waits for the quota (reserving GCRA slots) and checks again.

use std::sync::Arc;
use std::time::Duration;

use super::settle::{settle, Step};
use super::{count, LayerState, Plan, Verdict};

use crate::decision::Receipt;
use crate::info::RateLimitInfo;
use crate::limiter::release_detached;
use crate::mode::Mode;
use crate::policy::{effective_policy, rebase, Policy};
use crate::store::{budget, Store, StoreError};

/// Checks the plan, waiting and re-checking in delay mode.
pub(crate) async fn evaluate<St: Store>(
    shared: Arc<LayerState<St>>,
    mut plan: Plan,
) -> Verdict<St> {
    super::choose::resolve_pending(&shared, &mut plan).await;
    if let Some(penalty) = &shared.settings.lockout {
        if let Some(verdict) = super::lockout::check(&shared, penalty, &plan).await {
            return verdict;
        }
    }
    let mut waited = Duration::ZERO;
    let mut attempts = 0;
    let holds = shared.holds.clone();
    loop {
        let reserve = match shared.settings.mode {
            Mode::Delay { max_wait }
                if shared.store.reserves_slots() && plan.reservable(&shared) =>
            {
                Some(max_wait.saturating_sub(waited))
            }
            _ => None,
        };
        // Registered before the check, so a release between the check and
        // the wait still wakes this request.
        let concurrency = plan
            .actives()
            .iter()
            .filter(|a| plan.policy(&shared, a).is_concurrency())
            .map(|a| plan.key(a));
        let mut released = std::pin::pin!(holds.released(concurrency).notified());
        released.as_mut().enable();
        let (answer, slot_wait) = match store_call(&shared, &plan, reserve).await {
            Ok((info, wait)) => (Ok(info), wait),
            Err(error) => (Err(error), Duration::ZERO),
        };
        match settle(&shared, &plan, answer, waited, attempts) {
            Step::Done(verdict) => {
                if slot_wait > Duration::ZERO && matches!(verdict, Verdict::Forward { .. }) {
                    // Admitted into a reserved slot: wait for it, then go. A
                    // waiter dropped before its time gives the slot back.
                    count(&shared, "delayed", None);
                    let info = match &verdict {
                        Verdict::Forward { info, .. } => info.as_ref(),
                        _ => None,
                    };
                    let reserved = Reserved::new(&shared, &plan, info);
                    tokio::time::sleep(slot_wait).await;
                    reserved.keep();
                }
                return verdict;
            }
            Step::Strike(info) => return super::lockout::strike(&shared, &plan, info).await,
            Step::Wait {
                wait,
                on_release: false,
            } => {
                attempts += 1;
                waited += wait;
                tokio::time::sleep(wait).await;
            }
            Step::Wait {
                wait,
                on_release: true,
            } => {
                // Woken by this layer's next release, or by the estimate
                // running out (a permit of another instance, a lapsed lease).
                // Only the timeouts count as attempts: each wake-up is a
                // permit freed, so they are as many as the releases.
                let started = tokio::time::Instant::now();
                if tokio::time::timeout(wait, released).await.is_err() {
                    attempts += 1;
                }
                waited += started.elapsed();
            }
        }
    }
}

/// One store call for the plan; with `reserve`, GCRA rules reserve their slot
/// within that budget. Returns the decisions and the wait for the reserved slots.
async fn store_call<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    reserve: Option<Duration>,
) -> Result<(RateLimitInfo, Duration), StoreError> {
    let call = async {
        let policies: Vec<Policy> = plan
            .actives()
            .iter()
            .map(|a| effective_policy(plan.policy(shared, a), a.cost, reserve))
            .collect();
        let mut decisions = plan
            .store_rules(|i, _| &policies[i])
            .check(&*shared.store)
            .await?;
        let mut wait = Duration::ZERO;
        let decided = plan.actives().iter().zip(&policies);
        for ((a, used), d) in decided.zip(decisions.as_mut_slice()) {
            wait = wait.max(rebase(plan.policy(shared, a), used, d));
        }
        Ok((decisions.into_info(shared, plan)?, wait))
    };
    #[cfg(feature = "metrics")]
    let started = std::time::Instant::now();
    let result = match shared.settings.timeout {
        Some(limit) => budget::within(limit, call).await,
        None => call.await,
    };
    #[cfg(feature = "metrics")]
    metrics::histogram!("tower_throttle_store_latency_seconds")
        .record(started.elapsed().as_secs_f64());
    result
}

/// The quota a delayed request was charged while it waits for its slot:
/// refunded if the request is dropped before it goes (a client that hangs
/// up), so abandoned waiters do not push later requests back. Concurrency
/// permits are not here: the verdict's permits release themselves.
struct Reserved<St: Store> {
    store: Option<Arc<St>>,
    charged: Vec<(Vec<u8>, Policy, Receipt)>,
}

impl<St: Store> Reserved<St> {
    fn new(shared: &LayerState<St>, plan: &Plan, info: Option<&RateLimitInfo>) -> Self {
        let charged = info.map(|info| plan.refundable(info)).unwrap_or_default();
        Reserved {
            store: Some(shared.store.clone()),
            charged,
        }
    }

    /// The request went ahead: its charge stands.
    fn keep(mut self) {
        self.store = None;
    }
}

impl<St: Store> Drop for Reserved<St> {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let charged = std::mem::take(&mut self.charged);
        release_detached(async move {
            for (key, policy, receipt) in charged {
                // A failed refund leaves the slot taken: the limit still holds.
                let _ = store.refund(&key, &policy, &receipt).await;
            }
        });
    }
}
