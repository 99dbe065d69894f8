//! Reading a service's Prometheus `/metrics` the way Prometheus does: over
//! HTTP (curl), as text.

use std::process::Command;

/// The sum of every sample of `name` at `url` whose labels contain
/// `labels` ("" for all): a counter, or a histogram's `_count`.
pub fn metric(url: &str, name: &str, labels: &str) -> f64 {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .expect("running curl");
    assert!(out.status.success(), "scraping {url}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split([' ', '{']).next() == Some(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
