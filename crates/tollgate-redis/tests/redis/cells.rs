//! Compare-and-set cells (`RedisStore::cells`) on a real server and a real
//! cluster: a write that names a version another write has replaced is
//! refused, so two writers that read the same value cannot both write.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::ManualClock;
use tollgate_redis::{Cell, Cells};

use crate::support::{RedisCluster, RedisServer, manual_store};

async fn compare_and_set(cells: &Cells, key: &str) {
    assert_eq!(cells.get(key).await.expect("Redis answers"), None);
    let keep = Duration::from_secs(60);
    assert!(cells.put(key, None, b"one", keep).await.expect("written"));
    assert!(
        !cells.put(key, None, b"lost", keep).await.expect("answered"),
        "a writer that saw no cell loses to the one that wrote it"
    );
    let Some(Cell { version, value }) = cells.get(key).await.expect("Redis answers") else {
        panic!("the cell was written");
    };
    assert_eq!(value, b"one");
    assert!(
        cells
            .put(key, Some(version), b"two", keep)
            .await
            .expect("written")
    );
    assert!(
        !cells
            .put(key, Some(version), b"stale", keep)
            .await
            .expect("answered"),
        "a writer that read the replaced version loses"
    );
    let now = cells
        .get(key)
        .await
        .expect("Redis answers")
        .expect("a cell");
    assert_eq!(
        (now.version, now.value.as_slice()),
        (version + 1, &b"two"[..])
    );
}

#[tokio::test]
async fn a_cell_takes_only_writes_of_the_version_it_has() {
    let redis = RedisServer::start();
    let store = manual_store(&redis.url(), &Arc::new(ManualClock::new(0))).await;
    let cells = store.cells("test", Duration::from_secs(5));
    compare_and_set(&cells, "bucket").await;
    // Braces in a key are escaped, never a tag of the caller's choosing.
    compare_and_set(&cells, "a}b{c").await;
    let keys = redis.cli(&["--scan", "--pattern", "*cell*"]);
    assert!(keys.contains("tollgate:test:cell:{bucket}"), "{keys}");
    assert!(keys.contains("{a%7Db%7Bc}"), "{keys}");
}

#[tokio::test]
async fn cells_work_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = manual_store(&cluster.url(), &Arc::new(ManualClock::new(0))).await;
    let cells = store.cells("test", Duration::from_secs(5));
    for key in ["one", "two", "three", "{tag}four"] {
        compare_and_set(&cells, key).await;
    }
}
