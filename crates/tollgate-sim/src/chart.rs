use plotters::prelude::*;

use crate::{Replay, Timeline};
use tollgate_core::format_duration;

/// Width and height of the chart, in pixels.
const SIZE: (u32, u32) = (1100, 650);

/// Line colours, one per algorithm in turn (Tableau's palette, without its
/// yellow, which is hard to see on white).
const COLOURS: [RGBColor; 8] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xff, 0x9d, 0xa7),
];

/// A chart that plotters could not draw.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot draw the chart: {message}")]
pub struct ChartError {
    /// What plotters reported.
    pub message: String,
}

fn chart_error(e: impl std::fmt::Display) -> ChartError {
    ChartError {
        message: e.to_string(),
    }
}

/// The rate in each bucket of `timeline` as a step line: `(time in seconds
/// from the start, requests per second)` at both ends of every bucket.
fn steps(timeline: &Timeline) -> Vec<(f64, f64)> {
    let width = timeline.bucket as f64 / 1e9;
    timeline
        .counts
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| {
            let rate = n as f64 / width;
            [(i as f64 * width, rate), ((i + 1) as f64 * width, rate)]
        })
        .collect()
}

/// The x axis's description: where time starts and how wide the buckets are.
fn x_desc(timeline: &Timeline) -> String {
    let bucket = format_duration(timeline.bucket);
    match timeline.start {
        0 => format!("time (s), buckets of {bucket}"),
        start => format!("time since {start} ns (s), buckets of {bucket}"),
    }
}

/// Draws the admitted rate over time of each replay, one line per algorithm,
/// under the offered rate (every request of the trace) as a dashed line, and
/// returns the SVG text.
///
/// The rate in a bucket is the requests admitted in it divided by its width,
/// in requests per second. All timelines must come from one [`Simulation`], so
/// that their buckets line up. Lines are drawn from the widest to the thinnest
/// in the order given, so that algorithms that admit the same requests (the
/// token bucket, GCRA and the policing leaky bucket always do) stay visible
/// one inside the other.
///
/// [`Simulation`]: crate::Simulation
pub fn draw_chart(
    title: &str,
    offered: &Timeline,
    replays: &[Replay],
) -> Result<String, ChartError> {
    let offered_rates = steps(offered);
    let lines: Vec<(&str, Vec<(f64, f64)>)> = replays
        .iter()
        .map(|r| (r.report.algorithm.name(), steps(&r.admitted)))
        .collect();
    let x_max = (offered.counts.len() as f64 * offered.bucket as f64 / 1e9).max(1e-9);
    let y_max = offered_rates
        .iter()
        .chain(lines.iter().flat_map(|(_, points)| points))
        .map(|&(_, y)| y)
        .fold(1.0, f64::max)
        // Head room for the legend in the upper right.
        * 1.5;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(chart_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(chart_error)?;
        chart
            .configure_mesh()
            .x_desc(x_desc(offered))
            .y_desc("requests per second")
            .axis_desc_style(("sans-serif", 16))
            .draw()
            .map_err(chart_error)?;

        let count = lines.len();
        for (i, (name, points)) in lines.into_iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            // Saturates only with thousands of lines.
            let width = u32::try_from(2 + 2 * (count - 1 - i)).unwrap_or(u32::MAX);
            let style = colour.stroke_width(width);
            let legend_style = colour.stroke_width(3);
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(chart_error)?
                .label(format!("admitted: {name}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], legend_style));
        }

        let dashed = BLACK.stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new(offered_rates, 4, 3, dashed))
            .map_err(chart_error)?
            .label("offered (every request)")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], dashed));

        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(chart_error)?;
        root.present().map_err(chart_error)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Generator, Simulation, Trace, Workload};
    use std::time::Duration;
    use tollgate_core::{Algorithm, Quota};

    #[test]
    fn draws_one_line_per_algorithm_with_a_legend() {
        let mut g = Generator::new(Workload::BoundaryAttack);
        g.duration = Duration::from_secs(10);
        let trace = g.generate().unwrap();
        let sim = Simulation::new(&trace, g.quota);
        let replays: Vec<Replay> = Algorithm::RATE.iter().map(|&a| sim.run(a)).collect();
        let svg = draw_chart("boundary attack", &sim.offered(), &replays).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        for algorithm in Algorithm::RATE {
            assert!(
                svg.contains(&format!("admitted: {algorithm}")),
                "{algorithm}"
            );
        }
        assert!(svg.contains("requests per second"));
        assert!(svg.contains("buckets of 100ms"));
        assert!(svg.contains("offered (every request)"));
        // One step line per algorithm (the axes, the legend samples and the
        // dashes of the offered rate are polylines of two points).
        let data_lines = svg
            .split("<polyline")
            .skip(1)
            .filter(|line| line.split("points=").nth(1).unwrap().matches(',').count() > 10)
            .count();
        assert_eq!(data_lines, Algorithm::RATE.len());
    }

    #[test]
    fn an_empty_trace_draws_empty_axes() {
        let trace = Trace::new();
        let sim = Simulation::new(&trace, Quota::per_second(1).unwrap());
        let svg = draw_chart("empty", &sim.offered(), &[sim.run(Algorithm::Gcra)]).unwrap();
        assert!(svg.contains("admitted: gcra"));
    }
}
