//! Keeping only the newest entries of a table of identities that come and go (exited processes
//! already logged, the flight recorder's watches). Forgetting by time alone lets publishers
//! that rename themselves faster than the retention grow such a table by thousands of entries,
//! and memory freed in thousands of small pieces is not given back to the system: the process
//! stays at its peak long after the table empties. A bound on the count keeps the peak small.

use std::cmp::Ordering;

/// The time from which entries stay so that about `keep` of the newest are kept: entries of
/// the same time stay or go together, so a few more may stay. `None` when no more than
/// `keep` are given.
pub(crate) fn cutoff<T: Copy + PartialOrd>(
    times: impl Iterator<Item = T>,
    keep: usize,
) -> Option<T> {
    let mut times: Vec<T> = times.collect();
    if times.len() <= keep {
        return None;
    }
    let first_kept = times.len() - keep;
    let (_, at, _) = times.select_nth_unstable_by(first_kept, |a, b| {
        a.partial_cmp(b).unwrap_or(Ordering::Equal)
    });
    Some(*at)
}

#[cfg(test)]
mod tests {
    use super::cutoff;

    #[test]
    fn the_cutoff_keeps_the_newest() {
        let times = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(cutoff(times.iter().copied(), 2), Some(4.0));
        assert_eq!(cutoff(times.iter().copied(), 5), None);
        // Ties stay together: keeping two of these keeps all three at 2.0.
        let tied = [1.0, 2.0, 2.0, 2.0];
        assert_eq!(cutoff(tied.iter().copied(), 2), Some(2.0));
    }
}
