//! Score rounding and severity bands (FR-9.3–9.6).

use crate::Error;

/// How repetitive a session's window is. Ordered from healthy to looping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Normal,
    Warning,
    Loop,
}

/// The two band edges: LOOP below `loop_below`, WARNING below `warning_below`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub loop_below: f64,
    pub warning_below: f64,
}

impl Default for Thresholds {
    /// FR-9.4 and FR-9.5 defaults.
    fn default() -> Self {
        Self {
            loop_below: 0.25,
            warning_below: 0.50,
        }
    }
}

impl Thresholds {
    pub fn new(loop_below: f64, warning_below: f64) -> Result<Self, Error> {
        let valid = |t: f64| t.is_finite() && (0.0..=1.0).contains(&t);
        if valid(loop_below) && valid(warning_below) {
            Ok(Self {
                loop_below,
                warning_below,
            })
        } else {
            Err(Error::InvalidThreshold)
        }
    }

    /// LOOP is strictly below the loop edge (0.25 is WARNING), WARNING strictly below
    /// the warning edge (0.50 is Normal). LOOP is checked first, so a LOOP edge set
    /// above the WARNING edge still wins.
    pub fn classify(&self, score: f64) -> Severity {
        if score < self.loop_below {
            Severity::Loop
        } else if score < self.warning_below {
            Severity::Warning
        } else {
            Severity::Normal
        }
    }
}

/// Rounds to 4 decimal places, as FR-9.3 asks of the returned score.
pub fn round4(score: f64) -> f64 {
    (score * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fr_9_4_to_9_6_band_edges() {
        let t = Thresholds::default();
        assert_eq!(t.classify(0.2), Severity::Loop);
        assert_eq!(t.classify(0.25), Severity::Warning);
        assert_eq!(t.classify(0.4), Severity::Warning);
        assert_eq!(t.classify(0.5), Severity::Normal);
        assert_eq!(t.classify(1.0), Severity::Normal);
    }

    #[test]
    fn fr_9_11_a_raised_loop_edge_reclassifies() {
        let t = Thresholds::new(0.30, 0.50).unwrap();
        assert_eq!(t.classify(0.28), Severity::Loop);
    }

    #[test]
    fn invalid_thresholds_are_refused() {
        assert_eq!(Thresholds::new(f64::NAN, 0.5), Err(Error::InvalidThreshold));
        assert_eq!(Thresholds::new(0.25, 1.5), Err(Error::InvalidThreshold));
        assert_eq!(Thresholds::new(-0.1, 0.5), Err(Error::InvalidThreshold));
    }

    #[test]
    fn fr_9_3_rounds_to_four_places() {
        assert_eq!(round4(2.0 / 3.0), 0.6667);
        assert_eq!(round4(1.0 / 7.0), 0.1429);
        assert_eq!(round4(0.2), 0.2);
    }

    proptest! {
        #[test]
        fn severity_bands_partition_the_unit_interval(score in 0.0f64..=1.0, lo in 0.0f64..=1.0, hi in 0.0f64..=1.0) {
            let t = Thresholds::new(lo, hi).unwrap();
            let expected = if score < lo { Severity::Loop } else if score < hi { Severity::Warning } else { Severity::Normal };
            prop_assert_eq!(t.classify(score), expected);
        }

        #[test]
        fn rounding_moves_at_most_half_a_unit(score in 0.0f64..=1.0) {
            prop_assert!((round4(score) - score).abs() <= 0.00005 + 1e-12);
        }
    }
}
