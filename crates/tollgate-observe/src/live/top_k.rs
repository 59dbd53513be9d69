//! The most frequent keys of a stream in bounded memory: the space-saving
//! algorithm (Metwally, Agrawal and El Abbadi, "Efficient Computation of
//! Frequent and Top-k Elements in Data Streams", ICDT 2005).
//!
//! `capacity` counters watch at most `capacity` keys. A key already watched
//! has its counter raised; a new one, while there is room, gets a counter of
//! its own; else it takes over the smallest counter, whose count it inherits
//! plus one, and that inherited count is its `error`. So, over a stream of
//! `N` offers:
//!
//! - every watched key's true count lies in `[count - error, count]`;
//! - `error` is at most the smallest counter, which is at most `N / capacity`
//!   ([`SpaceSaving::max_error`] says what it is now);
//! - a key offered more than [`SpaceSaving::max_error`] times is watched.

use std::hash::Hash;

use hashbrown::{Equivalent, HashMap};

/// One watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Counter<K> {
    /// The key.
    pub(crate) key: K,
    /// Its count: never below its true count.
    pub(crate) count: u64,
    /// How much of `count` it may have inherited: the true count is at least
    /// `count - error`.
    pub(crate) error: u64,
}

/// The space-saving summary of a stream of keys; see the module docs.
#[derive(Debug)]
pub(crate) struct SpaceSaving<K> {
    capacity: usize,
    counters: Vec<Counter<K>>,
    /// Where each watched key's counter is in `counters`; hashbrown's, to
    /// be looked up by a borrowed form of a key (see [`SpaceSaving::offer`]).
    index: HashMap<K, usize, foldhash::fast::RandomState>,
    /// Offers so far (`N`).
    offers: u64,
}

