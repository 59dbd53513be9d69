use std::fmt;
use std::str::FromStr;

use crate::{
    Concurrency, Decision, FixedWindow, Gcra, HitCounter, LeakyBucket, LeakyBucketShaping, Nanos,
    Quota, SlidingCounter, SlidingLog, TokenBucket,
};

/// One rate limiting algorithm as a pure state machine.
///
/// `step` decides whether `cost` units may pass at `now` and, only when they may
/// (and the cost is not zero), records them in `state`. A deny, or a read (cost
/// zero), leaves the state exactly as it was, so it writes nothing; the one
/// exception is an algorithm that [counts denied hits](StateMachine::COUNTS_DENIED).
pub trait StateMachine {
    /// What one key remembers. `Default` is a key that has never been seen.
    type State: Default + Clone + Send + 'static;

    /// Whether a deny of a non-zero cost writes the state too ([`HitCounter`]).
    /// Stores keep that write for a limit checked alone. Beside other limits a
    /// request is charged all or nothing, so there a hit counter is stepped as
    /// the [`FixedWindow`] it otherwise is.
    const COUNTS_DENIED: bool = false;

    /// Decides one request of `cost` units at time `now` (nanoseconds).
    fn step(&self, quota: &Quota, state: &mut Self::State, now: Nanos, cost: u64) -> Decision;
}

/// An algorithm named as data, so that a limit can be stored in config, sent to
/// Redis or written in a trace without closures.
///
/// Deliberately exhaustive: a new algorithm must be taught to every store, and
/// the compiler should say where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Token bucket: tokens refill at `limit / period` up to `burst`.
    TokenBucket,
    /// Generic cell rate algorithm: one timestamp per key, the token bucket's admissions.
    Gcra,
    /// Leaky bucket as a meter (policing): rejects at once what would overflow.
    LeakyBucket,
    /// Leaky bucket as a queue (shaping): admits with a delay so output leaves at the
    /// drain rate; the first `delay_after` units of excess pass without delay.
    LeakyBucketShaping {
        /// Excess units forwarded at once before shaping starts (NGINX's `delay=`).
        delay_after: u64,
    },
    /// Fixed window aligned to multiples of the period.
    FixedWindow,
    /// Fixed window that counts denied hits too: envoyproxy/ratelimit's counter.
    HitCounter,
    /// Exact sliding window log.
    SlidingLog,
    /// Sliding window counter: Cloudflare's weighted two-window estimate.
    SlidingCounter,
    /// Concurrency (in-flight) limiter: `limit` permits, released when requests end.
    Concurrency,
}

impl Algorithm {
    /// Every rate algorithm that a trace can be replayed through (all but the
    /// concurrency limiter, which needs request ends), shaping with full shaping.
    pub const RATE: [Algorithm; 8] = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::LeakyBucketShaping { delay_after: 0 },
        Algorithm::FixedWindow,
        Algorithm::HitCounter,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
    ];

    /// How many algorithms there are: [`Algorithm::index`] is below it.
    pub const COUNT: usize = 9;

    /// The algorithm's number, from 0 to [`Algorithm::COUNT`] − 1 (shaping's
    /// `delay_after` aside). The numbers are fixed: the Redis store's script
    /// reads them, and the memory store keys each algorithm's state apart by
    /// them.
    pub fn index(&self) -> u8 {
        match self {
            Algorithm::TokenBucket => 0,
            Algorithm::Gcra => 1,
            Algorithm::LeakyBucket => 2,
            Algorithm::LeakyBucketShaping { .. } => 3,
            Algorithm::FixedWindow => 4,
            Algorithm::SlidingLog => 5,
            Algorithm::SlidingCounter => 6,
            Algorithm::Concurrency => 7,
            Algorithm::HitCounter => 8,
        }
    }

    /// The algorithm's name on the command line and in config files.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::LeakyBucket => "leaky-bucket",
            Algorithm::LeakyBucketShaping { .. } => "leaky-bucket-shaping",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::HitCounter => "hit-counter",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingCounter => "sliding-counter",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Whether a deny of this algorithm writes its state
    /// ([`StateMachine::COUNTS_DENIED`]).
    pub fn counts_denied(&self) -> bool {
        struct CountsDenied;
        impl Visitor for CountsDenied {
            type Output = bool;
            fn visit<M: StateMachine>(self, _: M) -> bool {
                M::COUNTS_DENIED
            }
        }
        self.visit(CountsDenied)
    }

    /// Runs `f` with this algorithm's state machine, so that generic code (a
    /// store, a simulator) is written once for every algorithm.
    pub fn visit<V: Visitor>(&self, visitor: V) -> V::Output {
        match *self {
            Algorithm::TokenBucket => visitor.visit(TokenBucket),
            Algorithm::Gcra => visitor.visit(Gcra),
            Algorithm::LeakyBucket => visitor.visit(LeakyBucket),
            Algorithm::LeakyBucketShaping { delay_after } => {
                visitor.visit(LeakyBucketShaping { delay_after })
            }
            Algorithm::FixedWindow => visitor.visit(FixedWindow),
            Algorithm::HitCounter => visitor.visit(HitCounter),
            Algorithm::SlidingLog => visitor.visit(SlidingLog),
            Algorithm::SlidingCounter => visitor.visit(SlidingCounter),
            Algorithm::Concurrency => visitor.visit(Concurrency::default()),
        }
    }
}

/// Code that is generic over the state machine of an [`Algorithm`]; see [`Algorithm::visit`].
pub trait Visitor {
    /// What the visit returns.
    type Output;
    /// Called with the algorithm's state machine.
    fn visit<M: StateMachine>(self, machine: M) -> Self::Output;
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that Tollgate does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown algorithm {name:?}; expected one of token-bucket, gcra, leaky-bucket, leaky-bucket-shaping, fixed-window, hit-counter, sliding-log, sliding-counter, concurrency"
)]
pub struct ParseAlgorithmError {
    /// The name that was given.
    pub name: String,
}

impl FromStr for Algorithm {
    type Err = ParseAlgorithmError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "token-bucket" => Algorithm::TokenBucket,
            "gcra" => Algorithm::Gcra,
            "leaky-bucket" => Algorithm::LeakyBucket,
            "leaky-bucket-shaping" => Algorithm::LeakyBucketShaping { delay_after: 0 },
            "fixed-window" => Algorithm::FixedWindow,
            "hit-counter" => Algorithm::HitCounter,
            "sliding-log" => Algorithm::SlidingLog,
            "sliding-counter" => Algorithm::SlidingCounter,
            "concurrency" => Algorithm::Concurrency,
            _ => {
                return Err(ParseAlgorithmError { name: s.to_owned() });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algorithm::RATE.into_iter().chain([Algorithm::Concurrency]) {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
        assert!("leaky".parse::<Algorithm>().is_err());
    }

    #[test]
    fn every_algorithm_has_a_number_of_its_own_below_the_count() {
        let mut seen = [false; Algorithm::COUNT];
        for a in Algorithm::RATE.into_iter().chain([Algorithm::Concurrency]) {
            let index = usize::from(a.index());
            assert!(index < Algorithm::COUNT, "{a:?}");
            assert!(!std::mem::replace(&mut seen[index], true), "{a:?}");
        }
        assert!(seen.iter().all(|&s| s), "COUNT is the number of algorithms");
    }
}
