//! The sides measured, each one check per call, on the same quota: 100 per
//! second, bursts of 100.
//!
//! - **classic script**: the token bucket the common articles give: `HMGET`
//!   tokens and last refill, compute in floating point, `HMSET`, `EXPIRE`; one
//!   `EVALSHA` with the client's time.
//! - **GCRA script**: the least a script can do: `TIME`, `GET` the theoretical
//!   arrival time (TAT), compare, `SET … PX` the new one; one `EVALSHA`.
//! - **CL.THROTTLE**: redis-cell's native module command (GCRA in Rust inside
//!   Redis: `CL.THROTTLE key 99 100 1 1`, i.e. a limit of `max_burst + 1` =
//!   100, 100 per 1 s, one unit; the server's clock; the TAT stored as a
//!   decimal string of nanoseconds).
//! - **tollgate module GCRA**: Tollgate's own module (when
//!   `TOLLGATE_REDIS_MODULE` names its built `libtollgate_redis_module.so`):
//!   `TOLLGATE.GCRA key 100 1s 100 1`, the same quota as CL.THROTTLE's, the
//!   server's clock, the TAT stored as the store's Lua code stores it.
//! - **tollgate**: `DenyCache<RedisStore>`, token bucket, Redis's `TIME`, its
//!   defaults (batching on one server, the deny cache over it).
//! - **tollgate GCRA**: the same store, GCRA: with the module loaded, its
//!   batches go to `TOLLGATE.CHECK`.
//!
//! And for counting rules (`counting.rs`), 100 per second:
//!
//! - **envoyproxy pipeline**: envoyproxy/ratelimit's fixed window cache as
//!   it talks to Redis, implemented here: the key names the window's start
//!   in seconds from the client's clock, and `INCRBY key 1` and `EXPIRE key
//!   <unit>` go in one pipeline; admitted while the count is at most the
//!   limit;
//! - **limitador scripts**: Limitador's `redis` storage as it checks one
//!   counter (`AsyncRedisStorage::check_and_update`, without rate limit
//!   headers, its default): `MGET` the counter, decide, then `EVALSHA` of its
//!   update script (`INCRBY`; on a counter's first hit `EXPIRE` and `SADD` to
//!   its limit's set). The script is Limitador's own, extracted from its
//!   source tarball at bench time (`scripts/bench-redis`; the file named by
//!   `TOLLGATE_LIMITADOR_SCRIPT`); keys shaped as its JSON ones;
//! - **tollgate hit counter** and **tollgate fixed window**: the same store,
//!   one limit per check, so counted natively (`INCRBY`, with `PEXPIRE … NX`
//!   on a window's first check from the store).
//!
//! The classic script and Tollgate's token bucket admit the same; GCRA with a
//! tolerance of `(burst - 1) × interval` admits the same as a token bucket too
//! (a burst of 100, then one every 10 ms), so every side makes the same
//! decisions up to clock reads and float drift.

use redis::aio::ConnectionLike;
use tollgate_core::{Algorithm, FailurePolicy, Holder, LeaseStore, Leased, Limit, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_store::DenyCache;

const CLASSIC: &str = r"
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])
local bucket = redis.call('HMGET', key, 'tokens', 'last_refill')
local tokens = tonumber(bucket[1]) or capacity
local last = tonumber(bucket[2]) or now
local delta = math.max(0, now - last)
tokens = math.min(capacity, tokens + delta * rate)
local allowed = 0
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
end
redis.call('HMSET', key, 'tokens', tokens, 'last_refill', now)
redis.call('EXPIRE', key, math.ceil(capacity / rate) * 2)
return { allowed, math.floor(tokens) }
";

/// ARGV: the emission interval and the tolerance (`(burst - 1) × interval`),
/// in µs. Returns whether the check was admitted and, if not, the µs to wait.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local wait = tat - now - tonumber(ARGV[2])
if wait > 0 then return { 0, wait } end
local new = tat + tonumber(ARGV[1])
redis.call('SET', KEYS[1], new, 'PX', math.ceil((new - now) / 1000))
return { 1, 0 }
";

/// The quota: `RATE` per period, bursts of `RATE`.
const RATE: u64 = 100;

