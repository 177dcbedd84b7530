//! The rules of one request's plan: each rule's key in the plan's buffer,
//! its cost and the policy it applies. A leaf: the plan and the choice of
//! a request's policy both build on it.

/// A rule to check: its index, its key in the plan's buffer, its cost and
/// the policy applied.
#[derive(Clone, Copy)]
pub(super) struct PlannedRule {
    pub(super) rule: usize,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) cost: u64,
    /// The request's own policy (an index into `Plan::chosen`), when it is
    /// not the rule's: kept out of line, so a static policy copies nothing.
    pub(super) chosen: Option<u32>,
    /// The policy is still to be resolved (asynchronously).
    pub(super) pending: bool,
}

/// A plan's rules: one (the common case, no allocation) or several.
pub(super) enum PlannedRules {
    One(PlannedRule),
    Many(Vec<PlannedRule>),
}
