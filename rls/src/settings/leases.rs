//! `RLS_LEASES`: whether hot descriptors on Redis are served from leases
//! (see [`crate::backend::leases`]).

use super::{Backend, Env, SettingsError};

/// The variable.
pub const NAME: &str = "RLS_LEASES";

/// `RLS_LEASES`: `on` (the default with Redis, where leases are exact) or
/// `off` (the default with the memory store, which has nothing to lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leases {
    /// Hot keys take blocks of units from Redis and spend them in process.
    On,
    /// Every check goes to the store.
    Off,
}

impl Leases {
    /// What the start line says about leases.
    pub fn describe(self) -> &'static str {
        match self {
            Leases::On => {
                "; hot descriptors served from leases, exact (RLS_LEASES=on; a process holds \
                 at most 1,024 counts of a key, 1,280 units with the extension's algorithms)"
            }
            Leases::Off => "; leases off (RLS_LEASES=off): one Redis call per check",
        }
    }
}

/// Reads `RLS_LEASES`; `on` with the memory store is refused (there is no
/// shared store to lease from), rather than ignored.
pub(super) fn leases(env: &Env<'_>, backend: &Backend) -> Result<Leases, SettingsError> {
    let redis = matches!(backend, Backend::Redis(_));
    let Some(raw) = (env.0)(NAME) else {
        return Ok(if redis { Leases::On } else { Leases::Off });
    };
    match (raw.as_str(), redis) {
        ("on", true) => Ok(Leases::On),
        ("off", _) => Ok(Leases::Off),
        ("on", false) => Err(SettingsError {
            name: NAME,
            message: "on needs a Redis backend (BACKEND_TYPE=redis): the memory store \
                      is in process already, with nothing to lease"
                .into(),
        }),
        _ => Err(SettingsError::invalid(NAME, &raw, "expected on or off")),
    }
}
