//! A database in memory for the unit tests: string states, sorted sets and
//! hashes with their TTLs, as Redis keeps them, through [`Db`] and
//! [`Records`].

use std::collections::HashMap;

use crate::leases::{Fields, Records};
use crate::request::{Db, Decide, value};
use crate::sets::{Sets, Visit};
use crate::step::Stepped;

/// Keys by name; a call's keys by position (`keys`).
#[derive(Debug, Default)]
pub(crate) struct Mem {
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) strings: HashMap<Vec<u8>, Vec<u8>>,
    /// Members ordered by score, then bytes, as Redis orders them.
    pub(crate) sets: HashMap<Vec<u8>, Vec<(u64, Vec<u8>)>>,
    pub(crate) hashes: HashMap<Vec<u8>, HashMap<Vec<u8>, Vec<u8>>>,
    /// TTLs in ms.
    pub(crate) ttls: HashMap<Vec<u8>, u64>,
}

impl Mem {
    /// Uses `keys` as the call's keys.
    pub(crate) fn with_keys(&mut self, keys: &[&str]) -> &mut Self {
        self.keys = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        self
    }

    /// Writes what `check` returned for the strings.
    pub(crate) fn apply(&mut self, writes: crate::request::Writes) {
        for w in writes {
            let mut digits = itoa::Buffer::new();
            self.strings
                .insert(w.key.to_vec(), value(&w.state, &mut digits).to_vec());
            self.ttls
                .insert(w.key.to_vec(), w.ttl_us.div_ceil(1000).max(1));
        }
    }

    fn set(&mut self, k: usize) -> &mut Vec<(u64, Vec<u8>)> {
        self.sets.entry(self.keys[k].clone()).or_default()
    }
}

impl Db for Mem {
    fn string(
        &mut self,
        k: usize,
        name: &[u8],
        decide: &mut Decide<'_>,
    ) -> Result<Stepped, String> {
        let _ = k;
        decide(self.strings.get(name).map(Vec::as_slice))
    }

    fn get(&mut self, name: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Ok(self.strings.get(name).cloned())
    }

    fn put(&mut self, name: &[u8], value: &[u8]) -> Result<(), String> {
        self.strings.insert(name.to_vec(), value.to_vec());
        Ok(())
    }
}

impl Sets for Mem {
    fn total(&mut self, k: usize) -> Result<i64, String> {
        self.strings.get(&self.keys[k + 1]).map_or(Ok(0), |v| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| "not a count".to_owned())
        })
    }

    fn last(&mut self, k: usize) -> Result<Option<u64>, String> {
        Ok(self.set(k).last().map(|(s, _)| *s))
    }

    fn each(
        &mut self,
        k: usize,
        above: Option<u64>,
        upto: u64,
        f: &mut Visit<'_>,
    ) -> Result<(), String> {
        for (score, member) in self.set(k).clone() {
            if above.is_some_and(|a| score <= a) || score > upto {
                continue;
            }
            if !f(score, &member)? {
                break;
            }
        }
        Ok(())
    }

    fn remove(&mut self, k: usize, member: &[u8]) -> Result<bool, String> {
        let set = self.set(k);
        let before = set.len();
        set.retain(|(_, m)| m != member);
        let removed = set.len() < before;
        if set.is_empty() {
            let name = self.keys[k].clone();
            self.sets.remove(&name);
            self.ttls.remove(&name);
        }
        Ok(removed)
    }

    fn add(&mut self, k: usize, score: u64, member: &[u8]) -> Result<(), String> {
        let set = self.set(k);
        set.retain(|(_, m)| m != member);
        set.push((score, member.to_vec()));
        set.sort();
        Ok(())
    }

    fn set_total(&mut self, k: usize, total: i64, keep_ttl: bool) -> Result<(), String> {
        let name = self.keys[k + 1].clone();
        if !keep_ttl {
            self.ttls.remove(&name);
        }
        self.strings.insert(name, total.to_string().into_bytes());
        Ok(())
    }

    fn expire(&mut self, k: usize, aux: bool, ttl_us: u64, at_least: bool) -> Result<(), String> {
        let name = self.keys[k + usize::from(aux)].clone();
        let ms = ttl_us.div_ceil(1000).max(1);
        let ttl = self.ttls.entry(name).or_insert(0);
        if !at_least || *ttl < ms {
            *ttl = ms;
        }
        Ok(())
    }
}

impl Records for Mem {
    fn record(&mut self, r: usize, holder: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Ok(self
            .hashes
            .get(&self.keys[r])
            .and_then(|h| h.get(holder).cloned()))
    }

    fn records(&mut self, r: usize) -> Result<Fields, String> {
        Ok(self.hashes.get(&self.keys[r]).map_or(Vec::new(), |h| {
            h.iter().map(|(f, v)| (f.clone(), v.clone())).collect()
        }))
    }

    fn set_record(&mut self, r: usize, holder: &[u8], value: &[u8]) -> Result<(), String> {
        self.hashes
            .entry(self.keys[r].clone())
            .or_default()
            .insert(holder.to_vec(), value.to_vec());
        Ok(())
    }

    fn drop_record(&mut self, r: usize, holder: &[u8]) -> Result<(), String> {
        let name = self.keys[r].clone();
        if let Some(hash) = self.hashes.get_mut(&name) {
            hash.remove(holder);
            if hash.is_empty() {
                self.hashes.remove(&name);
                self.ttls.remove(&name);
            }
        }
        Ok(())
    }
}
