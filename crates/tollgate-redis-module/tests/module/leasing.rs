//! Hybrid leasing through the module: `TOLLGATE.CHECK`'s op `h` (a check
//! leasing units to a hybrid instance) and op `r` with a holder (a give
//! back) answer and write every byte as the code's, alone and alternating
//! with it on the same keys, the lease records (hashes of sums) included;
//! a replica without the module gets every record; and hybrid instances
//! over a store with the module loaded decide as those over the code, with
//! no `FCALL` at all.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_store::conformance;
use tollgate_store::{Hybrid, HybridConfig};
use tollgate_testkit::{RedisCluster, RedisServer};

use crate::mixed::{call, function, request};
use crate::{module, server};

/// The algorithms hybrid mode leases.
const LEASED: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
];

/// A key's contents: a string's bytes, or a hash's fields and values
/// sorted; with its absolute expiry in ms (-1: none).
type Contents = (String, Vec<Vec<u8>>, i64);

/// Every key of `nodes` whose name starts with `prefix`, as (its name
/// without the prefix, its contents, its expiry), sorted by name.
async fn states(nodes: &[&RedisServer], prefix: &str) -> Vec<Contents> {
    let mut out = Vec::new();
    for node in nodes {
        let client = redis::Client::open(node.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        for key in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            let contents = match kind.as_str() {
                "hash" => {
                    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    fields.sort();
                    fields.into_iter().flat_map(|(f, v)| [f, v]).collect()
                }
                "string" => {
                    let v: Vec<u8> = redis::cmd("GET")
                        .arg(&key)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    vec![v]
                }
                other => panic!("{key}: a {other}"),
            };
            let expiry: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.push((format!("{kind} {}", &key[prefix.len()..]), contents, expiry));
        }
    }
    out.sort();
    out
}

/// Whether `x` holds the keys of `a`, with expiries set within `slack` ms.
fn assert_same_keys(x: &[Contents], a: &[Contents], slack: i64, what: &str) {
    let names = |s: &[Contents]| -> Vec<(String, Vec<Vec<u8>>)> {
        s.iter().map(|(n, c, _)| (n.clone(), c.clone())).collect()
    };
    assert_eq!(names(x), names(a), "{what}");
    for (x, a) in x.iter().zip(a) {
        assert_eq!(
            x.2 < 0,
            a.2 < 0,
            "{what}: {} has a TTL on one side only",
            a.0
        );
        assert!(
            (x.2 - a.2).abs() < slack,
            "{what}: expiries {} against {}",
            x.2,
            a.2
        );
    }
}

