//! Exact decisions: a seeded walk of checks, peeks, refunds, resets and
//! releases, each decision compared with the reference model's.

use std::time::Duration;

use super::model::Model;
use super::subject::{key, model_now, Subject};
use crate::decision::{Decision, Receipt};
use crate::policy::Policy;
use crate::store::{Charge, Decisions, Store};

/// A tiny deterministic generator, so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Compares a store's decision with the model's.
fn same(subject: &Subject<impl Store>, what: &str, got: &Decision, want: &Decision) {
    let ctx = format!("{} / {what}: store {got:?}, model {want:?}", subject.name);
    assert_eq!(got.allowed, want.allowed, "allowed: {ctx}");
    assert_eq!(got.limit, want.limit, "limit: {ctx}");
    assert_eq!(got.remaining, want.remaining, "remaining: {ctx}");
    assert_eq!(got.retry_after, want.retry_after, "retry_after: {ctx}");
    if subject.caps.exact_reset {
        assert_eq!(got.reset_after, want.reset_after, "reset_after: {ctx}");
        assert_eq!(got.quota_after, want.quota_after, "quota_after: {ctx}");
    } else {
        assert!(got.reset_after >= want.reset_after, "reset_after: {ctx}");
    }
    assert_eq!(got.permit.is_some(), want.permit.is_some(), "permit: {ctx}");
    if subject.caps.refund {
        // The slot the charge was taken from.
        let slot = |d: &Decision| d.receipt().map(|r| (r.units(), r.at_ns(), r.permit()));
        assert_eq!(slot(got), slot(want), "receipt: {ctx}");
    }
}

/// 300 seeded steps: advance, check (or peek) through `check` and
/// `decide` in turn, sometimes refund, reset or release; every decision
/// equal to the model's.
pub(super) async fn model_walk<S: Store>(subject: &Subject<S>, name: &str, policy: &Policy) {
    let key = key(subject, name, "walk");
    let mut model = Model::default();
    let mut rng = Rng(0x853c_49e6_748f_ea9b ^ name.len() as u64);
    let mut held = Vec::new();
    let mut receipts = Vec::new();
    let window_ms = policy.window().as_millis().max(1) as u64;
    for step in 0..300 {
        (subject.advance)(Duration::from_millis(rng.below(window_ms / 2 + 1)));
        let now = model_now(subject);
        let what = format!("{name} step {step}");
        match rng.below(10) {
            // Any charge still held, old or recent, in part or whole: the
            // units go back to its own slot or nowhere.
            0 if subject.caps.refund && !receipts.is_empty() => {
                let i = rng.below(receipts.len() as u64) as usize;
                let receipt: Receipt = receipts.swap_remove(i);
                let receipt = receipt.part(1 + rng.below(2));
                subject
                    .store
                    .refund(&key, policy, &receipt)
                    .await
                    .unwrap_or_else(|e| panic!("{}: refund: {e}", subject.name));
                model.refund(&key, policy, now, &receipt);
            }
            1 if subject.caps.reset && rng.below(3) == 0 => {
                subject
                    .store
                    .reset(&key, policy)
                    .await
                    .unwrap_or_else(|e| panic!("{}: reset: {e}", subject.name));
                model.reset(&key);
                held.clear();
                receipts.clear();
            }
            2 if !held.is_empty() => {
                let permit = held.swap_remove(rng.below(held.len() as u64) as usize);
                subject
                    .store
                    .release(&key, policy, permit)
                    .await
                    .unwrap_or_else(|e| panic!("{}: release: {e}", subject.name));
                model.release(&key, permit.0);
            }
            _ => {
                let cost = if subject.caps.peek {
                    rng.below(3)
                } else {
                    1 + rng.below(2)
                };
                let charge = Charge::new(&key, policy, cost);
                // Every other step through `decide` itself: a store that
                // overrides `check` answers alike both ways.
                let got = match step % 2 {
                    0 => subject.store.check(charge).await,
                    _ => subject
                        .store
                        .decide(&[charge])
                        .await
                        .and_then(Decisions::into_one),
                };
                let got = got.unwrap_or_else(|e| panic!("{}: {what}: {e}", subject.name));
                let permit = got.permit.map_or(0, |p| p.0);
                let want = model.check(&key, policy, now, cost, permit);
                same(subject, &format!("{what} cost {cost}"), &got, &want);
                if let Some(p) = got.permit {
                    held.push(p);
                }
                receipts.extend(got.receipt());
            }
        }
    }
    for permit in held {
        let _ = subject.store.release(&key, policy, permit).await;
    }
}
