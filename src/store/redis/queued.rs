//! One rule of a check waiting for the batcher ([`QueuedRule`]). A leaf:
//! the batch that sends it and the release of its abandoned leases both
//! read it.

use super::params::Params;
use crate::decision::PermitId;
use crate::policy::Policy;

/// One rule of a queued check, owning what the script call needs.
pub(crate) struct QueuedRule {
    pub key: Vec<u8>,
    pub policy: Policy,
    pub params: Params,
    pub cost: u64,
    pub permit: Option<PermitId>,
}
