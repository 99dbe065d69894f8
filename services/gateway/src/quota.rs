//! Per-tenant quotas: requests running at once, and tokens per minute,
//! the gateway's (`--tenant-max-concurrent`, `--tenant-tokens-per-minute`)
//! unless the key file gives a tenant its own (`concurrent=8 tpm=200000`).
//!
//! A tenant over either is refused with RESOURCE_EXHAUSTED and a
//! `retry-after` (seconds) in the trailers; other tenants are not touched,
//! so one tenant's flood cannot starve another (the gateway-wide
//! `--max-concurrent-requests` still bounds the total).
//!
//! Tokens are counted as they are used, not guessed up front: a request
//! is admitted while its tenant's balance is positive, pays for its prompt
//! then, and for its generated tokens when it ends. The balance refills at
//! the per-minute rate up to one minute's worth and may go below zero (a
//! long generation finishes; the tenant then waits until the refill brings
//! it back above zero). That debt is why this is a small bucket of our own
//! rather than `governor`: GCRA cannot charge after the fact, and charging
//! `max_new_tokens` up front would bill callers for tokens they never got.
//! Pure: the clock is passed in, unit-tested.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::auth::TenantLimits;

/// The limits, per tenant; `None`: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    pub max_concurrent: Option<usize>,
    pub tokens_per_minute: Option<u64>,
}

/// Why a tenant's request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("tenant `{tenant}` already runs {limit} requests, its limit; retry when one ends")]
    Concurrent { tenant: String, limit: usize },
    #[error("tenant `{tenant}` used its {limit} tokens per minute; retry in {}s", retry_after.as_secs())]
    Tokens {
        tenant: String,
        limit: u64,
        retry_after: Duration,
    },
}

impl QuotaError {
    /// The limit it hit, as `specmesh_quota_rejections_total` labels it.
    pub fn reason(&self) -> &'static str {
        match self {
            QuotaError::Concurrent { .. } => "concurrent",
            QuotaError::Tokens { .. } => "tokens",
        }
    }

    /// When the caller may try again, as `retry-after` says it (whole
    /// seconds, at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            QuotaError::Concurrent { .. } => 1,
            QuotaError::Tokens { retry_after, .. } => {
                retry_after.as_secs_f64().ceil().max(1.0) as u64
            }
        }
    }
}

/// Every tenant's use.
#[derive(Debug)]
pub struct Quotas {
    limits: QuotaLimits,
    tenants: Mutex<HashMap<String, Use>>,
    /// What other gateways report (see [`crate::peers`]).
    shared: Mutex<Shared>,
}

/// A tenant's use as this gateway reports it to its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalUse {
    pub tenant: String,
    /// Tokens charged here since start (only grows).
    pub tokens_total: u64,
    /// Requests running here now.
    pub running: u32,
    /// The tokens-per-minute limit applied here, if any.
    pub tokens_per_minute: Option<u64>,
}

/// This gateway's counters for its peers, and what they run.
#[derive(Debug, Default)]
struct Shared {
    /// Per tenant: tokens charged here since start, and the limit applied.
    totals: HashMap<String, (u64, Option<u64>)>,
    /// Per tenant: requests running on the other gateways, as last reported.
    remote_running: HashMap<String, usize>,
}

#[derive(Debug)]
struct Use {
    /// Tokens per minute this tenant refills at (its latest request's
    /// limit).
    per_minute: Option<u64>,
    running: usize,
    /// Tokens left, as of `at`; negative: owed.
    balance: f64,
    at: Instant,
}

/// A running request's hold on its tenant's quota: released on drop;
/// [`QuotaPermit::charge`] bills the tokens it generated.
#[derive(Debug)]
pub struct QuotaPermit {
    quotas: Arc<Quotas>,
    tenant: String,
}

impl Quotas {
    pub fn new(limits: QuotaLimits) -> Arc<Quotas> {
        Arc::new(Quotas {
            limits,
            tenants: Mutex::default(),
            shared: Mutex::default(),
        })
    }

