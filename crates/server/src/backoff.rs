//! The wait between tries to reach a peer that is down (the gateway's
//! health watch, the verifier's drafter re-attach): exponential from a
//! first wait to a cap, each wait plus up to as much again at random, so
//! that many sessions or gateways that lost the same pod do not all knock
//! again in step. backon's schedule; `reset` starts it over once the peer
//! answers.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// An endless, jittered exponential schedule of waits.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    waits: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// Waits of `first`, doubling up to `max`, each with up to as much
    /// again added at random.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let builder = ExponentialBuilder::new()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            waits: builder.build(),
            builder,
            max,
        }
    }

    /// How long to wait before the next try.
    pub fn next_wait(&mut self) -> Duration {
        self.waits.next().unwrap_or(self.max)
    }

    /// The peer answered: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.waits = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_with_jitter_and_reset_starts_over() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(250), ms(4000));
        for base in [250, 500, 1000, 2000, 4000, 4000, 4000] {
            let w = b.next_wait();
            assert!(w >= ms(base) && w < ms(2 * base), "{w:?} for {base} ms");
        }
        b.reset();
        let w = b.next_wait();
        assert!(w >= ms(250) && w < ms(500), "{w:?}");
    }

    #[test]
    fn jitter_spreads_the_waits() {
        let waits: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| Backoff::new(Duration::from_millis(250), Duration::from_secs(4)).next_wait())
            .collect();
        assert!(waits.len() > 1, "{waits:?}");
    }
}
