//! A lone bucket check with the module loaded: the module's command for its
//! algorithm (`TOLLGATE.GCRA`, `TOLLGATE.TOKENBUCKET`,
//! `TOLLGATE.LEAKYBUCKET`) with plain arguments, not `TOLLGATE.CHECK`.
//!
//! A call carrying one check of one limit has no batch to share its cost
//! over, and there `TOLLGATE.CHECK`'s packed request (its 72 bytes decoded,
//! its buffers, its packed reply) cost Redis about a third more per
//! decision than `CL.THROTTLE` at one caller, where the single-key command
//! costs about as much (docs/redis.md, *The module against `CL.THROTTLE`*).
//! Both step the same state with the same code, so the choice changes no
//! decision and no stored byte.

use tollgate_core::Algorithm;

use crate::script::Params;

/// One check of one bucket limit, as its own module command takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lone {
    command: &'static str,
    emission_us: u64,
    burst: u64,
    cost: u64,
    /// The injected clock's time (µs); `None`: Redis's.
    now_us: Option<u64>,
}

impl Lone {
    /// The direct command for a request of exactly these limits at
    /// `now_us`: `Some` only for one limit whose algorithm has its own
    /// command; every other request goes to `TOLLGATE.CHECK` (or the code).
    pub(crate) fn of<'a>(
        now_us: Option<u64>,
        mut limits: impl Iterator<Item = &'a Params>,
    ) -> Option<Self> {
        let (Some(p), None) = (limits.next(), limits.next()) else {
            return None;
        };
        let command = [
            (Algorithm::TokenBucket, "TOLLGATE.TOKENBUCKET"),
            (Algorithm::Gcra, "TOLLGATE.GCRA"),
            (Algorithm::LeakyBucket, "TOLLGATE.LEAKYBUCKET"),
        ]
        .into_iter()
        .find_map(|(algorithm, command)| (algorithm.index() == p.code).then_some(command))?;
        Some(Self {
            command,
            emission_us: p.emission_us,
            burst: p.burst,
            cost: p.cost,
            now_us,
        })
    }

    /// The command for `key`, its TTLs padded by `extra_ms`. The quota goes
    /// as one unit per emission interval: a bucket's step reads only the
    /// interval and the burst, and the module takes this interval as it is
    /// (already whole µs), where a limit and period would be divided again.
    /// The defaults (cost 1, Redis's clock, no padding) are left out.
    pub(crate) fn command(&self, key: &str, extra_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd(self.command);
        cmd.arg(key)
            .arg(1)
            .arg(format!("{}us", self.emission_us))
            .arg(self.burst);
        if self.cost != 1 {
            cmd.arg(self.cost);
        }
        if let Some(us) = self.now_us {
            cmd.arg("AT").arg(us);
        }
        if extra_ms > 0 {
            cmd.arg("PAD").arg(extra_ms);
        }
        cmd
    }
}

/// The command's answer (allowed, remaining, reset after, retry after or
/// -1, the time) as the code's reply to a request of one limit: its time,
/// whether all admitted, then the limit's allowed, remaining, reset after,
/// retry after and delay (none for these buckets). An answer of another
/// shape is passed on as it is, for the reply's parser to refuse.
pub(crate) fn reply(answer: Vec<i64>) -> Vec<i64> {
    match answer[..] {
        [allowed, remaining, reset, retry, at] => {
            vec![at, allowed, allowed, remaining, reset, retry, 0]
        }
        _ => answer,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{FailurePolicy, Limit, Quota};

    use super::*;

    fn params(algorithm: Algorithm, cost: u64) -> Params {
        let quota = Quota::per_second(3).unwrap().with_burst(5).unwrap();
        let limit = Limit {
            key: "k",
            quota,
            algorithm,
            cost,
            failure: FailurePolicy::Local,
        };
        Params::new(&limit, true).unwrap()
    }

    fn args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8(b.to_vec()).unwrap(),
                other => panic!("not a plain argument: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn one_bucket_limit_goes_to_its_own_command() {
        let cases = [
            (Algorithm::TokenBucket, "TOLLGATE.TOKENBUCKET"),
            (Algorithm::Gcra, "TOLLGATE.GCRA"),
            (Algorithm::LeakyBucket, "TOLLGATE.LEAKYBUCKET"),
        ];
        for (algorithm, command) in cases {
            let p = params(algorithm, 1);
            let lone = Lone::of(None, [p].iter()).expect("a lone bucket");
            // 3 per second: 333,334 µs a unit, sent as it is.
            assert_eq!(
                args(&lone.command("tg:x:{a}", 0)),
                [command, "tg:x:{a}", "1", "333334us", "5"]
            );
        }
    }

    #[test]
    fn costs_clocks_and_padding_are_sent_only_when_not_the_defaults() {
        let p = params(Algorithm::Gcra, 2);
        let lone = Lone::of(Some(1_700_000_000_000_000), [p].iter()).unwrap();
        assert_eq!(
            args(&lone.command("k", 7)),
            [
                "TOLLGATE.GCRA",
                "k",
                "1",
                "333334us",
                "5",
                "2",
                "AT",
                "1700000000000000",
                "PAD",
                "7"
            ]
        );
        let read = Lone::of(None, [params(Algorithm::Gcra, 0)].iter()).unwrap();
        assert_eq!(args(&read.command("k", 0))[5..], ["0"]);
    }

    #[test]
    fn other_requests_stay_with_the_batch_command() {
        let gcra = params(Algorithm::Gcra, 1);
        assert_eq!(Lone::of(None, [gcra, gcra].iter()), None, "two limits");
        assert_eq!(Lone::of(None, std::iter::empty()), None);
        for algorithm in [
            Algorithm::LeakyBucketShaping { delay_after: 1 },
            Algorithm::FixedWindow,
            Algorithm::HitCounter,
            Algorithm::SlidingCounter,
            Algorithm::SlidingLog,
            Algorithm::Concurrency,
        ] {
            let p = params(algorithm, 1);
            assert_eq!(Lone::of(None, [p].iter()), None, "{algorithm:?}");
        }
        // The quota the module rebuilds from "1 <interval>us" is the
        // store's own interval, whatever the limit and period.
        let odd = Quota::new(7, Duration::from_nanos(1_000_000_001)).unwrap();
        let limit = Limit {
            key: "k",
            quota: odd,
            algorithm: Algorithm::Gcra,
            cost: 1,
            failure: FailurePolicy::Local,
        };
        let p = Params::new(&limit, true).unwrap();
        let lone = Lone::of(None, [p].iter()).unwrap();
        assert_eq!(args(&lone.command("k", 0))[3], "142858us");
    }

    #[test]
    fn the_answer_becomes_the_codes_reply() {
        assert_eq!(
            reply(vec![0, 3, 500, 250, 1_000_000]),
            [1_000_000, 0, 0, 3, 500, 250, 0]
        );
        assert_eq!(reply(vec![1, 2]), [1, 2], "passed on for the parser");
    }
}
