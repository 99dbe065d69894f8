//! One SVG with three panels: speedup per category, τ per category, and
//! aggregate tok/s against concurrency.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::Config;
use super::report::Summary;
use crate::svg::{AUTO, Area, Axes, OFF, PEER, err, legend, line, line_chart, y_max};

pub fn write(path: &Path, summary: &Summary) -> Result<()> {
    let root = SVGBackend::new(path, (1400, 1100)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(400);
    let (middle, bottom) = bottom.split_vertically(350);
    let cats: Vec<&str> = summary
        .categories
        .iter()
        .map(|c| c.category.as_str())
        .collect();

    let mut bars = vec![(
        "specmesh auto / off",
        AUTO,
        summary
            .categories
            .iter()
            .map(|c| c.speedup)
            .collect::<Vec<_>>(),
    )];
    if summary.categories.iter().any(|c| c.peer_best.is_some()) {
        bars.push((
            "llama.cpp best speculative / plain",
            PEER,
            summary
                .categories
                .iter()
                .map(|c| c.peer_best.map_or(0.0, |b| b.1))
                .collect(),
        ));
    }
    bar_panel(
        &top,
        "Speedup over plain decoding (greedy, batch 1)",
        &cats,
        &bars,
        Some(1.0),
    )?;
    bar_panel(
        &middle,
        "τ: tokens per verify step (bonus included)",
        &cats,
        &[(
            "specmesh auto",
            AUTO,
            summary.categories.iter().map(|c| c.tau).collect(),
        )],
        Some(1.0),
    )?;
    concurrency_panel(&bottom, summary)?;
    root.present().map_err(err)?;
    Ok(())
}

fn bar_panel(
    area: &Area,
    title: &str,
    cats: &[&str],
    series: &[(&str, RGBColor, Vec<f64>)],
    reference: Option<f64>,
) -> Result<()> {
    let top = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .fold(reference.unwrap_or(0.0), f64::max)
        * 1.15;
    let n = cats.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top.max(0.1))
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                cats[i as usize].to_string()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 11))
        .draw()
        .map_err(err)?;
    let width = 0.8 / series.len() as f64;
    for (s, (name, color, values)) in series.iter().enumerate() {
        let color = *color;
        chart
            .draw_series(values.iter().enumerate().map(|(i, &v)| {
                let x0 = i as f64 - 0.4 + s as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], color.filled())
            }))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    if let Some(r) = reference {
        chart
            .draw_series(LineSeries::new(
                [(-0.5, r), (n as f64 - 0.5, r)],
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
    }
    legend(&mut chart)
}

fn concurrency_panel(area: &Area, summary: &Summary) -> Result<()> {
    let points = |cfg: Config| -> Vec<(f64, f64)> {
        summary
            .levels
            .iter()
            .filter(|l| l.config == cfg)
            .map(|l| (l.concurrency as f64, l.aggregate_tok_s))
            .collect()
    };
    let (off, auto) = (points(Config::Off), points(Config::Auto));
    let peer: Vec<(f64, f64)> = summary
        .categories
        .iter()
        .filter(|c| c.category == "overall")
        .filter_map(|c| c.tok_s.get(&Config::PeerPlain).map(|&t| (1.0, t)))
        .collect();
    let max_n = off.iter().map(|p| p.0).fold(1.0, f64::max);
    let mut chart = line_chart(
        area,
        &Axes {
            title: "Aggregate tok/s against concurrency (greedy)",
            x_desc: "concurrent requests",
            y_desc: "tok/s",
            x: 0.0..max_n.max(2.0) * 1.08,
            y_max: y_max([off.as_slice(), auto.as_slice(), peer.as_slice()], 1.0),
            x_labels: 12,
            x_format: &|x| format!("{x:.0}"),
        },
    )?;
    line(&mut chart, "specmesh off", OFF, &off)?;
    line(&mut chart, "specmesh auto", AUTO, &auto)?;
    if !peer.is_empty() {
        chart
            .draw_series(
                peer.iter()
                    .map(|&p| TriangleMarker::new(p, 7, PEER.filled())),
            )
            .map_err(err)?
            .label("llama.cpp plain (concurrency 1)")
            .legend(|(x, y)| TriangleMarker::new((x + 8, y), 6, PEER.filled()));
    }
    legend(&mut chart)
}
