//! The passes as a table per request rate, JSON records with `vllm bench
//! serve`'s field names, and an SVG of throughput and p99 TPOT against the
//! request rate, all from the same [`Metrics`].

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;
use serde_json::{Map, Value, json};

use super::Pass;
use super::arrivals::Rate;
use super::stats::{Metrics, Quantiles, Slo, metrics};
use crate::client::Mode;
use crate::svg::{AUTO, Axes, OFF, legend, line, line_chart, y_max};
use crate::table::Table;

/// What every pass of a run shares.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub burstiness: f64,
    pub max_concurrency: Option<usize>,
    pub slo: Option<Slo>,
}

/// The metrics of `passes` pooled: every request, over their summed
/// durations.
pub fn pooled(passes: &[&Pass], slo: Option<&Slo>) -> Metrics {
    let done: Vec<_> = passes.iter().flat_map(|p| p.completed()).collect();
    let failed = passes.iter().map(|p| p.failures.len()).sum();
    let duration = passes.iter().map(|p| p.duration).sum();
    metrics(&done, failed, duration, slo)
}

/// One pass as a JSON object: `vllm bench serve`'s result fields, plus
/// `mode`, `repeat` and `mismatches`.
pub fn record(pass: &Pass, setup: &Setup) -> Value {
    let m = pooled(&[pass], setup.slo.as_ref());
    let mut v = Map::new();
    let mut put = |k: &str, value: Value| {
        v.insert(k.to_owned(), value);
    };
    put("request_rate", json!(pass.rate));
    put("burstiness", json!(setup.burstiness));
    put("max_concurrency", json!(setup.max_concurrency));
    put("mode", json!(pass.mode));
    put("repeat", json!(pass.repeat));
    put("completed", json!(m.completed));
    put("failed", json!(m.failed));
    put("duration", json!(m.duration));
    put("total_output_tokens", json!(m.total_output_tokens));
    put("request_throughput", json!(m.request_throughput));
    put("output_throughput", json!(m.output_throughput));
    put("request_goodput", json!(m.request_goodput));
    put("tokens_per_step", json!(m.tokens_per_step));
    put("tree_wait_ms_per_step", json!(m.tree_wait_ms_per_step));
    for (name, q) in [
        ("ttft", m.ttft),
        ("tpot", m.tpot),
        ("itl", m.itl),
        ("e2el", m.e2el),
    ] {
        put(&format!("mean_{name}_ms"), json!(q.mean));
        put(&format!("median_{name}_ms"), json!(q.median));
        put(&format!("p90_{name}_ms"), json!(q.p90));
        put(&format!("p99_{name}_ms"), json!(q.p99));
    }
    put("mismatches", json!(pass.mismatches));
    Value::Object(v)
}

/// The passes at one rate, repeats pooled: a row per mode, then auto's
/// ratio to off for the throughputs and TPOT.
pub fn table(passes: &[&Pass], setup: &Setup) -> Table {
    let slo = setup.slo.as_ref();
    let mut header = vec![
        "mode",
        "completed",
        "failed",
        "req/s",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "TPOT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "E2EL p50 ms",
        "E2EL p99 ms",
        "τ",
        "tree wait ms/step",
    ];
    if slo.is_some() {
        header.push("goodput req/s");
    }
    let mut t = Table::new(&header);
    let of = |mode: Mode| {
        let ps: Vec<&Pass> = passes.iter().copied().filter(|p| p.mode == mode).collect();
        pooled(&ps, slo)
    };
    let (off, auto) = (of(Mode::Off), of(Mode::Auto));
    let ms = |q: Quantiles| [format!("{:.1}", q.median), format!("{:.1}", q.p99)];
    for (mode, m) in [(Mode::Off, &off), (Mode::Auto, &auto)] {
        let mut row = vec![
            mode.name().to_owned(),
            m.completed.to_string(),
            m.failed.to_string(),
            format!("{:.2}", m.request_throughput),
            format!("{:.1}", m.output_throughput),
        ];
        for q in [m.ttft, m.tpot, m.itl, m.e2el] {
            row.extend(ms(q));
        }
        let or_dash =
            |v: Option<f64>, digits: usize| v.map_or("—".into(), |v| format!("{v:.digits$}"));
        row.push(or_dash(m.tokens_per_step, 2));
        row.push(or_dash(m.tree_wait_ms_per_step, 2));
        row.extend(m.request_goodput.map(|g| format!("{g:.2}")));
        t.row(row);
    }
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}x", a / b)
        } else {
            "—".into()
        }
    };
    let mut row = vec!["auto/off".to_owned(), String::new(), String::new()];
    row.push(ratio(auto.request_throughput, off.request_throughput));
    row.push(ratio(auto.output_throughput, off.output_throughput));
    row.extend([String::new(), String::new()]);
    row.push(ratio(auto.tpot.median, off.tpot.median));
    row.push(ratio(auto.tpot.p99, off.tpot.p99));
    row.extend(std::iter::repeat_n(String::new(), header.len() - row.len()));
    t.row(row);
    t
}

