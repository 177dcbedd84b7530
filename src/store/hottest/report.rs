//! What a hottest-keys report says, in a shape a person reads right: a
//! count is exact, or shown with the bounds the summary can vouch for.

use std::fmt;
use std::time::Duration;

/// A hottest-keys report ([`Hottest::hottest_keys`](super::Hottest::hottest_keys),
/// [`MemoryStore::hottest_keys`](crate::MemoryStore::hottest_keys)): the
/// keys with the most checks and with the most denials, most first, over
/// the interval that ended last and the one under way.
///
/// Its `Display` is a table for a person: every count exact, or its bounds
/// (`≥ 1, ≤ 122`: a key the summary took in late may have inherited most
/// of its upper bound from the keys it replaced).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HottestKeys {
    /// How long the counts cover: from the start of the previous interval
    /// (or of tracking, if later) to now.
    pub span: Duration,
    /// Checks counted in all (each sampled check counts `sample_every`).
    pub checks: u64,
    /// Denials counted in all.
    pub denials: u64,
    /// One check in this many was counted, `sample_every` times (1: every
    /// check, so totals are exact and each count's bounds hold).
    pub sample_every: u32,
    /// The keys with the most checks, most first.
    pub by_checks: Vec<KeyActivity>,
    /// The keys with the most denials, most first (keys never denied are
    /// not listed).
    pub by_denials: Vec<KeyActivity>,
}

impl Default for HottestKeys {
    fn default() -> Self {
        HottestKeys {
            span: Duration::ZERO,
            checks: 0,
            denials: 0,
            sample_every: 1,
            by_checks: Vec::new(),
            by_denials: Vec::new(),
        }
    }
}

/// One key of [`HottestKeys`].
///
/// Its true count lies between [`lower_bound`](Self::lower_bound) and
/// [`count`](Self::count); both are equal (the count is exact) while the
/// summary holding the key has never been full.
///
/// ```
/// # fn show(k: &tower_throttle::store::hottest::KeyActivity) {
/// println!("{k}"); // `api:minute:u-17  ≥ 1, ≤ 122`, or `api:minute:u-7  3`
/// println!("{}", k.count_display()); // `≥ 1, ≤ 122`
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyActivity {
    /// The store key, as the layer or limiter built it
    /// (`prefix:rule:key-part`): the client's identity, so treat it as such.
    pub key: Box<[u8]>,
    /// The upper bound of the key's checks (or denials, in
    /// [`HottestKeys::by_denials`]): at least the true count (with
    /// sampling, an estimate of it) and at most [`error`](Self::error)
    /// above it.
    pub count: u64,
    /// How much of `count` the key may have inherited from keys it
    /// replaced in the summary: `count - error` is a lower bound.
    pub error: u64,
    /// The least the key can have had: `count - error`.
    pub lower_bound: u64,
    /// Whether the counts are scaled from a sample of the checks
    /// ([`HottestKeys::sample_every`] above 1): estimates, not bounds.
    pub estimated: bool,
}

impl KeyActivity {
    /// Whether [`count`](Self::count) is the key's exact count.
    pub fn is_exact(&self) -> bool {
        self.error == 0 && !self.estimated
    }

    /// The count as a person should read it: `3` when exact, `≥ 1, ≤ 122`
    /// between bounds, and `≈` before either when the checks were sampled.
    pub fn count_display(&self) -> impl fmt::Display + '_ {
        CountDisplay(self)
    }
}

struct CountDisplay<'a>(&'a KeyActivity);

impl fmt::Display for CountDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.0;
        if k.estimated {
            f.write_str("≈ ")?;
        }
        if k.error == 0 {
            write!(f, "{}", k.count)
        } else {
            write!(f, "≥ {}, ≤ {}", k.lower_bound, k.count)
        }
    }
}

impl fmt::Display for KeyActivity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are bytes; the parts the crate writes are escaped text or
        // hex digests, so a lossy rendering loses nothing of them.
        write!(
            f,
            "{}  {}",
            String::from_utf8_lossy(&self.key),
            self.count_display()
        )
    }
}

impl fmt::Display for HottestKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "over {:.1?}: {} checks, {} denials",
            self.span, self.checks, self.denials
        )?;
        if self.sample_every > 1 {
            write!(
                f,
                " (one check in {} counted: estimates)",
                self.sample_every
            )?;
        }
        for (title, keys) in [
            ("by checks", &self.by_checks),
            ("by denials", &self.by_denials),
        ] {
            write!(f, "\n{title}:")?;
            if keys.is_empty() {
                f.write_str(" none")?;
            }
            for key in keys {
                write!(f, "\n  {key}")?;
            }
        }
        Ok(())
    }
}
