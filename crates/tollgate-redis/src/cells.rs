//! Versioned values that several processes update by compare-and-set:
//! state that is read, changed by code of its own and written back, too
//! rich for one Lua step (the quota service's per-bucket share-out).
//!
//! A cell is a hash `<prefix>:cell:{<key>}` of a version and a value. A
//! write names the version it read and is refused if another has written
//! since (one `EVALSHA`, atomic); the writer reads again and retries. One
//! key per cell, so a cell lives on one slot of a cluster.

use std::time::Duration;

use redis::Script;
use tollgate_core::StoreError;

use crate::conn::Conn;
use crate::keys::redis_keys_in;

/// Writes `ARGV[2]` as version `ARGV[1] + 1` if the version is `ARGV[1]`
/// (0: absent), keeping it `ARGV[3]` ms.
const PUT: &str = r"
local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if v ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'v', v + 1, 's', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// A cell's value as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    /// Its version, to name when writing it back.
    pub version: u64,
    /// Its value.
    pub value: Vec<u8>,
}

/// The cells of one namespace; see the module's documentation. Cheap to
/// clone: it shares the store's connection.
#[derive(Clone)]
pub struct Cells {
    conn: Conn,
    prefix: String,
    put: Script,
    timeout: Duration,
}

impl std::fmt::Debug for Cells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cells")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Cells {
    pub(crate) fn new(conn: Conn, prefix: String, timeout: Duration) -> Self {
        Self {
            conn,
            prefix,
            put: Script::new(PUT),
            timeout,
        }
    }

    fn redis_key(&self, key: &str) -> String {
        redis_keys_in(&self.prefix, "cell", key)
    }

    /// The cell `key`, `None` if it was never written or has expired.
    ///
    /// # Errors
    ///
    /// [`StoreError::Timeout`] or [`StoreError::Backend`] when Redis does
    /// not answer in time or fails.
    pub async fn get(&self, key: &str) -> Result<Option<Cell>, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.redis_key(key)).arg("v").arg("s");
        let (version, value): (Option<u64>, Option<Vec<u8>>) =
            self.bounded(self.conn.query(&cmd)).await?;
        Ok(match (version, value) {
            (Some(version), Some(value)) => Some(Cell { version, value }),
            _ => None,
        })
    }

    /// Writes `value` to the cell `key` if its version is still `read`
    /// (`None`: the cell was absent), to expire after `keep`; false when
    /// another write came first.
    ///
    /// # Errors
    ///
    /// As [`Cells::get`].
    pub async fn put(
        &self,
        key: &str,
        read: Option<u64>,
        value: &[u8],
        keep: Duration,
    ) -> Result<bool, StoreError> {
        let mut call = self.put.prepare_invoke();
        call.key(self.redis_key(key))
            .arg(read.unwrap_or(0))
            .arg(value)
            .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX).max(1));
        let written: i64 = self.bounded(self.conn.invoke(&call)).await?;
        Ok(written == 1)
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(StoreError::Timeout(self.timeout)),
            Ok(Err(e)) => Err(StoreError::Backend {
                retryable: e.is_timeout() || e.is_connection_dropped() || e.is_io_error(),
                source: Box::new(e),
            }),
            Ok(Ok(v)) => Ok(v),
        }
    }
}