/// Limitador's limit as its keys spell it (serde_json of the limit).
const LIMITADOR_LIMIT: &str =
    r#"{"namespace":"bench","seconds":1,"max_value":100,"conditions":[],"variables":["user"]}"#;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Side {
    Classic,
    Gcra,
    Cell,
    Module,
    Tollgate,
    TollgateGcra,
    Envoy,
    HitCounter,
    FixedWindow,
    Limitador,
    /// The store's sliding log, through the module's `TOLLGATE.CHECK`.
    LogModule,
    /// The store's sliding log, through the code (`FCALL`).
    LogCode,
    /// A hybrid instance's leasing check of a GCRA limit (op `h`), through
    /// the module's `TOLLGATE.CHECK`.
    LeaseModule,
    /// The same through the code (`FCALL`).
    LeaseCode,
    /// Not a limiter: `SET key 1 PX <period>` from a bare client, the write
    /// every GCRA decision makes and nothing else. What Redis spends on it
    /// is the least any one-key decision can cost it in that cell.
    Floor,
}

impl Side {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Side::Classic => "classic script",
            Side::Gcra => "GCRA script",
            Side::Cell => "CL.THROTTLE",
            Side::Module => "tollgate module GCRA",
            Side::Tollgate => "tollgate",
            Side::TollgateGcra => "tollgate GCRA",
            Side::Envoy => "envoyproxy pipeline",
            Side::HitCounter => "tollgate hit counter",
            Side::FixedWindow => "tollgate fixed window",
            Side::Limitador => "limitador scripts",
            Side::LogModule => "tollgate sliding log, module",
            Side::LogCode => "tollgate sliding log, code",
            Side::LeaseModule => "tollgate hybrid leasing, module",
            Side::LeaseCode => "tollgate hybrid leasing, code",
            Side::Floor => "floor: SET … PX",
        }
    }

    /// The caller key for a subject: the peers' Redis key itself, Tollgate's
    /// caller key (its store builds the Redis key around it).
    pub(crate) fn key(self, subject: &str) -> String {
        match self {
            Side::Classic => format!("c:{subject}"),
            Side::Gcra => format!("g:{subject}"),
            Side::Cell => format!("cl:{subject}"),
            Side::Module => format!("m:{subject}"),
            Side::Floor => format!("f:{subject}"),
            Side::Envoy => format!("ratelimit_bench_user_{subject}"),
            Side::Limitador => format!(
                r#"namespace:{{bench}},counter:{{"limit":{LIMITADOR_LIMIT},"set_variables":{{"user":"{subject}"}}}}"#
            ),
            Side::Tollgate
            | Side::TollgateGcra
            | Side::HitCounter
            | Side::FixedWindow
            | Side::LogModule
            | Side::LogCode
            | Side::LeaseModule
            | Side::LeaseCode => subject.to_owned(),
        }
    }
}

/// What each side needs to check: the scripts (loaded on first use and on
/// `NOSCRIPT`), a connection for the peers, Tollgate's store.
pub(crate) struct Checker<C> {
    classic: redis::Script,
    gcra: redis::Script,
    /// Limitador's update script, when given.
    limitador: Option<redis::Script>,
    pub(crate) conn: C,
    pub(crate) store: DenyCache<RedisStore>,
    /// A store that never uses the module, for [`Side::LogCode`] and
    /// [`Side::LeaseCode`].
    code_store: Option<DenyCache<RedisStore>>,
}

impl<C: ConnectionLike + Clone + Send + Sync> Checker<C> {
    pub(crate) fn new(conn: C, store: DenyCache<RedisStore>) -> Self {
        Self {
            classic: redis::Script::new(CLASSIC),
            gcra: redis::Script::new(GCRA),
            limitador: None,
            conn,
            store,
            code_store: None,
        }
    }

    /// With a store that never uses the module, for [`Side::LogCode`].
    pub(crate) fn with_code_store(mut self, store: DenyCache<RedisStore>) -> Self {
        self.code_store = Some(store);
        self
    }

    /// With Limitador's update script (its source), for [`Side::Limitador`].
    pub(crate) fn with_limitador(mut self, script: &str) -> Self {
        self.limitador = Some(redis::Script::new(script));
        self
    }

