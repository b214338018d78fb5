//! Rails (seed 002's subchannels): what a connection's queue pairs run on, and how
//! large transfers are striped across them. The value types [`RailSpec`] and
//! [`StripePolicy`], and their parsers for `RCH_RAILS` and `RCH_STRIPE`.
//!
//! A connection has one rail unless asked: rail 0 carries the ring, its control
//! words and every small message (the paper's *binding*, so FIFO order needs no
//! reordering), and a zero-copy step of at least
//! [`Config::stripe_min`](crate::Config::stripe_min) bytes is read in stripes, one
//! per rail, sized by the policy's weights.

use std::fmt;
use std::io;
use std::str::FromStr;

/// Most rails a connection may have.
pub const MAX_RAILS: usize = 8;

/// One rail: where its queue pair runs.
///
/// Written `[device[:port]][@rate[/link]]` (`RCH_RAILS` is a comma-separated
/// list of them; a plain number `n` stands for `n` rails on the connection's own
/// device):
/// * `device[:port]` (verbs): the RDMA device and port of the rail's queue pair;
///   empty means the connection's own (several queue pairs on one port).
/// * `@rate` (emulated fabric, for tests and benchmarks): the rail moves at most
///   this many bytes a second (`k`, `m`, `g` suffixes, decimal: `100m` is 10^8).
/// * `/link` (with a rate): rails of this process naming the same link share its
///   rate, as connections through one port do (a competing flow); without it each
///   queue pair has its own.
///
/// ```
/// use rdma_channel::config::RailSpec;
/// let rails = RailSpec::parse_list("mlx5_0:1,mlx5_1")?;
/// assert_eq!(rails[0].device.as_deref(), Some("mlx5_0"));
/// assert_eq!((rails[0].port, rails[1].port), (Some(1), None));
/// let paced = RailSpec::parse_list("@400m,@100m/b")?;
/// assert_eq!(paced[1].rate, Some(100_000_000));
/// assert_eq!(paced[1].link.as_deref(), Some("b"));
/// assert_eq!(RailSpec::parse_list("3")?.len(), 3);
/// assert!(RailSpec::parse_list("mlx5_0:x").is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RailSpec {
    /// RDMA device of the rail (verbs); `None`: the connection's own.
    pub device: Option<String>,
    /// Port of that device; `None`: the default port.
    pub port: Option<u8>,
    /// Bytes a second the rail moves at most (emulated fabric only).
    pub rate: Option<u64>,
    /// Name of the emulated link whose rate the rail shares with every rail of this
    /// process that names it.
    pub link: Option<String>,
}

impl RailSpec {
    /// True for a rail with nothing to choose: a queue pair like rail 0's.
    pub fn is_plain(&self) -> bool {
        self == &RailSpec::default()
    }

    /// Parses a comma-separated list of rails, or a number of plain rails.
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the part that is malformed, or a list of more than
    /// [`MAX_RAILS`] or fewer than 1.
    pub fn parse_list(s: &str) -> io::Result<Vec<RailSpec>> {
        let s = s.trim();
        let rails = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            let n: usize = s.parse().map_err(|_| bad(format!("{s:?}: not a count")))?;
            vec![RailSpec::default(); n]
        } else {
            s.split(',')
                .map(|part| part.trim().parse())
                .collect::<io::Result<Vec<RailSpec>>>()?
        };
        check_count(rails.len())?;
        Ok(rails)
    }
}

fn check_count(n: usize) -> io::Result<()> {
    if !(1..=MAX_RAILS).contains(&n) {
        return Err(bad(format!("{n} rails: from 1 to {MAX_RAILS}")));
    }
    Ok(())
}

impl FromStr for RailSpec {
    type Err = io::Error;

    fn from_str(part: &str) -> io::Result<RailSpec> {
        let (place, pace) = match part.split_once('@') {
            Some((p, r)) => (p, Some(r)),
            None => (part, None),
        };
        let mut spec = RailSpec::default();
        if !place.is_empty() {
            let (dev, port) = match place.split_once(':') {
                Some((d, p)) => {
                    let port =
                        p.parse::<u8>().ok().filter(|&p| p >= 1).ok_or_else(|| {
                            bad(format!("rail {part:?}: port {p:?} is not 1-255"))
                        })?;
                    (d, Some(port))
                }
                None => (place, None),
            };
            if dev.is_empty() || !dev.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!("rail {part:?}: no device name")));
            }
            spec.device = Some(dev.to_string());
            spec.port = port;
        }
        if let Some(pace) = pace {
            let (rate, link) = match pace.split_once('/') {
                Some((r, l)) if !l.is_empty() => (r, Some(l.to_string())),
                Some(_) => return Err(bad(format!("rail {part:?}: empty link name"))),
                None => (pace, None),
            };
            let rate = parse_rate(rate).map_err(|e| bad(format!("rail {part:?}: {e}")))?;
            spec.rate = Some(rate);
            spec.link = link;
        }
        Ok(spec)
    }
}

