//! The memory store's GCRA keys, in hot slots or in the table, decide exactly
//! as GCRA on a plain map does: random single and multi-limit checks, resets,
//! sweeps and time passing, on more keys than a shard has hot slots, so that
//! keys move between the slots and the table. Time comes from a manual clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate_core::{Algorithm, Decision, Gcra, Limit, ManualClock, Quota, StateMachine, Tat};
use tollgate_store::{MemoryConfig, MemoryStore};

/// More than the 4 hot slots of the store's one shard.
const KEYS: [&str; 9] = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];

#[derive(Debug, Clone)]
enum Op {
    Check {
        key: usize,
        cost: u64,
    },
    /// Two limits of one request, all or nothing.
    Both {
        first: usize,
        second: usize,
        cost: u64,
    },
    Reset {
        key: usize,
    },
    Advance {
        ms: u64,
    },
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        4 => (key.clone(), 0..3u64).prop_map(|(key, cost)| Op::Check { key, cost }),
        2 => (key.clone(), key.clone(), 0..3u64)
            .prop_map(|(first, second, cost)| Op::Both { first, second, cost }),
        1 => key.prop_map(|key| Op::Reset { key }),
        2 => (0..400u64).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Sweep),
    ]
}

/// GCRA on a plain map, with the store's rules for a request of several
/// limits: each is stepped in order on what the earlier ones wrote; once one
/// denies, the rest are only asked, and nothing is written.
#[derive(Default)]
struct Model {
    tats: HashMap<usize, Tat>,
}

impl Model {
    fn check(&mut self, keys: &[usize], quota: &Quota, now: u64, cost: u64) -> Vec<Decision> {
        let mut working = self.tats.clone();
        let mut denied = false;
        let decisions = keys
            .iter()
            .map(|key| {
                let state = working.entry(*key).or_default();
                let decision = if denied {
                    Gcra.step(quota, &mut state.clone(), now, cost)
                } else {
                    Gcra.step(quota, state, now, cost)
                };
                denied |= !decision.allowed();
                decision
            })
            .collect();
        if !denied {
            self.tats = working;
        }
        decisions
    }
}

proptest! {
    // Failing cases are saved beside the manifest, as tollgate-core's are.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/hot_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn hot_and_table_keys_decide_as_gcra_on_a_map(ops in proptest::collection::vec(op(), 1..120)) {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let store = MemoryStore::with_clock(
            MemoryConfig {
                max_keys: 64,
                shards: 1,
                sweep_interval: Duration::from_millis(250),
            },
            Arc::clone(&clock),
        );
        let quota = Quota::per_second(4).unwrap().with_burst(3).unwrap();
        let limit = |key: usize, cost: u64| Limit::new(KEYS[key], quota, Algorithm::Gcra).with_cost(cost);
        let mut model = Model::default();
        let mut now = 1_000_000_000;
        for op in ops {
            match op {
                Op::Check { key, cost } => {
                    let got = store.check_now(&[limit(key, cost)]).decisions.to_vec();
                    prop_assert_eq!(got, model.check(&[key], &quota, now, cost), "{:?}", op);
                }
                Op::Both { first, second, cost } => {
                    let got = store
                        .check_now(&[limit(first, cost), limit(second, cost)])
                        .decisions
                        .to_vec();
                    let want = model.check(&[first, second], &quota, now, cost);
                    prop_assert_eq!(got, want, "{:?}", op);
                }
                Op::Reset { key } => {
                    store.reset_now(&[limit(key, 1)]);
                    model.tats.remove(&key);
                }
                Op::Advance { ms } => {
                    clock.advance(Duration::from_millis(ms));
                    now += ms * 1_000_000;
                }
                Op::Sweep => store.sweep(),
            }
        }
    }
}