    /// Admits a request of `tenant` (with its own limits `own`, unset
    /// ones the gateway's) with `prompt_tokens` at `now`, or says why not.
    pub fn admit(
        self: &Arc<Quotas>,
        tenant: &str,
        own: TenantLimits,
        prompt_tokens: u64,
        now: Instant,
    ) -> Result<QuotaPermit, QuotaError> {
        let limits = QuotaLimits {
            max_concurrent: own.concurrent.or(self.limits.max_concurrent),
            tokens_per_minute: own.tokens_per_minute.or(self.limits.tokens_per_minute),
        };
        let remote_running = self
            .lock_shared()
            .remote_running
            .get(tenant)
            .copied()
            .unwrap_or(0);
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let full = limits.tokens_per_minute.map_or(0.0, |t| t as f64);
        let entry = tenants.entry(tenant.to_string()).or_insert(Use {
            per_minute: limits.tokens_per_minute,
            running: 0,
            balance: full,
            at: now,
        });
        entry.per_minute = limits.tokens_per_minute;
        if let Some(limit) = limits.max_concurrent
            && entry.running + remote_running >= limit
        {
            return Err(QuotaError::Concurrent {
                tenant: tenant.to_string(),
                limit,
            });
        }
        if let Some(per_minute) = limits.tokens_per_minute {
            refill(entry, per_minute, now);
            if entry.balance <= 0.0 {
                // Until the refill brings the balance above zero.
                let seconds = (-entry.balance + 1.0) * 60.0 / per_minute as f64;
                return Err(QuotaError::Tokens {
                    tenant: tenant.to_string(),
                    limit: per_minute,
                    retry_after: Duration::from_secs_f64(seconds),
                });
            }
            entry.balance -= prompt_tokens as f64;
        }
        entry.running += 1;
        drop(tenants);
        self.count(tenant, prompt_tokens, limits.tokens_per_minute);
        Ok(QuotaPermit {
            quotas: Arc::clone(self),
            tenant: tenant.to_string(),
        })
    }

    fn lock_shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `tokens` to what this gateway reports it charged `tenant`.
    fn count(&self, tenant: &str, tokens: u64, per_minute: Option<u64>) {
        let mut shared = self.lock_shared();
        let total = shared.totals.entry(tenant.to_string()).or_insert((0, None));
        total.0 += tokens;
        total.1 = per_minute;
    }

