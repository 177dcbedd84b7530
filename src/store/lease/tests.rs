//! Unit tests of leases on a manual clock: see `tests/lease/` for the
//! schedules of several processes.
