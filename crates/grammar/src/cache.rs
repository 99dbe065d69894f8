//! Compiled grammars kept for reuse: an agent sends the same schema and
//! tools every turn, and compiling costs milliseconds where starting a
//! constraint from a compiled one costs a copy. Least recently used first
//! out; the entry keeps its spec so a hash collision is a miss, never the
//! wrong grammar.

use std::collections::HashMap;
use std::sync::Mutex;

use llguidance::Matcher;

use crate::Structured;

pub(crate) struct Cache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    tick: u64,
    entries: HashMap<u64, Entry>,
}

struct Entry {
    spec: Structured,
    matcher: Matcher,
    used: u64,
}

impl Cache {
    pub(crate) fn new(capacity: usize) -> Cache {
        Cache {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub(crate) fn get(&self, key: u64, spec: &Structured) -> Option<Matcher> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.tick += 1;
        let tick = inner.tick;
        let e = inner.entries.get_mut(&key).filter(|e| e.spec == *spec)?;
        e.used = tick;
        Some(e.matcher.clone())
    }

    pub(crate) fn put(&self, key: u64, spec: Structured, matcher: Matcher) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.tick += 1;
        let used = inner.tick;
        if inner.entries.len() >= self.capacity
            && !inner.entries.contains_key(&key)
            && let Some(&oldest) = inner
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k)
        {
            inner.entries.remove(&oldest);
        }
        inner.entries.insert(
            key,
            Entry {
                spec,
                matcher,
                used,
            },
        );
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().unwrap().entries.len()
    }
}
