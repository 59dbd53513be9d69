//! Which cluster node serves which slot, so that checks bound for one node
//! can share a call whatever their slots.
//!
//! The map comes from `CLUSTER SLOTS` at connect, and again whenever a batch
//! finds a key its node does not serve (a reshard or failover moved it). It
//! only groups checks: a call is routed by its first key, so a stale map costs
//! a retry of that batch's checks one by one, never a wrong decision.
//!
//! The same map names the cluster's failure domains (`Store::domain`): each
//! range of slots, as `<first>-<last>`. A range keeps its name through a
//! failover (its replica takes it over), so the fallback's breaker for it is
//! closed by a probe of a key in the range once any primary serves it again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use redis::Value;

use crate::batch::Batcher;
use crate::conn::Conn;

/// One range of slots and the primary serving it.
#[derive(Debug)]
struct Range {
    first: u16,
    last: u16,
    node: Arc<str>,
    /// `<first>-<last>`: the range's failure domain.
    name: Arc<str>,
}

/// The primary serving each range of slots, by node id.
#[derive(Debug, Default)]
pub(crate) struct SlotMap {
    /// Sorted by slot.
    ranges: Vec<Range>,
}

impl SlotMap {
    /// Parses a `CLUSTER SLOTS` reply: per range, its first and last slot,
    /// then the primary as `[host, port, id, ...]` (replicas follow).
    fn parse(reply: &Value) -> Option<Self> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let text = |v: &Value| match v {
                Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                Value::SimpleString(s) => Some(s.clone()),
                Value::Int(n) => Some(n.to_string()),
                _ => None,
            };
            // The node's id where the server gives one, else its address.
            let node = match primary.get(2).and_then(text) {
                Some(id) => id,
                None => format!(
                    "{}:{}",
                    primary.first().and_then(text)?,
                    primary.get(1).and_then(text)?
                ),
            };
            let (first, last) = (u16::try_from(*first).ok()?, u16::try_from(*last).ok()?);
            out.push(Range {
                first,
                last,
                node: Arc::from(node),
                name: Arc::from(format!("{first}-{last}")),
            });
        }
        out.sort_by_key(|r| r.first);
        Some(Self { ranges: out })
    }

    fn range(&self, slot: u16) -> Option<&Range> {
        let i = self.ranges.partition_point(|r| r.last < slot);
        self.ranges.get(i).filter(|r| r.first <= slot)
    }

    /// The node serving `slot`, if the map knows one.
    pub(crate) fn node(&self, slot: u16) -> Option<&Arc<str>> {
        self.range(slot).map(|r| &r.node)
    }

    /// The failure domain of `slot`: the name of its range.
    pub(crate) fn domain(&self, slot: u16) -> Option<&Arc<str>> {
        self.range(slot).map(|r| &r.name)
    }
}

/// The slots of a failure domain's name (`<first>-<last>`).
pub(crate) fn domain_slots(name: &str) -> Option<(u16, u16)> {
    let (first, last) = name.split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

/// The batchers of a cluster, one per primary, and the map that picks one.
pub(crate) struct NodeBatchers {
    conn: Conn,
    map: RwLock<Arc<SlotMap>>,
    refreshing: Arc<AtomicBool>,
    batchers: Mutex<HashMap<Arc<str>, Batcher>>,
    start: Box<dyn Fn() -> Batcher + Send + Sync>,
}

impl NodeBatchers {
    /// Reads the slot map; `start` makes a node's batcher when it is first
    /// needed.
    pub(crate) async fn new(
        conn: Conn,
        start: impl Fn() -> Batcher + Send + Sync + 'static,
    ) -> Result<Self, redis::RedisError> {
        let map = read(&conn).await?;
        Ok(Self {
            conn,
            map: RwLock::new(Arc::new(map)),
            refreshing: Arc::new(AtomicBool::new(false)),
            batchers: Mutex::new(HashMap::new()),
            start: Box::new(start),
        })
    }

    fn map(&self) -> Arc<SlotMap> {
        Arc::clone(&self.map.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The failure domain of `slot`, if the map knows the slot.
    pub(crate) fn domain(&self, slot: u16) -> Option<Arc<str>> {
        self.map().domain(slot).cloned()
    }

    /// The batcher of the node serving `slot`; `None` when the map does not
    /// know the slot (the check then goes alone).
    pub(crate) fn for_slot(&self, slot: u16) -> Option<Batcher> {
        let map = self.map();
        let node = map.node(slot)?;
        let mut batchers = self.batchers.lock().unwrap_or_else(|e| e.into_inner());
        Some(
            batchers
                .entry(Arc::clone(node))
                .or_insert_with(|| (self.start)())
                .clone(),
        )
    }

    /// Reads the slot map again in the background (one read at a time).
    pub(crate) fn refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if let Ok(map) = read(&this.conn).await {
                *this.map.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(map);
            }
            this.refreshing.store(false, Ordering::Release);
        });
    }
}

async fn read(conn: &Conn) -> Result<SlotMap, redis::RedisError> {
    let reply: Value = conn.query(redis::cmd("CLUSTER").arg("SLOTS")).await?;
    SlotMap::parse(&reply).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected CLUSTER SLOTS reply",
            format!("{reply:?}"),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn slots_map_to_the_primary_serving_them() {
        let range = |first, last, port: i64, id: &str| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk(id)]),
                Value::Array(vec![
                    bulk("127.0.0.1"),
                    Value::Int(port + 100),
                    bulk("replica"),
                ]),
            ])
        };
        let reply = Value::Array(vec![
            range(10923, 16383, 7003, "c"),
            range(0, 5460, 7001, "a"),
            range(5461, 10922, 7002, "b"),
        ]);
        let map = SlotMap::parse(&reply).unwrap();
        let node = |slot| map.node(slot).map(|n| n.to_string());
        assert_eq!(node(0).as_deref(), Some("a"));
        assert_eq!(node(5460).as_deref(), Some("a"));
        assert_eq!(node(5461).as_deref(), Some("b"));
        assert_eq!(node(16383).as_deref(), Some("c"));
        assert_eq!(node(16384), None);
        let gap = SlotMap::parse(&Value::Array(vec![range(100, 200, 7001, "a")])).unwrap();
        assert_eq!(gap.node(99), None);
        assert_eq!(gap.node(201), None);
        assert!(SlotMap::parse(&Value::Int(1)).is_none());
        let domain = |slot| map.domain(slot).map(|n| n.to_string());
        assert_eq!(domain(5460).as_deref(), Some("0-5460"));
        assert_eq!(domain(5461).as_deref(), Some("5461-10922"));
        assert_eq!(domain(16384), None);
        assert_eq!(domain_slots("5461-10922"), Some((5461, 10922)));
        assert_eq!(domain_slots("5461"), None);
    }
}
