//! [`LengthDist`]: seeded token-length distributions for prompts and outputs.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, LogNormal};

/// A token-length distribution: `fixed:N`, `lognormal:MEDIAN:SIGMA[:MAX]` (log-normal with
/// that median and shape, rounded, clamped to 1..=MAX; MAX defaults to 8 × median), or
/// `mix:SHARE:LONG:BASE` (`LONG` tokens with probability `SHARE`, else drawn from the
/// distribution `BASE`: chat traffic with an occasional whole document).
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
    /// `long` tokens with probability `share`, else drawn from `base`.
    Mix {
        /// Probability of a long request, in [0, 1].
        share: f64,
        /// Length of a long request.
        long: u32,
        /// Distribution of the others.
        base: Box<LengthDist>,
    },
}

impl LengthDist {
    /// Draws one length (≥ 1).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        match self {
            LengthDist::Fixed(n) => (*n).max(1),
            LengthDist::Mix { share, long, base } => {
                if rng.random::<f64>() < *share {
                    (*long).max(1)
                } else {
                    base.sample(rng)
                }
            }
            &LengthDist::LogNormal { median, sigma, max } => {
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
        // A length in tokens: at least one.
        let tokens = |p: &str, what: &str| -> Result<f64, String> {
            let n = num(p, what)?;
            if n < 1.0 {
                return Err(format!("{what} `{p}` in `{s}` is below 1 token"));
            }
            Ok(n)
        };
        match parts.as_slice() {
            ["fixed", n] => Ok(LengthDist::Fixed(tokens(n, "length")? as u32)),
            ["lognormal", median, sigma, rest @ ..] if rest.len() <= 1 => {
                let median = tokens(median, "median")?;
                let sigma = num(sigma, "sigma")?;
                let max = match rest.first() {
                    Some(m) => tokens(m, "max")? as u32,
                    None => (median * 8.0).min(f64::from(u32::MAX)) as u32,
                };
                Ok(LengthDist::LogNormal { median, sigma, max })
            }
            ["mix", share, long, base @ ..] if !base.is_empty() => {
                let share = num(share, "share")?;
                if share > 1.0 {
                    return Err(format!("share `{share}` in `{s}` is above 1"));
                }
                let long = tokens(long, "long length")? as u32;
                let base = base.join(":").parse::<LengthDist>()?;
                Ok(LengthDist::Mix {
                    share,
                    long,
                    base: Box::new(base),
                })
            }
            _ => Err(format!(
                "`{s}` is not a length distribution: use `fixed:N`, `lognormal:MEDIAN:SIGMA[:MAX]` or `mix:SHARE:LONG:BASE`"
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
            LengthDist::Mix { share, long, base } => write!(f, "mix:{share}:{long}:{base}"),
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
        let m: LengthDist = "mix:0.25:20000:fixed:400".parse().unwrap();
        assert_eq!(
            m,
            LengthDist::Mix {
                share: 0.25,
                long: 20_000,
                base: Box::new(LengthDist::Fixed(400))
            }
        );
        assert_eq!(m.to_string().parse::<LengthDist>().unwrap(), m);
        assert!("mix:1.5:10:fixed:1".parse::<LengthDist>().is_err());
        assert!(
            "fixed:0"
                .parse::<LengthDist>()
                .unwrap_err()
                .contains("below 1")
        );
        assert!("mix:0.5:10".parse::<LengthDist>().is_err());
        assert!("lognormal:x:1".parse::<LengthDist>().is_err());
    }

    #[test]
    fn mix_draws_the_long_length_at_its_share() {
        let d: LengthDist = "mix:0.2:9999:fixed:10".parse().unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let long = (0..10_000)
            .map(|_| d.sample(&mut rng))
            .filter(|n| {
                assert!(*n == 9999 || *n == 10);
                *n == 9999
            })
            .count();
        // Binomial(10 000, 0.2): σ = 40.
        assert!((1800..=2200).contains(&long), "{long}");
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
