//! What the gRPC door does when more calls come than it can answer in time.
//!
//! To Envoy's rate limit filter a late answer is no answer: with
//! `failure_mode_deny: false` it admits the request. So a call that cannot be
//! checked in time is answered at once, while the caller still listens:
//!
//! - past the bound on calls in flight (over every connection: each
//!   connection's own is HTTP/2's concurrent streams), a new call is read but
//!   not checked;
//! - a call first reached past three quarters of its deadline (it queued
//!   behind others) is not checked either: the last quarter is the answer's
//!   way back. Past the whole deadline nobody listens, and it gets
//!   `DEADLINE_EXCEEDED`.
//!
//! Such a call is answered what is known without the store
//! (`Enforcer::enforce_known`: a key the deny cache knows is over gets its
//! full `OVER_LIMIT` answer, a request with nothing to count its `OK`), and
//! otherwise the configured [`OverloadAnswer`].

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What an overloaded gRPC door answers a call it cannot check in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverloadAnswer {
    /// `OVER_LIMIT`: Envoy denies the request (429). Limits hold at the
    /// peak, at the price of denying some requests that were within them.
    #[default]
    OverLimit,
    /// `UNAVAILABLE`: Envoy decides by its `failure_mode_deny` (admits, by
    /// default: limits do not hold while the door is overloaded).
    Unavailable,
}

impl OverloadAnswer {
    /// The name flags use: `over_limit` or `unavailable`.
    pub fn name(self) -> &'static str {
        match self {
            OverloadAnswer::OverLimit => "over_limit",
            OverloadAnswer::Unavailable => "unavailable",
        }
    }
}

impl FromStr for OverloadAnswer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "over_limit" => Ok(OverloadAnswer::OverLimit),
            "unavailable" => Ok(OverloadAnswer::Unavailable),
            _ => Err(format!(
                "unknown overload answer {s:?}; expected over_limit or unavailable"
            )),
        }
    }
}

/// The gRPC door's bound on calls in flight and its answer past it; see the
/// module documentation.
#[derive(Debug)]
pub struct Overload {
    answer: OverloadAnswer,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    shed: AtomicU64,
}

impl Overload {
    /// At most `max_in_flight` calls (at least 1) checked at once; what
    /// cannot be checked in time is answered `answer`.
    pub fn new(answer: OverloadAnswer, max_in_flight: usize) -> Self {
        Self {
            answer,
            max_in_flight: max_in_flight.max(1),
            in_flight: AtomicUsize::new(0),
            shed: AtomicU64::new(0),
        }
    }

    /// Calls answered with the overload answer since start.
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// A place among the calls in flight, if one is free.
    pub(crate) fn enter(self: &Arc<Self>) -> Option<InFlight> {
        let taken = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let place = InFlight(Arc::clone(self));
        (taken < self.max_in_flight).then_some(place)
    }

    /// The overload answer, counted.
    pub(crate) fn answer(&self) -> OverloadAnswer {
        self.shed.fetch_add(1, Ordering::Relaxed);
        self.answer
    }
}

/// A call's place among those in flight, given back when dropped.
pub(crate) struct InFlight(Arc<Overload>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_given_back() {
        let overload = Arc::new(Overload::new(OverloadAnswer::OverLimit, 2));
        let a = overload.enter().expect("a first place");
        let b = overload.enter().expect("a second place");
        assert!(overload.enter().is_none(), "past the bound");
        drop(a);
        assert!(overload.enter().is_some(), "a place came back");
        drop(b);
        assert_eq!(overload.in_flight.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn answers_parse_by_name() {
        for answer in [OverloadAnswer::OverLimit, OverloadAnswer::Unavailable] {
            assert_eq!(answer.name().parse(), Ok(answer));
        }
        assert!("deny".parse::<OverloadAnswer>().is_err());
    }
}