    /// One check of `key` (as [`Side::key`] gives it), with the quota scaled
    /// to 100 per `period_s` seconds: whether it was admitted.
    pub(crate) async fn check(&self, side: Side, key: &str, period_s: u64) -> bool {
        let mut conn = self.conn.clone();
        match side {
            Side::Classic => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs_f64();
                let (allowed, _): (i64, i64) = self
                    .classic
                    .key(key)
                    .arg(RATE as f64 / period_s as f64)
                    .arg(RATE)
                    .arg(now)
                    .arg(1)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                allowed == 1
            }
            Side::Gcra => {
                let interval = period_s * 1_000_000 / RATE;
                let (allowed, _): (i64, i64) = self
                    .gcra
                    .key(key)
                    .arg(interval)
                    .arg((RATE - 1) * interval)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                allowed == 1
            }
            Side::Cell => {
                let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
                    .arg(key)
                    .arg(RATE - 1)
                    .arg(RATE)
                    .arg(period_s)
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                reply[0] == 0
            }
            Side::Module => {
                let reply: Vec<i64> = redis::cmd("TOLLGATE.GCRA")
                    .arg(key)
                    .arg(RATE)
                    .arg(format!("{period_s}s"))
                    .arg(RATE)
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                reply[0] == 1
            }
            Side::Floor => {
                let () = redis::cmd("SET")
                    .arg(key)
                    .arg(1)
                    .arg("PX")
                    .arg(period_s * 1000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                true
            }
            Side::Envoy => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                let window = format!("{key}_{}", now - now % period_s);
                let (count,): (u64,) = redis::pipe()
                    .cmd("INCRBY")
                    .arg(&window)
                    .arg(1)
                    .cmd("EXPIRE")
                    .arg(&window)
                    .arg(period_s)
                    .ignore()
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                count <= RATE
            }
            Side::Limitador => {
                let script = self.limitador.as_ref().expect("Limitador's script");
                let (value,): (Option<u64>,) = redis::cmd("MGET")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if value.unwrap_or(0) + 1 > RATE {
                    return false;
                }
                let limit_key = format!("namespace:{{bench}},limit:{LIMITADOR_LIMIT}");
                // A pipeline of one invocation, as Limitador sends one per
                // counter of the request; loaded on NOSCRIPT as it does.
                let mut invocation = script.key(key);
                invocation.key(limit_key).arg(period_s).arg(1);
                let mut pipe = redis::pipe();
                pipe.invoke_script(&invocation).ignore();
                if pipe.query_async::<()>(&mut conn).await.is_err() {
                    invocation.load_async(&mut conn).await.unwrap();
                    pipe.query_async::<()>(&mut conn).await.unwrap();
                }
                true
            }
            Side::Tollgate
            | Side::TollgateGcra
            | Side::HitCounter
            | Side::FixedWindow
            | Side::LogModule
            | Side::LogCode
            | Side::LeaseModule
            | Side::LeaseCode => {
                let quota = Quota::new(RATE, std::time::Duration::from_secs(period_s)).unwrap();
                let algorithm = match side {
                    Side::HitCounter => Algorithm::HitCounter,
                    Side::FixedWindow => Algorithm::FixedWindow,
                    Side::TollgateGcra | Side::LeaseModule | Side::LeaseCode => Algorithm::Gcra,
                    Side::LogModule | Side::LogCode => Algorithm::SlidingLog,
                    _ => Algorithm::TokenBucket,
                };
                let limit = Limit {
                    key,
                    quota,
                    algorithm,
                    cost: 1,
                    failure: FailurePolicy::Local,
                };
                let store = match side {
                    Side::LogCode | Side::LeaseCode => self
                        .code_store
                        .as_ref()
                        .expect("a store without the module"),
                    _ => &self.store,
                };
                if matches!(side, Side::LeaseModule | Side::LeaseCode) {
                    // As a hybrid instance's miss sends it: the unit it
                    // needs plus one leased, the one it held spent.
                    let holder = Holder {
                        id: 1,
                        ttl: std::time::Duration::from_secs(1),
                    };
                    let leased = [Some(Leased {
                        released: 1,
                        leased: 1,
                    })];
                    let limits = [Limit { cost: 2, ..limit }];
                    let stamped = store.inner().check_leasing(&limits, holder, &leased);
                    return stamped.await.unwrap().outcome.allowed();
                }
                store.check(&[limit]).await.unwrap().allowed()
            }
        }
    }
}
