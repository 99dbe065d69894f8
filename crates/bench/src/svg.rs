//! The benchmarks' SVG plots: one palette, one chart style, lines with
//! their points and a legend. SVG needs no fonts on the machine, which
//! keeps the benchmarks runnable on a bare server.

use std::ops::Range;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// Speculation off (plain decoding).
pub const OFF: RGBColor = RGBColor(120, 120, 120);
/// Speculation on (automatic).
pub const AUTO: RGBColor = RGBColor(31, 119, 180);
/// The llama.cpp peer.
pub const PEER: RGBColor = RGBColor(214, 39, 40);

pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A panel with f64 axes.
pub type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

pub fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

/// What a line panel shows.
pub struct Axes<'f> {
    pub title: &'f str,
    pub x_desc: &'f str,
    pub y_desc: &'f str,
    pub x: Range<f64>,
    /// The y axis runs from 0 to this.
    pub y_max: f64,
    /// How many x labels, and how each reads.
    pub x_labels: usize,
    pub x_format: &'f dyn Fn(&f64) -> String,
}

/// A panel with its caption, mesh and axis descriptions, ready for lines.
pub fn line_chart<'a, 'b>(area: &'a Area<'b>, axes: &Axes) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .caption(axes.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(axes.x.clone(), 0f64..axes.y_max.max(1e-9))
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_labels(axes.x_labels)
        .x_label_formatter(axes.x_format)
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// A line through `points`, a dot on each, and its legend entry.
pub fn line(chart: &mut Chart, name: &str, color: RGBColor, points: &[(f64, f64)]) -> Result<()> {
    chart
        .draw_series(LineSeries::new(points.to_vec(), color.stroke_width(2)))
        .map_err(err)?
        .label(name)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
        .map_err(err)?;
    Ok(())
}

/// The legend of every labelled series, top left.
pub fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)
}

/// The largest y of `series`, with headroom for the legend (at least `floor`).
pub fn y_max<'p>(series: impl IntoIterator<Item = &'p [(f64, f64)]>, floor: f64) -> f64 {
    series
        .into_iter()
        .flatten()
        .map(|p| p.1)
        .filter(|y| y.is_finite())
        .fold(floor, f64::max)
        * 1.15
}