/// A leases argument: the holder, the records' ttl (µs), then per limit
/// the units released and leased (-1, -1: no record).
fn leases(holder: u64, ttl_us: u64, per_limit: &[(f64, f64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [holder as f64, ttl_us as f64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for (released, leased) in per_limit {
        out.extend_from_slice(&released.to_le_bytes());
        out.extend_from_slice(&leased.to_le_bytes());
    }
    out
}

/// A step of the fleet: after `advance` µs, a holder's leasing check of
/// `cost` that released `released` (beside a GCRA limit without a record
/// when `beside`), or (`give_back`) its give back of `cost` units.
struct Step {
    advance: u64,
    holder: u64,
    released: u64,
    cost: u64,
    beside: bool,
    give_back: bool,
}

const fn lease(advance: u64, holder: u64, released: u64, cost: u64) -> Step {
    Step {
        advance,
        holder,
        released,
        cost,
        beside: false,
        give_back: false,
    }
}

const fn back(holder: u64, cost: u64) -> Step {
    Step {
        give_back: true,
        ..lease(0, holder, 0, cost)
    }
}

/// 10 a second, burst 10; records last 200 ms past their latest lease.
const STEPS: [Step; 14] = [
    lease(0, 1, 0, 4),
    lease(1, 2, 0, 3),
    // Sums: holder 1 released 2 of its 4 and leases 2 more.
    lease(50_000, 1, 2, 2),
    // Above what is left: a deny, which records nothing, and holder 2's
    // record keeps its units.
    lease(0, 2, 0, 5),
    back(1, 1),
    Step {
        beside: true,
        ..lease(100_000, 3, 0, 2)
    },
    // Past holders 1's, 2's and 3's deadlines: this check credits their
    // units back first, and holder 3's record is made anew.
    lease(300_000, 3, 0, 1),
    // Holder 2 was credited: its late give back gives nothing.
    back(2, 2),
    // Holder 3 gives its one unit back: its record, the hash's last, goes.
    back(3, 1),
    lease(1, 4, 0, 0),
    lease(0, 4, 0, 11),
    lease(1_000_000, 4, 0, 3),
    lease(1, 5, 0, 2),
    Step {
        beside: true,
        ..lease(10, 4, 1, 1)
    },
];

/// Every leased algorithm through op `h` and op `r` with a holder, by the
/// code alone, alternating with the module, and by the module alone: the
/// same replies, and the same keys (states, records, TTLs).
async fn fleet(url: &str, node: &RedisServer, tag: &str) {
    let clock = conformance::clock();
    let function = function(url, node, &clock).await;
    let client = redis::Client::open(node.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let generous = [
        u64::from(Algorithm::Gcra.index()),
        1000,
        1_000_000,
        1000,
        1000,
        1,
        0,
    ];
    let ttl_us = 200_000;
    for algorithm in LEASED {
        let code = u64::from(algorithm.index());
        let limit = |cost| [code, 10, 1_000_000, 10, 100_000, cost, 0];
        let mut now = 1_800_000_000_000_000 + 250_000;
        let mut replies: [Vec<redis::Value>; 3] = Default::default();
        // "a": the code alone; "m": alternating; "n": the module alone.
        let prefixes = ["a", "m", "n"].map(|p| format!("{tag}{code}{p}:"));
        let mut hashes = 0;
        for (i, step) in STEPS.iter().enumerate() {
            now += step.advance;
            let (limits, names, grant) = if step.beside {
                (
                    vec![limit(step.cost), generous],
                    &["k", "g", "k.r"][..],
                    vec![(step.released as f64, step.cost as f64), (-1.0, -1.0)],
                )
            } else {
                (
                    vec![limit(step.cost)],
                    &["k", "k.r"][..],
                    vec![(step.released as f64, step.cost as f64)],
                )
            };
            let (op, grant) = if step.give_back {
                // A give back releases its units from the record.
                ("r", leases(step.holder, 0, &[(0.0, step.cost as f64)]))
            } else {
                ("h", leases(step.holder, ttl_us, &grant))
            };
            let args = [request(now, &limits, ""), grant];
            for (p, prefix) in prefixes.iter().enumerate() {
                let by_code = match p {
                    0 => true,
                    1 => i % 2 == 0,
                    _ => false,
                };
                let code = by_code.then_some(function.as_str());
                let keys: Vec<String> = names.iter().map(|k| format!("{prefix}{k}")).collect();
                replies[p].push(call(&mut conn, code, &keys, op, &args).await);
            }
            let a = states(&[node], &prefixes[0]).await;
            hashes += a.iter().filter(|k| k.0.starts_with("hash")).count();
            // Before: the code set a record's TTL before writing it, so the
            // hash its first record made had none, and lived forever.
            assert!(
                a.iter().all(|k| k.2 >= 0),
                "{algorithm:?}: step {i}: a key without a TTL: {a:?}"
            );
            for (p, what) in [(1, "alternating"), (2, "the module alone")] {
                let x = states(&[node], &prefixes[p]).await;
                assert_same_keys(&x, &a, 100, &format!("{algorithm:?}: step {i}: {what}"));
            }
        }
        assert!(hashes > 0, "{algorithm:?}: records were written");
        let [alone, mixed, native] = replies;
        assert_eq!(mixed, alone, "{algorithm:?}: alternating");
        assert_eq!(native, alone, "{algorithm:?}: the module alone");
        let allowed: Vec<bool> = alone
            .iter()
            .filter_map(|r| match r {
                redis::Value::BulkString(b) => {
                    Some(f64::from_le_bytes(b[8..16].try_into().unwrap()))
                }
                _ => None,
            })
            .map(|a| a == 1.0)
            .collect();
        // The sequence admits and denies, so the comparison means something.
        assert!(
            allowed.contains(&true) && allowed.contains(&false),
            "{allowed:?}"
        );
    }
}

#[tokio::test]
async fn hybrid_leasing_through_the_module_answers_and_writes_as_the_code() {
    let server = server();
    fleet(&server.url(), &server, "").await;
}

#[tokio::test]
async fn hybrid_leasing_through_the_module_answers_and_writes_as_the_code_on_a_cluster() {
    let (cluster, tag) = crate::cluster_and_tag();
    fleet(&cluster.url(), &cluster.nodes[0], &tag).await;
}

/// A replica without the module gets every record the module writes,
/// changes and removes, with its expiry, and the states they credit.
#[tokio::test]
async fn a_replica_gets_every_record_the_module_writes() {
    let (master, replica, mut conn) = crate::with_replica().await;
    let mut now = 1_800_000_000_000_000;
    for algorithm in LEASED {
        let code = u64::from(algorithm.index());
        let limit = |cost| [code, 10, 1_000_000, 10, 100_000, cost, 0];
        let keys: Vec<String> = ["k", "k.r"]
            .map(|k| format!("{}:{k}", algorithm.index()))
            .to_vec();
        for step in &STEPS[..9] {
            now += step.advance;
            let (op, grant) = if step.give_back {
                ("r", leases(step.holder, 0, &[(0.0, step.cost as f64)]))
            } else {
                let units = [(step.released as f64, step.cost as f64)];
                ("h", leases(step.holder, 200_000, &units))
            };
            let args = [request(now, &[limit(step.cost)], ""), grant];
            call(&mut conn, None, &keys, op, &args).await;
        }
        // A record left, for the replica to hold.
        now += 1;
        let args = [
            request(now, &[limit(1)], ""),
            leases(9, 200_000, &[(0.0, 1.0)]),
        ];
        call(&mut conn, None, &keys, "h", &args).await;
    }
    crate::caught_up(&master, &replica);
    let (copy, original) = (states(&[&replica], "").await, states(&[&master], "").await);
    assert_eq!(
        original.iter().filter(|k| k.0.starts_with("hash")).count(),
        LEASED.len(),
        "{original:?}"
    );
    assert_same_keys(&copy, &original, 50, "the replica");
}

/// Bad leasing calls are refused with why, and write nothing.
#[tokio::test]
async fn bad_leasing_calls_are_refused_with_nothing_written() {
    let server = server();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let gcra = [
        u64::from(Algorithm::Gcra.index()),
        10,
        1_000_000,
        10,
        100_000,
        1,
        0,
    ];
    let log = [
        u64::from(Algorithm::SlidingLog.index()),
        10,
        1_000_000,
        10,
        100_000,
        1,
        0,
    ];
    let now = 1_800_000_000_000_000;
    let one = request(now, &[gcra], "");
    let grant = leases(1, 1000, &[(0.0, 1.0)]);
    let keys = |k: &[&str]| k.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
    // The keys, the arguments after the op, and the error.
    type Case = (Vec<String>, Vec<Vec<u8>>, &'static str);
    let cases: [Case; 5] = [
        (
            keys(&["k", "k.r"]),
            vec![one.clone()],
            "h takes one request and its leases",
        ),
        (
            keys(&["k"]),
            vec![one.clone(), grant.clone()],
            "take 2 keys, got 1",
        ),
        (
            keys(&["k", "k.r"]),
            vec![one.clone(), leases(1 << 52, 1000, &[(0.0, 1.0)])],
            "holder",
        ),
        (
            keys(&["k", "k.r"]),
            vec![one.clone(), grant[..24].to_vec()],
            "at least 32 bytes",
        ),
        (
            keys(&["l", "l.n", "l.n"]),
            vec![request(now, &[log], "x"), grant.clone()],
            "sorted set",
        ),
    ];
    for (keys, args, error) in cases {
        let mut cmd = redis::cmd("TOLLGATE.CHECK");
        cmd.arg(keys.len()).arg(&keys).arg("h").arg(0);
        for a in &args {
            cmd.arg(a);
        }
        let e = cmd
            .query_async::<Vec<u8>>(&mut conn)
            .await
            .expect_err("refused");
        assert!(e.to_string().contains(error), "{keys:?}: {e}");
    }
    // A record's key of another type: refused, the state untouched.
    server.cli(&["SET", "k.r", "not a hash"]);
    let e = redis::cmd("TOLLGATE.CHECK")
        .arg(2)
        .arg(&["k", "k.r"])
        .arg("h")
        .arg(0)
        .arg(&one)
        .arg(&grant)
        .query_async::<Vec<u8>>(&mut conn)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "1", "nothing was written");
}

/// A store as hybrid instances use it, on the test's clock; with the
/// module when `module` (the server has it).
async fn store(url: &str, clock: &Arc<ManualClock>, module: bool) -> RedisStore {
    let store = crate::store::store(url, clock, module).await;
    assert_eq!(store.uses_module(), module);
    store
}

const LIMIT: u64 = 1_000;
const LEASE_TTL: Duration = Duration::from_secs(60);

/// What one side of the comparison does next, on its instances.
#[derive(Clone, Copy)]
enum Op {
    Start(usize),
    /// Checks `n` times: answers how many were admitted.
    Admit(usize, &'static str, u64),
    /// Checks until a deny: answers how many were admitted.
    Drain(usize, &'static str),
    /// Reports what it holds (its periodic give back).
    Report(usize),
    /// Gives back all it holds.
    Flush(usize),
    /// Dropped without giving back.
    Crash(usize),
    Advance(Duration),
}

/// The workloads of tests/redis/crashed_leases.rs on one algorithm: a
/// crash, its units credited back past the record's time; a stall, whose
/// units are credited and whose late give back then gives none; a live
/// instance's give back.
const WORKLOAD: [Op; 19] = [
    Op::Start(0),
    Op::Admit(0, "crashy", 300),
    Op::Report(0),
    Op::Crash(0),
    Op::Start(1),
    Op::Drain(1, "crashy"),
    Op::Advance(Duration::from_secs(121)),
    Op::Drain(1, "crashy"),
    Op::Start(2),
    Op::Admit(2, "stalled", 300),
    Op::Report(2),
    Op::Advance(Duration::from_secs(121)),
    Op::Drain(1, "stalled"),
    Op::Flush(2),
    Op::Drain(1, "stalled"),
    Op::Start(0),
    Op::Admit(0, "given", 300),
    Op::Flush(0),
    Op::Drain(1, "given"),
];

type Instance = Hybrid<RedisStore>;

async fn instance(url: &str, clock: &Arc<ManualClock>, module: bool) -> Instance {
    let config = HybridConfig {
        lease_ttl: LEASE_TTL,
        ..HybridConfig::default()
    };
    let redis = store(url, clock, module).await;
    Hybrid::with_clock(redis, config, Arc::clone(clock) as _)
}

/// 1,000 per 30 days: nothing refills, and no window ends, in a test.
fn limit(key: &str, algorithm: Algorithm) -> Limit<'_> {
    Limit {
        key,
        quota: Quota::new(LIMIT, Duration::from_secs(30 * 86_400)).unwrap(),
        algorithm,
        cost: 1,
        failure: FailurePolicy::Local,
    }
}

/// Hybrid instances on one server or cluster.
struct Side {
    url: String,
    module: bool,
    instances: [Option<Instance>; 3],
}

impl Side {
    async fn apply(&mut self, op: Op, algorithm: Algorithm, clock: &Arc<ManualClock>) -> u64 {
        let key = |key: &'static str| limit(key, algorithm);
        let get = |i: usize| self.instances[i].as_ref().expect("started");
        match op {
            Op::Start(i) => {
                self.instances[i] = Some(instance(&self.url, clock, self.module).await);
                0
            }
            Op::Admit(i, k, n) => {
                let mut admitted = 0;
                for _ in 0..n {
                    admitted += u64::from(get(i).check(&[key(k)]).await.unwrap().allowed());
                }
                admitted
            }
            Op::Drain(i, k) => {
                let mut admitted = 0;
                while get(i).check(&[key(k)]).await.unwrap().allowed() {
                    admitted += 1;
                    assert!(admitted <= LIMIT, "more admitted than the limit");
                }
                admitted
            }
            Op::Report(i) => {
                get(i).return_expired().await;
                get(i).held_units()
            }
            Op::Flush(i) => {
                get(i).flush().await;
                0
            }
            Op::Crash(i) => {
                self.instances[i] = None;
                0
            }
            Op::Advance(_) => 0,
        }
    }
}

/// The keys with their hashes' records only, sorted: each instance's
/// holder id, which names its record, is random.
fn holders_unnamed(keys: Vec<Contents>) -> Vec<Contents> {
    keys.into_iter()
        .map(|(name, contents, expiry)| {
            if !name.starts_with("hash") {
                return (name, contents, expiry);
            }
            let mut records: Vec<Vec<u8>> = contents.into_iter().skip(1).step_by(2).collect();
            records.sort();
            (name, records, expiry)
        })
        .collect()
}

/// Runs the workload on every leased algorithm in lockstep on `code` (the
/// store calling the code) and `native` (the store using the module): the
/// same answers and the same keys on `code_nodes` and `native_nodes` after
/// every step.
async fn lockstep(
    code: &str,
    code_nodes: &[&RedisServer],
    native: &str,
    native_nodes: &[&RedisServer],
) {
    for algorithm in LEASED {
        let clock = conformance::clock();
        let mut sides = [(code, false), (native, true)].map(|(url, module)| Side {
            url: url.to_owned(),
            module,
            instances: Default::default(),
        });
        let mut answers: [Vec<u64>; 2] = Default::default();
        let mut hashes = 0;
        for (i, op) in WORKLOAD.into_iter().enumerate() {
            if let Op::Advance(d) = op {
                clock.advance(d);
            }
            for (side, answers) in sides.iter_mut().zip(&mut answers) {
                answers.push(side.apply(op, algorithm, &clock).await);
            }
            let (a, n) = (
                holders_unnamed(states(code_nodes, "").await),
                holders_unnamed(states(native_nodes, "").await),
            );
            hashes += a.iter().filter(|k| k.0.starts_with("hash")).count();
            assert_same_keys(&n, &a, 1000, &format!("{algorithm:?}: step {i}: the keys"));
        }
        assert!(hashes > 0, "{algorithm:?}: records were written");
        assert_eq!(
            answers[1], answers[0],
            "{algorithm:?}: the module's answers"
        );
        // The crashed units came back, and the stalled ones once.
        assert_eq!(answers[0][5] + answers[0][7] + 300, LIMIT, "{algorithm:?}");
        assert_eq!(answers[0][12] + 300, LIMIT, "{algorithm:?}");
        assert_eq!(answers[0][14], 0, "{algorithm:?}: no late give back");
        assert_eq!(answers[0][18] + 300, LIMIT, "{algorithm:?}: given back");
        for node in code_nodes.iter().chain(native_nodes) {
            node.cli(&["FLUSHALL"]);
        }
    }
    let calls = |nodes: &[&RedisServer], c| nodes.iter().map(|n| n.command_calls(c)).sum::<u64>();
    assert!(calls(native_nodes, "tollgate.check") > 0);
    assert_eq!(calls(native_nodes, "fcall"), 0, "the code was called");
    assert!(calls(code_nodes, "fcall") > 0);
}

#[tokio::test]
async fn hybrid_instances_decide_through_the_module_as_through_the_code_with_no_fcall() {
    let (code, native) = (server(), server());
    lockstep(&code.url(), &[&code], &native.url(), &[&native]).await;
}

#[tokio::test]
async fn hybrid_instances_on_a_cluster_decide_through_the_module_with_no_fcall() {
    let module = module();
    let code = RedisCluster::start();
    let native = RedisCluster::start_with(&["--loadmodule", module.to_str().unwrap()]);
    let code_nodes: Vec<&RedisServer> = code.nodes.iter().collect();
    let native_nodes: Vec<&RedisServer> = native.nodes.iter().collect();
    lockstep(&code.url(), &code_nodes, &native.url(), &native_nodes).await;
}

/// tests/redis/slow_leases.rs's record sums through the module: leases of
/// one key taken by concurrent checks each add to the record, so that
/// after a crash they all come back.
#[tokio::test]
async fn leases_taken_by_concurrent_checks_through_the_module_all_come_back_after_a_crash() {
    let server = server();
    for algorithm in LEASED {
        let clock = conformance::clock();
        let key = format!("concurrent-{algorithm}");
        let crashed = Arc::new(instance(&server.url(), &clock, true).await);
        // Spent down to nothing held, so that concurrent misses each lease.
        let mut admitted = 0u64;
        while admitted < 5 || crashed.held_units() > 0 {
            assert!(
                crashed
                    .check(&[limit(&key, algorithm)])
                    .await
                    .unwrap()
                    .allowed()
            );
            admitted += 1;
        }
        let checks: Vec<_> = (0..16)
            .map(|_| {
                let (store, key) = (Arc::clone(&crashed), key.clone());
                tokio::spawn(async move {
                    store
                        .check(&[limit(&key, algorithm)])
                        .await
                        .unwrap()
                        .allowed()
                })
            })
            .collect();
        for check in checks {
            assert!(check.await.unwrap());
            admitted += 1;
        }
        assert!(
            crashed.stats().inner_checks > 2,
            "{algorithm}: several leasing calls"
        );
        assert!(crashed.held_units() > 0, "{algorithm}");
        drop(crashed);
        clock.advance(Duration::from_secs(121));
        let other = instance(&server.url(), &clock, true).await;
        let mut rest = 0;
        while other
            .check(&[limit(&key, algorithm)])
            .await
            .unwrap()
            .allowed()
        {
            rest += 1;
            assert!(rest <= LIMIT, "more admitted than the limit");
        }
        assert_eq!(admitted + rest, LIMIT, "{algorithm}");
    }
    assert_eq!(server.command_calls("fcall"), 0, "the code was called");
}