impl fmt::Display for RailSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(d) = &self.device {
            f.write_str(d)?;
            if let Some(p) = self.port {
                write!(f, ":{p}")?;
            }
        }
        if let Some(r) = self.rate {
            write!(f, "@{r}")?;
            if let Some(l) = &self.link {
                write!(f, "/{l}")?;
            }
        }
        Ok(())
    }
}

/// A rate in bytes a second: decimal, with `k`, `m`, `g` suffixes meaning 10^3,
/// 10^6, 10^9 (link speeds are decimal).
fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (digits, scale) = match t.as_bytes().last() {
        Some(b'k') => (&t[..t.len() - 1], 1_000),
        Some(b'm') => (&t[..t.len() - 1], 1_000_000),
        Some(b'g') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (&t[..], 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(scale))
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is not a rate in bytes a second (e.g. 100m)"))
}

/// How a striped step is split across the rails.
///
/// ```
/// use rdma_channel::config::StripePolicy;
/// assert_eq!("even".parse::<StripePolicy>()?, StripePolicy::Even);
/// assert_eq!("4:1".parse::<StripePolicy>()?, StripePolicy::Weights(vec![4, 1]));
/// assert_eq!("adaptive".parse::<StripePolicy>()?, StripePolicy::Adaptive { alpha_percent: 50 });
/// assert_eq!("adaptive:20".parse::<StripePolicy>()?, StripePolicy::Adaptive { alpha_percent: 20 });
/// assert!("4:x".parse::<StripePolicy>().is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StripePolicy {
    /// Seed 002's adaptive striping (its sec. 4.5, equation 4): from equal weights,
    /// after every striped step each rail's weight moves toward its share of the
    /// bandwidth the step measured (bytes over the time from posting its stripe to
    /// seeing it complete), by `alpha_percent` of the way (100: the step's
    /// figures alone, equation 3).
    Adaptive {
        /// The weight of the newest step's figures, 1 to 100.
        alpha_percent: u8,
    },
    /// Equal stripes.
    Even,
    /// Fixed weights, one per rail (a rail beyond the list gets weight 0 and only
    /// carries what rail 0 does: the ring).
    Weights(Vec<u32>),
}

/// Default [`StripePolicy::Adaptive`] `alpha_percent`: half the old weights kept,
/// so one noisy step moves a weight at most halfway.
pub const DEFAULT_ALPHA_PERCENT: u8 = 50;

impl Default for StripePolicy {
    fn default() -> Self {
        StripePolicy::Adaptive {
            alpha_percent: DEFAULT_ALPHA_PERCENT,
        }
    }
}

impl FromStr for StripePolicy {
    type Err = io::Error;

    fn from_str(s: &str) -> io::Result<StripePolicy> {
        let s = s.trim();
        let lower = s.to_ascii_lowercase();
        if lower == "even" {
            return Ok(StripePolicy::Even);
        }
        if lower == "adaptive" {
            return Ok(StripePolicy::default());
        }
        if let Some(a) = lower.strip_prefix("adaptive:") {
            return match a.parse::<u8>() {
                Ok(p) if (1..=100).contains(&p) => Ok(StripePolicy::Adaptive { alpha_percent: p }),
                _ => Err(bad(format!(
                    "stripe policy {s:?}: alpha {a:?} is not a percentage from 1 to 100"
                ))),
            };
        }
        let weights = s
            .split(':')
            .map(|w| w.trim().parse::<u32>())
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| {
                bad(format!(
                    "stripe policy {s:?}: expected adaptive, adaptive:<alpha>, even or weights like 4:1"
                ))
            })?;
        check_count(weights.len())?;
        if weights.iter().all(|&w| w == 0) {
            return Err(bad(format!("stripe policy {s:?}: every weight is 0")));
        }
        Ok(StripePolicy::Weights(weights))
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rail_lists_parse_and_refuse_what_they_should() {
        let r = RailSpec::parse_list(" rxe0:1 , rxe1:1 ").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].to_string(), "rxe1:1");
        let r = RailSpec::parse_list("@1g,@250M/x").unwrap();
        assert_eq!(r[0].rate, Some(1_000_000_000));
        assert_eq!(r[1].to_string(), "@250000000/x");
        assert!(r[0].link.is_none() && !r[0].is_plain());
        assert!(RailSpec::parse_list("2")
            .unwrap()
            .iter()
            .all(RailSpec::is_plain));
        for bad in [
            "0",
            "9",
            "@",
            "@0",
            "@-1",
            "a:0",
            ":1",
            "@1m/",
            "a,b,c,d,e,f,g,h,i",
        ] {
            let e = RailSpec::parse_list(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn stripe_policies_parse() {
        assert!("adaptive:0".parse::<StripePolicy>().is_err());
        assert!("adaptive:101".parse::<StripePolicy>().is_err());
        assert!("0:0".parse::<StripePolicy>().is_err());
        assert_eq!(
            "1:0:2".parse::<StripePolicy>().unwrap(),
            StripePolicy::Weights(vec![1, 0, 2])
        );
    }
}
