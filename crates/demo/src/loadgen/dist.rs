//! [`LengthDist`]: seeded token-length distributions for prompts and outputs.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, LogNormal};

/// A token-length distribution: `fixed:N`, or `lognormal:MEDIAN:SIGMA[:MAX]` (log-normal with
/// that median and shape, rounded, clamped to 1..=MAX; MAX defaults to 8 × median).
#[derive(Clone, Debug, PartialEq)]
pub enum LengthDist {
    /// Always `N` tokens.
    Fixed(u32),
    /// Log-normal.
    LogNormal {
        /// Median length.
        median: f64,
        /// σ of the underlying normal.
        sigma: f64,
        /// Largest length drawn.
        max: u32,
    },
}

impl LengthDist {
    /// Draws one length (≥ 1).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        match *self {
            LengthDist::Fixed(n) => n.max(1),
            LengthDist::LogNormal { median, sigma, max } => {
                match LogNormal::new(median.ln(), sigma) {
                    Ok(d) => {
                        let x: f64 = d.sample(rng);
                        x.round().clamp(1.0, f64::from(max.max(1))) as u32
                    }
                    Err(_) => median.round().clamp(1.0, f64::from(max.max(1))) as u32,
                }
            }
        }
    }
}

impl FromStr for LengthDist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |p: &str, what: &str| -> Result<f64, String> {
            p.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("{what} `{p}` in `{s}` is not a non-negative number"))
        };
        match parts.as_slice() {
            ["fixed", n] => {
                let n = num(n, "length")?;
                Ok(LengthDist::Fixed((n as u32).max(1)))
            }
            ["lognormal", median, sigma, rest @ ..] if rest.len() <= 1 => {
                let median = num(median, "median")?.max(1.0);
                let sigma = num(sigma, "sigma")?;
                let max = match rest.first() {
                    Some(m) => num(m, "max")? as u32,
                    None => (median * 8.0).min(f64::from(u32::MAX)) as u32,
                };
                Ok(LengthDist::LogNormal { median, sigma, max })
            }
            _ => Err(format!(
                "`{s}` is not a length distribution: use `fixed:N` or `lognormal:MEDIAN:SIGMA[:MAX]`"
            )),
        }
    }
}

impl fmt::Display for LengthDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LengthDist::Fixed(n) => write!(f, "fixed:{n}"),
            LengthDist::LogNormal { median, sigma, max } => {
                write!(f, "lognormal:{median}:{sigma}:{max}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn parses_and_prints() {
        assert_eq!(
            "fixed:12".parse::<LengthDist>().unwrap(),
            LengthDist::Fixed(12)
        );
        let d: LengthDist = "lognormal:100:0.5".parse().unwrap();
        assert_eq!(
            d,
            LengthDist::LogNormal {
                median: 100.0,
                sigma: 0.5,
                max: 800
            }
        );
        assert_eq!(d.to_string().parse::<LengthDist>().unwrap(), d);
        assert!("gauss:1".parse::<LengthDist>().is_err());
        assert!("lognormal:x:1".parse::<LengthDist>().is_err());
    }

    #[test]
    fn lognormal_median_and_cap() {
        let d: LengthDist = "lognormal:100:0.8:300".parse().unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let mut xs: Vec<u32> = (0..4001).map(|_| d.sample(&mut rng)).collect();
        xs.sort_unstable();
        let median = xs[2000];
        assert!((90..=110).contains(&median), "median {median}");
        assert!(xs.iter().all(|x| (1..=300).contains(x)));
        assert_eq!(
            *xs.last().unwrap(),
            300,
            "p99.9 of σ=0.8 exceeds 3 × median: capped"
        );
    }
}
