//! Samples of durations and their summary.

use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub struct Samples(pub Vec<Duration>);

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    fn sorted(&self) -> Vec<Duration> {
        let mut v = self.0.clone();
        v.sort();
        v
    }

    /// The q-quantile (0..=1) by nearest rank.
    pub fn quantile(&self, q: f64) -> Duration {
        let v = self.sorted();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        v[i.min(v.len() - 1)]
    }

    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// 12.3 µs, 4.56 ms, 1.23 s.
pub fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let s = Samples((1..=101).map(Duration::from_micros).collect());
        assert_eq!(s.median(), Duration::from_micros(51));
        assert_eq!(s.quantile(0.1), Duration::from_micros(11));
        assert_eq!(s.quantile(0.9), Duration::from_micros(91));
        assert_eq!(fmt(Duration::from_micros(1500)), "1.50 ms");
        assert_eq!(Samples::default().len(), 0);
    }
}
