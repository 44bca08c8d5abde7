//! Numbers for people, as the status page prints them: sizes, ages, percentages, clock times.

use gpumem::units::Bytes;

pub(crate) fn bytes(value: u64) -> String {
    Bytes(value).to_string()
}

/// "0.0 %" to "100.0 %"; values out of range are printed as they are.
pub(crate) fn percent(ratio: f64) -> String {
    format!("{:.1} %", ratio * 100.0)
}

/// An age in the two largest units that matter: "42 s", "3 min 05 s", "2 h 07 min", "3 d 4 h".
pub(crate) fn age(seconds: f64) -> String {
    let total = seconds.max(0.0) as u64;
    let (days, hours, minutes, secs) = (
        total / 86_400,
        total / 3600 % 24,
        total / 60 % 60,
        total % 60,
    );
    if days > 0 {
        format!("{days} d {hours} h")
    } else if hours > 0 {
        format!("{hours} h {minutes:02} min")
    } else if minutes > 0 {
        format!("{minutes} min {secs:02} s")
    } else {
        format!("{secs} s")
    }
}

/// "14:03:27 UTC" for a Unix time (the page says UTC rather than guessing the reader's zone).
pub(crate) fn clock_utc(unix_seconds: f64) -> String {
    let secs = unix_seconds.max(0.0) as u64 % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A count with thousands separators: "100,000".
pub(crate) fn count(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// CUDA graph pools and the memory they hold: "2 pools, 52.00 MiB".
pub(crate) fn graph_pools(pools: u64, bytes: u64) -> String {
    let noun = if pools == 1 { "pool" } else { "pools" };
    format!("{} {noun}, {}", count(pools), self::bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_pools_name_their_count_and_memory() {
        assert_eq!(graph_pools(1, 2 * 1024 * 1024), "1 pool, 2.00 MiB");
        assert_eq!(graph_pools(3, 0), "3 pools, 0 B");
    }

    #[test]
    fn ages_use_the_two_largest_units() {
        assert_eq!(age(42.7), "42 s");
        assert_eq!(age(185.0), "3 min 05 s");
        assert_eq!(age(2.0 * 3600.0 + 7.0 * 60.0), "2 h 07 min");
        assert_eq!(age(3.0 * 86_400.0 + 4.0 * 3600.0), "3 d 4 h");
        assert_eq!(age(-1.0), "0 s");
    }

    #[test]
    fn counts_and_clocks_read_well() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(100_000), "100,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(clock_utc(86_400.0 + 3661.0), "01:01:01 UTC");
        assert_eq!(percent(0.1234), "12.3 %");
    }
}
