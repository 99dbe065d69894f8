//! When each request of a pass is sent: open-loop arrivals, as `vllm bench
//! serve` makes them. Inter-arrival times are gamma-distributed with shape
//! `B` (the burstiness) and mean `1/R`, i.e. scale `1/(R·B)`: `B = 1` is a
//! Poisson process, a larger `B` is more regular (the coefficient of
//! variation is `1/√B`), a smaller one burstier. An infinite rate sends
//! everything at once. Pure and seeded: the same arguments give the same
//! schedule, so off and auto face the very same arrivals. Which mode's
//! pass goes first in a repetition is [`pass_order`].

use std::time::Duration;

use crate::client::Mode;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Gamma};
use serde::Serialize;

/// Requests per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    PerSecond(f64),
    /// Every request at time 0.
    Unbounded,
}

impl Rate {
    /// `inf`, or a positive number of requests per second.
    pub fn parse(s: &str) -> Result<Rate, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("inf") {
            return Ok(Rate::Unbounded);
        }
        match s.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Rate::PerSecond(r)),
            Ok(r) if r == f64::INFINITY => Ok(Rate::Unbounded),
            _ => Err(format!(
                "`{s}` is not a request rate: use a positive number of requests per second, or inf"
            )),
        }
    }

    /// How tables and plots name it: `2`, `0.5`, `inf`.
    pub fn label(self) -> String {
        match self {
            Rate::PerSecond(r) => format!("{r}"),
            Rate::Unbounded => "inf".into(),
        }
    }
}

/// A number, or `"inf"` (JSON has no infinity).
impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rate::PerSecond(r) => s.serialize_f64(*r),
            Rate::Unbounded => s.serialize_str("inf"),
        }
    }
}

/// `--burstiness`: a positive, finite gamma shape.
pub fn parse_burstiness(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(b) if b.is_finite() && b > 0.0 => Ok(b),
        _ => Err(format!(
            "`{s}` is not a burstiness: use a positive number (1 is Poisson)"
        )),
    }
}

/// The gaps between consecutive arrivals, in seconds: the `i`-th is the
/// wait after sending request `i`.
pub fn gaps(rate: Rate, burstiness: f64, seed: u64, n: usize) -> Vec<f64> {
    let Rate::PerSecond(r) = rate else {
        return vec![0.0; n];
    };
    let gamma = Gamma::new(burstiness, 1.0 / (r * burstiness))
        .expect("rate and burstiness are positive and finite (checked at parsing)");
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| gamma.sample(&mut rng)).collect()
}

/// When each of `n` requests is sent, from the start of the pass: the
/// first at once, each next one a gap later.
pub fn schedule(rate: Rate, burstiness: f64, seed: u64, n: usize) -> Vec<Duration> {
    let mut at = 0.0;
    gaps(rate, burstiness, seed, n)
        .into_iter()
        .map(|gap| {
            let this = at;
            at += gap;
            Duration::from_secs_f64(this)
        })
        .collect()
}

/// The modes' passes in repetition `repeat` (from 1): off first in odd
/// repetitions, auto first in even ones (ABBA), so a drift of the
/// machine's speed through the run weighs on both modes alike.
pub fn pass_order(repeat: usize) -> [Mode; 2] {
    if repeat % 2 == 1 {
        [Mode::Off, Mode::Auto]
    } else {
        [Mode::Auto, Mode::Off]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_modes_take_turns_going_first() {
        let order: Vec<Mode> = (1..=4).flat_map(pass_order).collect();
        use Mode::{Auto, Off};
        assert_eq!(order, [Off, Auto, Auto, Off, Off, Auto, Auto, Off]);
    }

    fn mean_and_cv(v: &[f64]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let rate = Rate::PerSecond(5.0);
        assert_eq!(schedule(rate, 1.0, 7, 100), schedule(rate, 1.0, 7, 100));
        assert_ne!(schedule(rate, 1.0, 7, 100), schedule(rate, 1.0, 8, 100));
        let s = schedule(rate, 1.0, 7, 100);
        assert_eq!(s[0], Duration::ZERO, "the first request goes at once");
        assert!(s.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn poisson_arrivals_have_the_rate_and_a_cv_of_one() {
        let g = gaps(Rate::PerSecond(5.0), 1.0, 42, 20_000);
        let (mean, cv) = mean_and_cv(&g);
        let rate = 1.0 / mean;
        assert!((rate - 5.0).abs() / 5.0 < 0.05, "rate {rate}");
        assert!((cv - 1.0).abs() < 0.05, "cv {cv}");
    }

    #[test]
    fn higher_burstiness_is_more_regular_at_the_same_rate() {
        let g = gaps(Rate::PerSecond(5.0), 4.0, 42, 20_000);
        let (mean, cv) = mean_and_cv(&g);
        let rate = 1.0 / mean;
        assert!((rate - 5.0).abs() / 5.0 < 0.05, "rate {rate}");
        // The gamma's CV is 1/sqrt(shape): 0.5 here.
        assert!((cv - 0.5).abs() < 0.05, "cv {cv}");
    }

    #[test]
    fn an_infinite_rate_sends_everything_at_once() {
        assert!(gaps(Rate::Unbounded, 1.0, 1, 50).iter().all(|&g| g == 0.0));
        assert!(
            schedule(Rate::Unbounded, 3.0, 1, 50)
                .iter()
                .all(|d| d.is_zero())
        );
    }

    #[test]
    fn rates_and_burstiness_are_parsed_or_refused_by_value() {
        assert_eq!(Rate::parse("inf"), Ok(Rate::Unbounded));
        assert_eq!(Rate::parse("2.5"), Ok(Rate::PerSecond(2.5)));
        assert_eq!(Rate::PerSecond(2.0).label(), "2");
        for bad in ["0", "-1", "fast", "NaN"] {
            let e = Rate::parse(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
        assert_eq!(parse_burstiness("4"), Ok(4.0));
        assert!(parse_burstiness("0").unwrap_err().contains("`0`"));
    }
}