    /// This gateway's own use, per tenant, for its peers.
    pub fn local_use(&self) -> Vec<LocalUse> {
        let running: HashMap<String, usize> = self
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(t, u)| (t.clone(), u.running))
            .collect();
        self.lock_shared()
            .totals
            .iter()
            .map(|(tenant, &(tokens_total, tokens_per_minute))| LocalUse {
                tenant: tenant.clone(),
                tokens_total,
                running: running.get(tenant).copied().unwrap_or(0) as u32,
                tokens_per_minute,
            })
            .collect()
    }

    /// Charges `tenant` the `tokens` it used on another gateway, whose limit
    /// for it is `per_minute` (none: nothing to charge).
    pub fn charge_remote(&self, tenant: &str, tokens: u64, per_minute: Option<u64>, now: Instant) {
        let Some(per_minute) = per_minute else {
            return;
        };
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        let entry = tenants.entry(tenant.to_string()).or_insert(Use {
            per_minute: Some(per_minute),
            running: 0,
            balance: per_minute as f64,
            at: now,
        });
        let per_minute = entry.per_minute.unwrap_or(per_minute);
        refill(entry, per_minute, now);
        entry.per_minute = Some(per_minute);
        entry.balance -= tokens as f64;
    }

    /// The requests each tenant runs on the other gateways, as they last
    /// reported them.
    pub fn set_remote_running(&self, running: HashMap<String, usize>) {
        self.lock_shared().remote_running = running;
    }

    /// Tenants with state kept (running, or owing / refilling).
    #[cfg(test)]
    fn tenants(&self) -> usize {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

fn refill(entry: &mut Use, per_minute: u64, now: Instant) {
    let elapsed = now.saturating_duration_since(entry.at).as_secs_f64();
    entry.balance = (entry.balance + elapsed * per_minute as f64 / 60.0).min(per_minute as f64);
    entry.at = now;
}

impl QuotaPermit {
    /// The tenant it holds for.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Bills `tokens` generated tokens to the tenant.
    pub fn charge(&self, tokens: u64) {
        let mut tenants = self
            .quotas
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut per_minute = None;
        if let Some(entry) = tenants.get_mut(&self.tenant)
            && entry.per_minute.is_some()
        {
            entry.balance -= tokens as f64;
            per_minute = entry.per_minute;
        }
        drop(tenants);
        self.quotas.count(&self.tenant, tokens, per_minute);
    }
}

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        let mut tenants = self
            .quotas
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(entry) = tenants.get_mut(&self.tenant) {
            let per_minute = entry.per_minute;
            entry.running = entry.running.saturating_sub(1);
            // A tenant with nothing running and a full bucket holds no
            // state: the map does not grow with every tenant ever seen.
            let full = match per_minute {
                Some(p) => {
                    refill(entry, p, now);
                    entry.balance >= p as f64
                }
                None => true,
            };
            if entry.running == 0 && full {
                tenants.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No limits of the tenant's own: the gateway's.
    const D: TenantLimits = TenantLimits {
        concurrent: None,
        tokens_per_minute: None,
    };

    #[test]
    fn a_tenants_own_limits_win_over_the_gateways() {
        let q = Quotas::new(QuotaLimits {
            max_concurrent: Some(1),
            tokens_per_minute: Some(100),
        });
        let now = Instant::now();
        let own = TenantLimits {
            concurrent: Some(3),
            tokens_per_minute: Some(10_000),
        };
        let held: Vec<_> = (0..3)
            .map(|_| q.admit("big", own, 500, now).unwrap())
            .collect();
        assert!(matches!(
            q.admit("big", own, 1, now),
            Err(QuotaError::Concurrent { limit: 3, .. })
        ));
        // Its bucket is its own size: 1500 of 10000 used.
        drop(held);
        assert!(q.admit("big", own, 8000, now).is_ok());
        // Another tenant gets the gateway's.
        let _one = q.admit("small", D, 1, now).unwrap();
        assert!(matches!(
            q.admit("small", D, 1, now),
            Err(QuotaError::Concurrent { limit: 1, .. })
        ));
        // A tenant with only a concurrency of its own keeps the gateway's
        // tokens per minute.
        let half = TenantLimits {
            concurrent: Some(5),
            tokens_per_minute: None,
        };
        let p = q.admit("mid", half, 150, now).unwrap();
        drop(p);
        assert!(matches!(
            q.admit("mid", half, 1, now),
            Err(QuotaError::Tokens { limit: 100, .. })
        ));
    }

    #[test]
    fn concurrency_is_per_tenant() {
        let q = Quotas::new(QuotaLimits {
            max_concurrent: Some(2),
            tokens_per_minute: None,
        });
        let now = Instant::now();
        let a1 = q.admit("a", D, 10, now).unwrap();
        let _a2 = q.admit("a", D, 10, now).unwrap();
        let refused = q.admit("a", D, 10, now).unwrap_err();
        assert_eq!(
            refused,
            QuotaError::Concurrent {
                tenant: "a".into(),
                limit: 2
            }
        );
        assert_eq!(refused.retry_after_secs(), 1);
        let _b = q
            .admit("b", D, 10, now)
            .expect("another tenant is not touched");
        drop(a1);
        let _a3 = q.admit("a", D, 10, now).expect("a slot freed");
    }

    #[test]
    fn tokens_are_billed_as_used_and_refill_per_minute() {
        let q = Quotas::new(QuotaLimits {
            max_concurrent: None,
            tokens_per_minute: Some(600),
        });
        let t0 = Instant::now();
        // A long generation runs the balance into debt: 100 + 900 = 1000
        // of 600, so 400 owed.
        let p = q.admit("a", D, 100, t0).unwrap();
        p.charge(900);
        let refused = q.admit("a", D, 1, t0).unwrap_err();
        let QuotaError::Tokens { retry_after, .. } = &refused else {
            panic!("{refused:?}")
        };
        // 401 tokens at 10 per second.
        assert!(
            (retry_after.as_secs_f64() - 40.1).abs() < 0.01,
            "{retry_after:?}"
        );
        assert_eq!(refused.retry_after_secs(), 41);
        assert!(
            q.admit("b", D, 100, t0).is_ok(),
            "another tenant has its own bucket"
        );
        assert!(q.admit("a", D, 1, t0 + Duration::from_secs(40)).is_err());
        assert!(q.admit("a", D, 1, t0 + Duration::from_secs(41)).is_ok());
    }

    #[test]
    fn idle_tenants_leave_no_state() {
        let q = Quotas::new(QuotaLimits {
            max_concurrent: Some(4),
            tokens_per_minute: Some(1_000_000),
        });
        let p = q.admit("a", D, 0, Instant::now()).unwrap();
        assert_eq!(q.tenants(), 1);
        drop(p);
        assert_eq!(q.tenants(), 0);
        let owing = q.admit("b", D, 0, Instant::now()).unwrap();
        owing.charge(500_000);
        drop(owing);
        assert_eq!(q.tenants(), 1, "a tenant that owes is remembered");
    }

    #[test]
    fn use_on_other_gateways_counts_here() {
        let q = Quotas::new(QuotaLimits {
            max_concurrent: Some(2),
            tokens_per_minute: Some(600),
        });
        let t0 = Instant::now();
        // The tenant ran one request elsewhere and used 550 tokens there.
        q.set_remote_running(HashMap::from([("a".to_string(), 1)]));
        q.charge_remote("a", 550, Some(600), t0);
        let p = q
            .admit("a", D, 40, t0)
            .expect("one running here, one there: 2");
        assert!(matches!(
            q.admit("a", D, 1, t0),
            Err(QuotaError::Concurrent { limit: 2, .. })
        ));
        drop(p);
        // 550 there + 40 here of 600: 10 left, then the bucket is empty.
        let p = q.admit("a", D, 20, t0).unwrap();
        drop(p);
        assert!(matches!(
            q.admit("a", D, 1, t0),
            Err(QuotaError::Tokens { .. })
        ));
        // What this gateway reports is its own use only.
        let mine = q.local_use();
        assert_eq!(
            mine,
            vec![LocalUse {
                tenant: "a".into(),
                tokens_total: 60,
                running: 0,
                tokens_per_minute: Some(600),
            }]
        );
        // A peer without a limit for the tenant charges nothing.
        q.charge_remote("b", 10_000, None, t0);
        assert!(q.admit("b", D, 1, t0).is_ok());
    }
}
