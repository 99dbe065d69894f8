//! The process's own memory, for the "weights and resident size" line a
//! service prints at start and `bench-model` reports.

/// Resident set size of this process in bytes (Linux: `VmRSS` of
/// `/proc/self/status`; `None` where it cannot be read).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// "weights 1,117 MB, resident 1,203 MB": one line for a start-up log.
pub fn memory_line(weight_bytes: usize) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    match resident_bytes() {
        Some(rss) => format!(
            "weights {:.0} MB, resident {:.0} MB",
            mb(weight_bytes as u64),
            mb(rss)
        ),
        None => format!("weights {:.0} MB", mb(weight_bytes as u64)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn resident_size_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            let rss = super::resident_bytes().unwrap();
            assert!(rss > 1 << 20, "{rss}");
        }
    }
}
