//! The programs lab's plots: one PNG per program, throughput (median, min–max whiskers) and
//! p99 latency per engine, the two distributions side by side.
//!
//! Owns: drawing. Calls: crate::plot for the font.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::report::Summary;

fn color(engine: &str) -> RGBColor {
    match engine {
        "tierswap" => RGBColor(0x1f, 0x77, 0xb4),
        "kernel-zswap" => RGBColor(0xff, 0x7f, 0x0e),
        "kernel-disk" => RGBColor(0x8c, 0x56, 0x4b),
        "kernel-zram" => RGBColor(0x2c, 0xa0, 0x2c),
        "unconstrained" => RGBColor(0x7f, 0x7f, 0x7f),
        _ => RGBColor(0x94, 0x67, 0xbd),
    }
}

/// Writes `DIR/programs-<program>.png` for every program in `summaries`; returns the files.
pub fn write_plots(dir: &Path, title: &str, summaries: &[Summary]) -> Result<Vec<PathBuf>, String> {
    crate::plot::register_font()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut programs: Vec<&str> = Vec::new();
    for s in summaries {
        if !programs.contains(&s.program.as_str()) {
            programs.push(&s.program);
        }
    }
    let mut files = Vec::new();
    for p in programs {
        let rows: Vec<&Summary> = summaries.iter().filter(|s| s.program == p).collect();
        let path = dir.join(format!("programs-{p}.png"));
        draw(&path, p, title, &rows).map_err(|e| format!("cannot draw {}: {e}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;
type Metric = (&'static str, fn(&Summary) -> (f64, f64, f64));

fn draw(path: &Path, program: &str, title: &str, rows: &[&Summary]) -> DrawResult {
    let label_lines = rows.iter().map(|s| s.engine.split(':').count() + 1).max().unwrap_or(2) as u32;
    let width = 1200.max(rows.len() as u32 * 150 * 2 + 160);
    let strip_px = 8 + label_lines * 17;
    let root = BitMapBackend::new(path, (width, 70 + 440 + strip_px)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(70);
    head.draw(&Text::new(program.to_string(), (20, 10), ("sans-serif", 20).into_font()))?;
    head.draw(&Text::new(title.to_string(), (20, 40), ("sans-serif", 13).into_font()))?;
    let metrics: [Metric; 2] = [
        ("requests per second, median and min–max", |s| {
            (s.throughput_rps.median, s.throughput_rps.min, s.throughput_rps.max)
        }),
        ("p99 latency (µs), median of runs", |s| (s.p99_us, s.p99_us, s.p99_us)),
    ];
    for (panel, (label, get)) in body.split_evenly((1, 2)).iter().zip(metrics) {
        let top = rows.iter().map(|s| get(s).2).filter(|v| v.is_finite()).fold(0.0f64, f64::max).max(1e-9) * 1.15;
        let n = rows.len();
        let (upper, strip) = panel.split_vertically(panel.dim_in_pixel().1 - strip_px);
        let mut chart = ChartBuilder::on(&upper)
            .margin(16)
            .margin_bottom(4)
            .caption(label, ("sans-serif", 16))
            .x_label_area_size(4)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..n as f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .y_label_formatter(&|y| format!("{y:.0}"))
            .y_label_style(("sans-serif", 13))
            .draw()?;
        for (i, s) in rows.iter().enumerate() {
            let (med, lo, hi) = get(s);
            if !med.is_finite() {
                continue;
            }
            chart.draw_series(std::iter::once(Rectangle::new(
                [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, med)],
                color(&s.engine).filled(),
            )))?;
            let c = i as f64 + 0.5;
            if hi > lo {
                let style = BLACK.stroke_width(2);
                chart.draw_series(std::iter::once(PathElement::new(vec![(c, lo), (c, hi)], style)))?;
            }
            chart.draw_series(std::iter::once(Text::new(
                format!("{med:.0}"),
                (i as f64 + 0.15, hi + top * 0.035),
                ("sans-serif", 13).into_font(),
            )))?;
            let x = chart.backend_coord(&(i as f64 + 0.15, 0.0)).0 - strip.get_base_pixel().0;
            let parts = s.engine.split(':').chain(std::iter::once(s.distribution.as_str()));
            for (k, part) in parts.enumerate() {
                let y = 4 + k as u32 * 17;
                strip.draw(&Text::new(part.to_string(), (x, y as i32), ("sans-serif", 13).into_font()))?;
            }
        }
    }
    root.present()?;
    Ok(())
}
