//! Bytes per key: a key the module writes takes no more memory than the
//! same state written by the store's Lua code (`MEMORY USAGE`). A deny
//! writes nothing: its read in place leaves a GCRA state as a plain string
//! (its size before this test's fix) until the next write.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore, TimeSource};
use tollgate_testkit::RedisServer;

use crate::{ints, server};

fn usage(server: &RedisServer, key: &str) -> u64 {
    server
        .cli(&["MEMORY", "USAGE", key])
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no key {key}"))
}

#[tokio::test]
async fn a_key_the_module_writes_is_no_bigger_than_the_codes() {
    let server = server();
    let clock = tollgate_store::conformance::clock();
    let config = RedisConfig {
        time: TimeSource::Clock(Arc::clone(&clock) as _),
        timeout: Duration::from_secs(5),
        extra_ttl: Duration::from_secs(600),
        module: false,
        ..RedisConfig::default()
    };
    let store = RedisStore::connect(&server.url(), config).await.unwrap();
    let quota = Quota::per_second(3).unwrap().with_burst(2).unwrap();
    for (algorithm, command, segment) in [
        (Algorithm::Gcra, "TOLLGATE.GCRA", "gcra2"),
        (Algorithm::TokenBucket, "TOLLGATE.TOKENBUCKET", "tb2"),
        (Algorithm::LeakyBucket, "TOLLGATE.LEAKYBUCKET", "lb2"),
    ] {
        // Two admits, a deny, and an admit a second later: the same steps on
        // two keys of one length.
        for step in 0..4 {
            if step == 3 {
                clock.advance(Duration::from_secs(1));
            }
            let limit = Limit {
                key: "code",
                quota,
                algorithm,
                cost: 1,
                failure: FailurePolicy::Local,
            };
            let by_code = store.check(&[limit]).await.unwrap().allowed();
            let now_us = tollgate_core::Clock::now(&*clock) / 1000;
            let reply = ints(&server.cli(&[
                command,
                &format!("tollgate:{segment}:{{mod_}}"),
                "3",
                "1s",
                "2",
                "1",
                "PAD",
                "600000",
                "AT",
                &now_us.to_string(),
            ]));
            assert_eq!(reply[0] == 1, by_code, "{command}, step {step}");
            assert_eq!(by_code, step != 2, "{command}, step {step}");
            if !by_code {
                continue;
            }
            let code = usage(&server, &format!("tollgate:{segment}:{{code}}"));
            let module = usage(&server, &format!("tollgate:{segment}:{{mod_}}"));
            assert!(
                module <= code,
                "{command}, step {step}: the module's key takes {module} bytes, the code's {code}"
            );
        }
    }
}
