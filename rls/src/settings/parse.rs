//! Parsing env values the way upstream's `envconfig` does (Go's `strconv`
//! and `time.ParseDuration`), with errors that name the variable.

use std::time::Duration;

use super::SettingsError;

/// Go's `strconv.ParseBool`.
pub(super) fn bool_value(name: &'static str, raw: &str) -> Result<bool, SettingsError> {
    match raw {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(SettingsError::invalid(name, raw, "expected true or false")),
    }
}

pub(super) fn u16_value(name: &'static str, raw: &str) -> Result<u16, SettingsError> {
    raw.trim()
        .parse()
        .map_err(|_| SettingsError::invalid(name, raw, "expected a port number (0-65535)"))
}

pub(super) fn u64_value(name: &'static str, raw: &str) -> Result<u64, SettingsError> {
    raw.trim()
        .parse()
        .map_err(|_| SettingsError::invalid(name, raw, "expected a whole number ≥ 0"))
}

pub(super) fn ratio_value(name: &'static str, raw: &str) -> Result<f32, SettingsError> {
    match raw.trim().parse::<f32>() {
        Ok(r) if r.is_finite() && (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(SettingsError::invalid(
            name,
            raw,
            "expected a number between 0 and 1",
        )),
    }
}

/// The longest duration Go's `time.Duration` holds (2^63 − 1 ns, about 292
/// years): `time.ParseDuration` refuses longer ones, and so does this.
const GO_MAX_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// Go's `time.ParseDuration`: `300ms`, `1h30m`, `-` not allowed, `0` alone,
/// at most 2562047h47m16.854775807s.
pub(super) fn duration_value(name: &'static str, raw: &str) -> Result<Duration, SettingsError> {
    let bad =
        || SettingsError::invalid(name, raw, "expected a duration such as 10s, 1h30m or 500ms");
    let s = raw.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(bad());
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..n_end].parse().map_err(|_| bad())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[u_end..];
    }
    match Duration::try_from_secs_f64(total) {
        Ok(d) if d <= GO_MAX_DURATION => Ok(d),
        _ => Err(SettingsError::invalid(
            name,
            raw,
            "longer than Go's longest duration, 2562047h47m16.854775807s",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_go_parses_them() {
        assert_eq!(
            duration_value("X", "24h").unwrap(),
            Duration::from_secs(86_400)
        );
        assert_eq!(
            duration_value("X", "1h30m").unwrap(),
            Duration::from_secs(5_400)
        );
        assert_eq!(
            duration_value("X", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(duration_value("X", "0").unwrap(), Duration::ZERO);
        assert_eq!(duration_value("X", "1ns").unwrap(), Duration::from_nanos(1));
        // Go's range: up to 2^63 − 1 ns; beyond it, refused as Go refuses.
        assert_eq!(
            duration_value("X", "2562047h").unwrap(),
            Duration::from_secs(2_562_047 * 3_600)
        );
        for bad in [
            "",
            "10",
            "-1s",
            "1x",
            "s",
            "2562048h",
            "99999999999999999999h",
            "1e400s",
        ] {
            assert!(duration_value("X", bad).is_err(), "{bad:?}");
        }
        let err = duration_value("STATS_FLUSH_INTERVAL", "2562048h")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("STATS_FLUSH_INTERVAL") && err.contains("longest"),
            "{err}"
        );
    }

    #[test]
    fn bools_as_go_parses_them() {
        assert!(bool_value("X", "True").unwrap());
        assert!(!bool_value("X", "0").unwrap());
        let err = bool_value("SHADOW_MODE", "yes").unwrap_err().to_string();
        assert!(err.contains("SHADOW_MODE") && err.contains("yes"), "{err}");
    }
}