/// Auto's output throughput over off's in each repetition at one rate,
/// with their median: the number a closed-loop comparison reports, since
/// pooled passes hide how far single repetitions swing. `None` with no
/// repetition holding both modes.
pub fn repeat_ratios(passes: &[&Pass], slo: Option<&Slo>) -> Option<String> {
    let repeats = passes.iter().map(|p| p.repeat).max()?;
    let mut ratios: Vec<f64> = (1..=repeats)
        .filter_map(|r| {
            let of = |mode: Mode| {
                let ps: Vec<&Pass> = passes
                    .iter()
                    .copied()
                    .filter(|p| p.repeat == r && p.mode == mode)
                    .collect();
                (!ps.is_empty()).then(|| pooled(&ps, slo).output_throughput)
            };
            let (off, auto) = (of(Mode::Off)?, of(Mode::Auto)?);
            (off > 0.0).then(|| auto / off)
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    let median = if n % 2 == 1 {
        ratios[n / 2]
    } else {
        (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
    };
    Some(format!(
        "auto/off output tok/s by repetition: {} (median {median:.2}x)",
        each.join(", ")
    ))
}

/// One panel of the plot: a metric against the request rate.
struct Panel {
    title: &'static str,
    y_desc: &'static str,
    pick: fn(&Metrics) -> f64,
}

/// Two panels: output tok/s and p99 TPOT against the request rate, a line
/// per mode. The rates sit evenly spaced, labelled (`inf` last).
pub fn plot(path: &Path, rates: &[Rate], passes: &[Pass], setup: &Setup) -> Result<()> {
    let root = SVGBackend::new(path, (1100, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(crate::svg::err)?;
    let (top, bottom) = root.split_vertically(450);
    let series = |mode: Mode, pick: fn(&Metrics) -> f64| -> Vec<(f64, f64)> {
        rates
            .iter()
            .enumerate()
            .filter_map(|(i, &rate)| {
                let ps: Vec<&Pass> = passes
                    .iter()
                    .filter(|p| p.rate == rate && p.mode == mode)
                    .collect();
                (!ps.is_empty()).then(|| (i as f64, pick(&pooled(&ps, setup.slo.as_ref()))))
            })
            .collect()
    };
    let labels: Vec<String> = rates.iter().map(|r| r.label()).collect();
    let x_format = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    let panels = [
        Panel {
            title: "Output tok/s against request rate (greedy)",
            y_desc: "tok/s",
            pick: |m| m.output_throughput,
        },
        Panel {
            title: "p99 TPOT against request rate",
            y_desc: "ms per output token",
            pick: |m| m.tpot.p99,
        },
    ];
    for (area, panel) in [&top, &bottom].into_iter().zip(panels) {
        let (off, auto) = (
            series(Mode::Off, panel.pick),
            series(Mode::Auto, panel.pick),
        );
        let mut chart = line_chart(
            area,
            &Axes {
                title: panel.title,
                x_desc: "request rate (requests/s)",
                y_desc: panel.y_desc,
                x: -0.5..rates.len() as f64 - 0.5,
                y_max: y_max([off.as_slice(), auto.as_slice()], 0.0),
                x_labels: rates.len().max(2) * 4,
                x_format: &x_format,
            },
        )?;
        line(&mut chart, "speculation off", OFF, &off)?;
        line(&mut chart, "speculation auto", AUTO, &auto)?;
        legend(&mut chart)?;
    }
    root.present().map_err(crate::svg::err)?;
    Ok(())
}
