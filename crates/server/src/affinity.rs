//! `--cpus`: the CPU cores a service runs on.
//!
//! On one machine the verifier and a drafter with a draft model compete
//! for the same cores; giving each its own (`--cpus 0` and `--cpus 1`)
//! keeps a draft forward from slowing a verify forward down. The set is
//! applied to every thread of the process when it starts (threads created
//! later inherit it), so compute pools sized from
//! `std::thread::available_parallelism` see only these cores, and
//! `--threads` defaults to their number.
//!
//! Uses `nix`'s safe `sched_setaffinity` (Linux only); elsewhere `--cpus`
//! is refused at start-up rather than ignored.

use std::fmt;
use std::str::FromStr;

/// A set of CPU ids, as `0`, `0-3` or `0,2-3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(Vec<usize>);

/// Why a `--cpus` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    #[error("`{0}` is not a CPU id or a range like 0-3")]
    Syntax(String),
    #[error("the range `{0}` is empty (its start is after its end)")]
    EmptyRange(String),
    #[error("CPU {id} does not exist here (ids go up to {max})")]
    NoSuchCpu { id: usize, max: usize },
    #[error("setting the CPU affinity failed: {0}")]
    Affinity(String),
    #[error("--cpus is only supported on Linux")]
    Unsupported,
}

/// Largest CPU id accepted (the kernel's `CpuSet` holds 1024).
const MAX_CPU: usize = 1023;

impl FromStr for CpuList {
    type Err = CpuListError;

    fn from_str(s: &str) -> Result<CpuList, CpuListError> {
        let mut ids = Vec::new();
        for part in s.split(',').map(str::trim) {
            let id = |t: &str| {
                t.trim()
                    .parse::<usize>()
                    .map_err(|_| CpuListError::Syntax(part.to_owned()))
            };
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (id(a)?, id(b)?),
                None => {
                    let n = id(part)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(CpuListError::EmptyRange(part.to_owned()));
            }
            if hi > MAX_CPU {
                return Err(CpuListError::NoSuchCpu {
                    id: hi,
                    max: MAX_CPU,
                });
            }
            ids.extend(lo..=hi);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(CpuList(ids))
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<String> = self.0.iter().map(usize::to_string).collect();
        f.write_str(&ids.join(","))
    }
}

impl CpuList {
    pub fn ids(&self) -> &[usize] {
        &self.0
    }

    /// Pins every thread of this process to these CPUs.
    #[cfg(target_os = "linux")]
    pub fn apply(&self) -> Result<(), CpuListError> {
        use nix::sched::{CpuSet, sched_setaffinity};
        use nix::unistd::Pid;
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut set = CpuSet::new();
        for &id in &self.0 {
            set.set(id).map_err(|_| CpuListError::NoSuchCpu {
                id,
                max: CpuSet::count() - 1,
            })?;
        }
        let tasks = std::fs::read_dir("/proc/self/task")
            .map_err(|e| CpuListError::Affinity(format!("listing /proc/self/task: {e}")))?;
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<i32>().ok())
            else {
                continue;
            };
            match sched_setaffinity(Pid::from_raw(tid), &set) {
                Ok(()) => {}
                // The thread ended since the listing: nothing to pin.
                Err(nix::errno::Errno::ESRCH) => {}
                Err(nix::errno::Errno::EINVAL) => {
                    return Err(CpuListError::NoSuchCpu {
                        id: self.0.last().copied().unwrap_or(0),
                        max: online.saturating_sub(1),
                    });
                }
                Err(e) => return Err(CpuListError::Affinity(e.to_string())),
            }
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub fn apply(&self) -> Result<(), CpuListError> {
        Err(CpuListError::Unsupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_parse() {
        assert_eq!("0".parse::<CpuList>().unwrap().ids(), [0]);
        assert_eq!("0-2".parse::<CpuList>().unwrap().ids(), [0, 1, 2]);
        assert_eq!("3, 0-1,1".parse::<CpuList>().unwrap().ids(), [0, 1, 3]);
        assert_eq!("0-1,3".parse::<CpuList>().unwrap().to_string(), "0,1,3");
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        assert_eq!(
            "a".parse::<CpuList>().unwrap_err().to_string(),
            "`a` is not a CPU id or a range like 0-3"
        );
        assert!(matches!(
            "3-1".parse::<CpuList>(),
            Err(CpuListError::EmptyRange(_))
        ));
        assert!(matches!(
            "5000".parse::<CpuList>(),
            Err(CpuListError::NoSuchCpu { id: 5000, .. })
        ));
        assert!("".parse::<CpuList>().is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pinning_limits_what_the_process_sees() {
        use nix::sched::sched_getaffinity;
        use nix::unistd::Pid;
        let before = sched_getaffinity(Pid::from_raw(0)).unwrap();
        "0".parse::<CpuList>().unwrap().apply().unwrap();
        assert_eq!(std::thread::available_parallelism().unwrap().get(), 1);
        // Threads started after the pin inherit it.
        let seen = std::thread::spawn(|| std::thread::available_parallelism().unwrap().get());
        assert_eq!(seen.join().unwrap(), 1);
        // Restore the harness's own set for the other tests.
        let all: Vec<String> = (0..nix::sched::CpuSet::count())
            .filter(|&i| before.is_set(i).unwrap_or(false))
            .map(|i| i.to_string())
            .collect();
        all.join(",").parse::<CpuList>().unwrap().apply().unwrap();
    }
}
