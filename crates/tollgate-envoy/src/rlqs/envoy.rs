//! One Envoy's bucket as Envoy 1.40's quota filter keeps it, for the fleet's
//! tests and the simulator (`tollgate simulate --instances`): the other end
//! of [`Fleet::report`](super::Fleet::report), so that the share-out can be
//! checked against the way Envoy applies it rather than against itself.

use tollgate_core::Nanos;

use super::fleet::{Answer, Grant, Usage};

const SECOND: f64 = 1_000_000_000.0;

/// One bucket of one Envoy: a grant equal to the one in force keeps its
/// tokens; a token bucket replacing a token bucket keeps its fill ratio,
/// unless the answer is [`Answer::fresh`]; any other starts full. Before the
/// first grant everything is admitted (`no_assignment_behavior:
/// ALLOW_ALL`). Expiry is not modelled: the caller applies answers before
/// their time to live runs out.
#[derive(Debug, Default)]
pub struct EnvoyBucket {
    grant: Option<Grant>,
    tokens: f64,
    last: Nanos,
    allowed: u64,
    denied: u64,
}

/// What [`EnvoyBucket::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Whether the request passed.
    pub admitted: bool,
    /// Whether it passed with no grant yet in force.
    pub before_grant: bool,
}

impl EnvoyBucket {
    /// The grant in force, if any arrived.
    pub fn grant(&self) -> Option<Grant> {
        self.grant
    }

    /// Applies `answer`, received at `now`.
    pub fn apply(&mut self, answer: Answer, now: Nanos) {
        self.refill(now);
        let grant = answer.grant;
        if self.grant == Some(grant) {
            return;
        }
        let new = f64::from(tokens(grant));
        self.tokens = match self.grant {
            Some(Grant::Tokens(old)) if !answer.fresh => {
                new * (self.tokens / f64::from(old.max_tokens))
            }
            _ => new,
        };
        self.grant = Some(grant);
    }

    fn refill(&mut self, now: Nanos) {
        if let Some(Grant::Tokens(t)) = self.grant {
            let rate = f64::from(t.tokens_per_fill) / t.fill_secs.max(1) as f64;
            let elapsed = now.saturating_sub(self.last) as f64 / SECOND;
            self.tokens = (self.tokens + rate * elapsed).min(f64::from(t.max_tokens));
        }
        self.last = now;
    }

    /// Decides a request at `now` and counts it for the next report.
    pub fn admit(&mut self, now: Nanos) -> Admission {
        self.refill(now);
        let admitted = match self.grant {
            None => true,
            Some(Grant::DenyAll) => false,
            Some(Grant::Tokens(_)) if self.tokens >= 1.0 => {
                self.tokens -= 1.0;
                true
            }
            Some(Grant::Tokens(_)) => false,
        };
        if admitted {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
        Admission {
            admitted,
            before_grant: self.grant.is_none(),
        }
    }

    /// What the next report carries, without taking it.
    pub fn unreported(&self) -> Usage {
        Usage {
            allowed: self.allowed,
            denied: self.denied,
        }
    }

    /// What the next report carries: the requests since the last one.
    pub fn take_usage(&mut self) -> Usage {
        let usage = self.unreported();
        self.allowed = 0;
        self.denied = 0;
        usage
    }
}

fn tokens(grant: Grant) -> u32 {
    match grant {
        Grant::Tokens(t) => t.max_tokens,
        Grant::DenyAll => 0,
    }
}