impl<K: Hash + Eq + Clone> SpaceSaving<K> {
    /// A summary with `capacity` counters (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            counters: Vec::with_capacity(capacity),
            index: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            offers: 0,
        }
    }

    /// Counts one occurrence of `key`, a borrowed form of a `K` that
    /// `owned` makes only when the key is not watched yet: offering a key
    /// already watched allocates nothing. O(1) for a watched key or while
    /// there is room; O(capacity) (a scan for the smallest counter)
    /// otherwise.
    pub(crate) fn offer<Q>(&mut self, key: &Q, owned: impl FnOnce(&Q) -> K)
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        self.offers = self.offers.saturating_add(1);
        if let Some(&at) = self.index.get(key) {
            let counter = &mut self.counters[at];
            counter.count = counter.count.saturating_add(1);
            return;
        }
        let key = owned(key);
        if self.counters.len() < self.capacity {
            self.index.insert(key.clone(), self.counters.len());
            self.counters.push(Counter {
                key,
                count: 1,
                error: 0,
            });
            return;
        }
        let (at, smallest) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
            .map(|(at, c)| (at, c.count))
            .expect("capacity is at least one and the counters are full");
        self.index.remove(&self.counters[at].key);
        self.index.insert(key.clone(), at);
        self.counters[at] = Counter {
            key,
            count: smallest.saturating_add(1),
            error: smallest,
        };
    }

    /// The counters, largest count first (ties: smallest error first).
    pub(crate) fn top(&self) -> Vec<&Counter<K>> {
        let mut top: Vec<&Counter<K>> = self.counters.iter().collect();
        top.sort_by(|a, b| b.count.cmp(&a.count).then(a.error.cmp(&b.error)));
        top
    }

    /// How many counters it keeps.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Offers so far.
    pub(crate) fn offers(&self) -> u64 {
        self.offers
    }

    /// The most any count may overstate its key's: the smallest counter once
    /// every counter is taken (at most `offers / capacity`), 0 before (every
    /// count is then exact).
    pub(crate) fn max_error(&self) -> u64 {
        if self.counters.len() < self.capacity {
            return 0;
        }
        self.counters.iter().map(|c| c.count).min().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*), so a failure repeats.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    /// A skewed stream: key `i` of `keys` drawn with weight about 1/(i+1).
    fn zipf_stream(keys: u64, length: usize, seed: u64) -> Vec<u64> {
        let weights: Vec<f64> = (0..keys).map(|i| 1.0 / (i + 1) as f64).collect();
        let total: f64 = weights.iter().sum();
        let mut rng = Rng(seed);
        (0..length)
            .map(|_| {
                let mut pick = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
                for (key, weight) in weights.iter().enumerate() {
                    if pick < *weight {
                        return key as u64;
                    }
                    pick -= weight;
                }
                keys - 1
            })
            .collect()
    }

    #[test]
    fn counts_are_exact_while_there_is_room() {
        let mut top = SpaceSaving::new(4);
        for key in ["a", "b", "a", "c", "a", "b"] {
            top.offer(&key, |k| *k);
        }
        let got: Vec<(&str, u64, u64)> = top
            .top()
            .iter()
            .map(|c| (c.key, c.count, c.error))
            .collect();
        assert_eq!(got, [("a", 3, 0), ("b", 2, 0), ("c", 1, 0)]);
        assert_eq!(top.max_error(), 0);
        assert_eq!(top.offers(), 6);
    }

    #[test]
    fn a_new_key_takes_over_the_smallest_counter() {
        let mut top = SpaceSaving::new(2);
        for key in ["a", "a", "a", "b", "c"] {
            top.offer(&key, |k| *k);
        }
        // "c" replaced "b" (count 1) and inherited its count as its error.
        let got: Vec<(&str, u64, u64)> = top
            .top()
            .iter()
            .map(|c| (c.key, c.count, c.error))
            .collect();
        assert_eq!(got, [("a", 3, 0), ("c", 2, 1)]);
        assert_eq!(top.max_error(), 2);
    }

    #[test]
    fn memory_stays_bounded_and_the_error_bound_holds() {
        for (capacity, keys, seed) in [(8, 1_000, 1), (64, 10_000, 7), (64, 50, 42), (1, 20, 3)] {
            let stream = zipf_stream(keys, 20_000, seed);
            let mut top = SpaceSaving::new(capacity);
            let mut truth: HashMap<u64, u64> = HashMap::new();
            for &key in &stream {
                top.offer(&key, |k| *k);
                *truth.entry(key).or_default() += 1;
                assert!(top.counters.len() <= capacity);
                assert!(top.index.len() <= capacity);
            }
            let n = stream.len() as u64;
            let max_error = top.max_error();
            assert!(
                max_error <= n / capacity as u64,
                "{max_error} > {n}/{capacity}"
            );
            for counter in top.top() {
                let exact = truth[&counter.key];
                assert!(counter.count >= exact, "{counter:?} under {exact}");
                assert!(
                    counter.count - counter.error <= exact,
                    "{counter:?} vs {exact}"
                );
                assert!(counter.error <= max_error, "{counter:?}");
            }
            // Every key seen more often than the bound is watched.
            for (key, &exact) in &truth {
                if exact > max_error {
                    assert!(top.index.contains_key(key), "{key} ({exact}) missed");
                }
            }
        }
    }

    #[test]
    fn heavy_hitters_come_first_in_a_noisy_stream() {
        // Three keys offered 2,000, 1,000 and 500 times among 8,500 offers of
        // 5,000 light keys: all three are above N / capacity = 375.
        let mut rng = Rng(99);
        let mut top = SpaceSaving::new(32);
        for i in 0..12_000u64 {
            let key = if i % 6 == 0 {
                1_000_000
            } else if i % 12 == 1 {
                1_000_001
            } else if i % 24 == 2 {
                1_000_002
            } else {
                rng.next() % 5_000
            };
            top.offer(&key, |k| *k);
        }
        let first: Vec<u64> = top.top().iter().take(3).map(|c| c.key).collect();
        assert_eq!(first, [1_000_000, 1_000_001, 1_000_002]);
        for counter in top.top().iter().take(3) {
            assert!(
                counter.count - counter.error
                    <= [2_000, 1_000, 500][(counter.key - 1_000_000) as usize]
            );
        }
    }
}
