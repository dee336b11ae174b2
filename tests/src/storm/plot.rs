//! The storm's picture: how many nodes are in each phase over time, drawn
//! as SVG with plotters (no font or image library needed on the machine).

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use super::node::{Outcome, Phase, Spec};

/// The phase `outcome` was in at `t` (`None`: not powered on yet, or lost
/// before its first phase).
fn phase_at(outcome: &Outcome, t: Duration) -> Option<Phase> {
    outcome
        .phases
        .iter()
        .filter(|(_, at)| *at <= t)
        .map(|(p, _)| *p)
        .max()
}

/// Writes `path`: one line per phase, nodes in it against seconds.
pub fn phases(
    path: &Path,
    outcomes: &[(Spec, Outcome)],
    run: Duration,
    nodes: usize,
) -> Result<()> {
    let end = run.as_secs_f64().max(1.0);
    let steps = 400usize;
    let series: Vec<(Phase, Vec<(f64, f64)>)> = Phase::ALL
        .iter()
        .map(|&phase| {
            let points = (0..=steps)
                .map(|i| {
                    let t = end * i as f64 / steps as f64;
                    let d = Duration::try_from_secs_f64(t).unwrap_or_default();
                    let count = outcomes
                        .iter()
                        .filter(|(_, o)| phase_at(o, d) == Some(phase))
                        .count();
                    (t, count as f64)
                })
                .collect();
            (phase, points)
        })
        .collect();
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Boot storm: {nodes} nodes, nodes per phase"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..end, 0f64..(nodes as f64 * 1.05).max(1.0))
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since power-on")
        .y_desc("nodes")
        .draw()
        .map_err(|e| draw(&e))?;
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(23, 190, 207),
    ];
    for ((phase, points), color) in series.into_iter().zip(colors) {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| draw(&e))?
            .label(phase.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}
