//! Plots: one PNG per workload, median refault time and µs per page per engine with
//! min–max error bars, readable at a glance. A tierswap variant (`tierswap:policy=order0`)
//! is a bar of its own in a colour of its own, its label split at ':' onto lines.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::Summary;

/// The font the plots are drawn with (Debian's fonts-dejavu-core).
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

pub(crate) fn register_font() -> Result<(), String> {
    let bytes = std::fs::read(FONT_PATH)
        .map_err(|e| format!("plots need the DejaVu font at {FONT_PATH} ({e}): apt-get install fonts-dejavu-core"))?;
    // The font lives for the whole process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{FONT_PATH} is not a usable TrueType font"))
}

/// Colours of tierswap variants, in the order the variants first appear.
const VARIANT_COLORS: [RGBColor; 5] = [
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
];

/// The engine's colour; `variants` lists the tierswap variants of the whole report, so a
/// variant has the same colour in every workload's plot.
fn color(engine: &str, variants: &[&str]) -> RGBColor {
    match engine {
        "tierswap" => RGBColor(0x1f, 0x77, 0xb4),
        "kernel-zswap" => RGBColor(0xff, 0x7f, 0x0e),
        "kernel-zram" => RGBColor(0x2c, 0xa0, 0x2c),
        e => match variants.iter().position(|v| *v == e) {
            Some(i) => VARIANT_COLORS[i % VARIANT_COLORS.len()],
            None => RGBColor(0x7f, 0x7f, 0x7f),
        },
    }
}

/// Writes `DIR/<workload>.png` for every workload in `summaries`; returns the files.
pub fn write_plots(dir: &Path, title: &str, summaries: &[Summary]) -> Result<Vec<PathBuf>, String> {
    register_font()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut workloads: Vec<&str> = Vec::new();
    for s in summaries {
        if !workloads.contains(&s.workload.as_str()) {
            workloads.push(&s.workload);
        }
    }
    let mut variants: Vec<&str> = Vec::new();
    for s in summaries {
        if s.engine.starts_with("tierswap:") && !variants.contains(&s.engine.as_str()) {
            variants.push(&s.engine);
        }
    }
    let mut files = Vec::new();
    for w in workloads {
        let rows: Vec<&Summary> = summaries.iter().filter(|s| s.workload == w).collect();
        let path = dir.join(format!("{w}.png"));
        draw(&path, &format!("{w} — {title}"), &rows, &variants)
            .map_err(|e| format!("cannot draw {}: {e}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;
/// A plotted quantity: its axis label and (median, min, max) of a summary.
type Metric = (&'static str, fn(&Summary) -> (f64, f64, f64));

/// Heading font sizes: the workload's name, then the lab's settings.
const NAME_PX: u32 = 20;
const SETTINGS_PX: u32 = 13;
/// One engine label line below a bar.
const LABEL_LINE_PX: u32 = 18;

/// `text` broken at ", " into lines of at most `max_chars` characters.
fn wrap(text: &str, max_chars: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for part in text.split(", ") {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 2 + part.chars().count() <= max_chars => {
                line.push_str(", ");
                line.push_str(part);
            }
            _ => lines.push(part.to_string()),
        }
    }
    lines
}

fn draw(path: &Path, title: &str, rows: &[&Summary], variants: &[&str]) -> DrawResult {
    // About 140 px per bar in each of the two panels, so labels stay apart.
    let width = 1200.max(rows.len() as u32 * 280 + 160);
    let label_lines = rows.iter().map(|s| s.engine.split(':').count()).max().unwrap_or(1) as u32;
    // "workload — settings": the name large, the settings wrapped below it (a 13 px
    // character is about 7 px wide).
    let (name, settings) = title.split_once(" — ").unwrap_or((title, ""));
    let settings = wrap(settings, (width as usize - 40) / 7);
    let head_px = 12 + NAME_PX + 6 + settings.len() as u32 * (SETTINGS_PX + 4);
    let strip_px = 8 + label_lines * LABEL_LINE_PX;
    let root = BitMapBackend::new(path, (width, head_px + 440 + strip_px)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(head_px);
    head.draw(&Text::new(name.to_string(), (20, 10), ("sans-serif", NAME_PX).into_font()))?;
    for (k, line) in settings.iter().enumerate() {
        let y = 16 + NAME_PX + k as u32 * (SETTINGS_PX + 4);
        head.draw(&Text::new(line.clone(), (20, y as i32), ("sans-serif", SETTINGS_PX).into_font()))?;
    }
    let panels = body.split_evenly((1, 2));
    let metrics: [Metric; 2] = [
        ("refault time (s), median and min–max", |s| (s.refault_s.median, s.refault_s.min, s.refault_s.max)),
        ("µs per refaulted page", |s| {
            (s.refault_us_per_page.median, s.refault_us_per_page.min, s.refault_us_per_page.max)
        }),
    ];
    for (panel, (label, get)) in panels.iter().zip(metrics) {
        let top = rows.iter().map(|s| get(s).2).fold(0.0f64, f64::max).max(1e-9) * 1.15;
        let n = rows.len();
        // The chart starts at 0; the engines' names go in a strip of their own below it.
        let (upper, strip) = panel.split_vertically(panel.dim_in_pixel().1 - strip_px);
        let mut chart = ChartBuilder::on(&upper)
            .margin(16)
            .margin_bottom(4)
            .caption(label, ("sans-serif", 17))
            .x_label_area_size(4)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..n as f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .y_label_formatter(&|y| if top >= 10.0 { format!("{y:.0}") } else { format!("{y:.3}") })
            .y_label_style(("sans-serif", 14))
            .draw()?;
        for (i, s) in rows.iter().enumerate() {
            let (med, lo, hi) = get(s);
            let c = i as f64 + 0.5;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, med)],
                color(&s.engine, variants).filled(),
            )))?;
            // Whisker from min to max with caps.
            let style = BLACK.stroke_width(2);
            chart.draw_series(std::iter::once(PathElement::new(vec![(c, lo), (c, hi)], style)))?;
            for y in [lo, hi] {
                chart.draw_series(std::iter::once(PathElement::new(vec![(c - 0.08, y), (c + 0.08, y)], style)))?;
            }
            let value = if med >= 100.0 { format!("{med:.0}") } else { format!("{med:.3}") };
            chart.draw_series(std::iter::once(Text::new(
                value,
                (i as f64 + 0.18, hi + top * 0.035),
                ("sans-serif", 15).into_font(),
            )))?;
            // One line per ':'-part: "tierswap" over "policy=order0", under the bar's left edge.
            let x = chart.backend_coord(&(i as f64 + 0.18, 0.0)).0 - strip.get_base_pixel().0;
            for (k, part) in s.engine.split(':').enumerate() {
                let y = 4 + k as u32 * LABEL_LINE_PX;
                strip.draw(&Text::new(part.to_string(), (x, y as i32), ("sans-serif", 15).into_font()))?;
            }
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn wrap_breaks_at_commas_within_the_width() {
        let lines = wrap("size 1024 MiB, budget 256 MiB, tiers zero,pool,file, compressor lz4", 32);
        assert_eq!(lines, ["size 1024 MiB, budget 256 MiB", "tiers zero,pool,file", "compressor lz4"]);
        assert_eq!(wrap("one", 2), ["one"], "a part longer than the width stands alone");
        assert_eq!(wrap("", 10), [""]);
    }
}
