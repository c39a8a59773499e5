//! The latency chart: the acquire-latency CDFs of scenarios 1-3 as SVG.

use crate::report::Report;

pub(crate) fn chart(
    report: &Report,
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let groups = ["healthy", "latency", "blackholed", "paused (SIGSTOP)"];
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((2, 2));
    for (area, group) in areas.iter().zip(groups) {
        let curves: Vec<_> = report
            .curves
            .iter()
            .filter(|(l, _)| l.starts_with(&format!("{group}:")))
            .collect();
        if curves.is_empty() {
            continue;
        }
        let max_x = curves
            .iter()
            .flat_map(|(_, c)| c.iter().map(|p| p.0))
            .fold(0.01f64, f64::max);
        let min_x = curves
            .iter()
            .flat_map(|(_, c)| c.iter().map(|p| p.0))
            .fold(f64::INFINITY, f64::min)
            .max(0.01);
        let mut ctx = ChartBuilder::on(area)
            .caption(format!("acquire latency CDF: {group}"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d((min_x * 0.9..max_x * 1.1).log_scale(), 0f64..1f64)?;
        ctx.configure_mesh()
            .x_labels(8)
            .x_label_formatter(&|x| {
                let t = format!("{x:.2}");
                t.trim_end_matches('0').trim_end_matches('.').to_owned()
            })
            .light_line_style(WHITE)
            .x_desc("ms (log)")
            .y_desc("fraction")
            .draw()?;
        for (i, (label, points)) in curves.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            ctx.draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label.split(": ").nth(1).unwrap_or(label).to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
