//! Line charts as SVG, in the style of the figures the simulator reproduces
//! (seed 004's "count in the window against time", the thesis' rejections
//! over time): a few named series on shared axes, each line's final value
//! beside its end, and a legend below.
//!
//! Every series differs from every other in colour *and* dash
//! ([`LineStyle::series`]), so a chart reads in greyscale too; the ground
//! truth ([`Series::reference`]) is drawn last, on top of the lines it is
//! compared with; final values that would overlap are nudged apart
//! ([`layout`]).
//!
//! Drawn with `plotters`' SVG backend only: no bitmap backend and no system
//! fonts (text is laid out with estimated metrics and left to the SVG
//! viewer to render), so a chart is a pure function of its data.
//!
//! ```no_run
//! use std::path::Path;
//! use tollgate_sim::chart::{line_chart, LineStyle, Series};
//!
//! let series = [
//!     Series::reference("perfect", vec![(0.0, 0.0), (60.0, 100.0)]),
//!     Series::new("fixed window", vec![(0.0, 0.0), (60.0, 90.0)], LineStyle::series(0)),
//! ];
//! line_chart(Path::new("count.svg"), "count", "time (s)", "hits", &series)?;
//! # Ok::<(), tollgate_sim::chart::ChartError>(())
//! ```

use std::path::Path;

use plotters::prelude::{
    ChartBuilder, IntoDrawingArea, IntoFont, PathElement, Rectangle, SVGBackend, Text, BLACK, WHITE,
};
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{Color, FontStyle};
use thiserror::Error;

pub mod layout;
mod style;

pub use style::{dash_runs, LineStyle, DASHES, PALETTE};

/// Width of a chart, in SVG pixels.
pub const WIDTH: u32 = 1000;
/// Height of a chart's title, axes and plot, in SVG pixels; the legend
/// below them adds a row for every few series.
pub const HEIGHT: u32 = 500;

/// Font size (plotters' units) of the legend and the final-value labels.
const TEXT_SIZE: f64 = 15.0;
/// Height of one legend entry or one final-value label, in pixels.
const ROW: f64 = 17.0;
/// Length of a legend entry's sample line: long enough to show each of
/// [`DASHES`] whole at least once.
const SAMPLE: f64 = 40.0;
/// Pixels between a line's end and its final-value label.
const LEADER: f64 = 8.0;

/// One named line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub name: String,
    /// `(x, y)` points, drawn in order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
    /// How the line is drawn.
    pub style: LineStyle,
    /// The ground truth the other series are measured against (the
    /// centralized limiter, the perfect window): drawn after every other
    /// series, so no other line hides it, whatever its place in the
    /// legend.
    pub reference: bool,
}

impl Series {
    /// A series named `name`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, style: LineStyle) -> Series {
        Series {
            name: name.into(),
            points,
            style,
            reference: false,
        }
    }

    /// The ground truth named `name`, in [`LineStyle::REFERENCE`], drawn on
    /// top of the other series.
    pub fn reference(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            reference: true,
            ..Series::new(name, points, LineStyle::REFERENCE)
        }
    }

    fn finite(&self) -> impl Iterator<Item = (f64, f64)> + Clone + '_ {
        self.points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
    }
}

/// Why a chart could not be written.
#[derive(Debug, Error)]
pub enum ChartError {
    /// plotters failed to lay out or draw the chart.
    #[error("drawing the chart failed: {0}")]
    Draw(String),
    /// The SVG file could not be written.
    #[error("writing the chart failed: {0}")]
    Io(#[from] std::io::Error),
}

fn draw_error(e: impl std::fmt::Display) -> ChartError {
    ChartError::Draw(e.to_string())
}

/// Writes `series` as an SVG line chart to `path`; see [`line_chart_svg`].
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), ChartError> {
    let svg = line_chart_svg(title, x_label, y_label, series)?;
    std::fs::write(path, svg)?;
    Ok(())
}

/// Writes `series` as an SVG line chart to `path` and, in a build with the
/// `png` feature, as a PNG next to it (the same name, `.png`): the PNG is
/// the SVG rasterized in pure Rust (resvg), with the system's fonts if it
/// has any (without them the text is left out, the lines are drawn).
/// Returns the paths written.
pub fn line_chart_files(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<Vec<std::path::PathBuf>, ChartError> {
    let svg = line_chart_svg(title, x_label, y_label, series)?;
    std::fs::write(path, &svg)?;
    #[cfg_attr(not(feature = "png"), allow(unused_mut))]
    let mut written = vec![path.to_path_buf()];
    #[cfg(feature = "png")]
    {
        let png = path.with_extension("png");
        std::fs::write(&png, svg_to_png(&svg)?)?;
        written.push(png);
    }
    Ok(written)
}

/// Rasterizes an SVG document to PNG bytes at its own size.
#[cfg(feature = "png")]
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, ChartError> {
    let mut options = resvg::usvg::Options {
        font_family: "DejaVu Sans".to_owned(),
        ..resvg::usvg::Options::default()
    };
    let fonts = options.fontdb_mut();
    fonts.load_system_fonts();
    // The charts ask for `sans-serif`; map it to a font this system has
    // (DejaVu Sans on Debian), whatever fontdb's default guess is.
    let families: Vec<String> = fonts
        .faces()
        .filter_map(|f| f.families.first().map(|(name, _)| name.clone()))
        .collect();
    if let Some(family) = families
        .iter()
        .find(|f| f.as_str() == "DejaVu Sans")
        .or_else(|| families.iter().find(|f| f.contains("Sans")))
        .or_else(|| families.first())
    {
        fonts.set_sans_serif_family(family.clone());
    }
    let tree = resvg::usvg::Tree::from_str(svg, &options).map_err(draw_error)?;
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| ChartError::Draw(format!("no pixmap of {size:?}")))?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().map_err(draw_error)
}

/// An SVG line chart of `series` on shared axes, each line's final value
/// written beside its end and a legend of their names below the axes
/// (where it hides no line). The x axis spans the data; the y axis starts
/// at zero (or below, for negative data) and leaves 10 % headroom above
/// the largest value. The chart is [`WIDTH`] wide and [`HEIGHT`] tall plus
/// a row of legend per few series.
///
/// The series are drawn in their order, except that the
/// [reference](Series::reference) series come last, on top; the legend
/// lists them all in their order. Final values that would overlap are
/// nudged apart (a thin leader in the line's colour joins each to its
/// line's end).
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<String, ChartError> {
    let (x_range, y_range) = ranges(series);
    let finals: Vec<(usize, f64)> = series
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((i, s.finite().last()?.1)))
        .collect();
    let values: Vec<f64> = finals.iter().map(|&(_, v)| v).collect();
    let mut labels: Vec<Option<String>> = vec![None; series.len()];
    for (&(i, _), text) in finals.iter().zip(layout::value_labels(&values)) {
        labels[i] = Some(text);
    }
    let widest = labels
        .iter()
        .flatten()
        .map(|l| text_width(l))
        .fold(0.0, f64::max);
    // Room on the right for the values of lines that end at the right edge.
    let right = (LEADER + widest + 8.0).max(12.0).ceil() as u32;
    let legend = Legend::new(series);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT + legend.height()))
            .into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let (top, _) = root.split_vertically(HEIGHT);
        let mut chart = ChartBuilder::on(&top)
            .caption(title, ("sans-serif", 28))
            .margin(12)
            .margin_right(right)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range, y_range)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .axis_desc_style(("sans-serif", 18))
            .label_style(("sans-serif", 15))
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(draw_error)?;
        // In pixels, once: the lines and their labels both work on them.
        let pixels: Vec<Vec<(f64, f64)>> = series
            .iter()
            .map(|s| {
                s.finite()
                    .map(|p| {
                        let (x, y) = chart.backend_coord(&p);
                        (f64::from(x), f64::from(y))
                    })
                    .collect()
            })
            .collect();
        let order = drawing_order(series);
        for &i in &order {
            draw_line(&root, &pixels[i], series[i].style)?;
        }
        let (xs, ys) = chart.plotting_area().get_pixel_range();
        let lines = Lines {
            series,
            pixels: &pixels,
            labels: &labels,
        };
        draw_final_values(
            &root,
            &lines,
            &order,
            (f64::from(ys.start), f64::from(ys.end)),
        )?;
        legend.draw(&root, series, f64::from(xs.start), f64::from(HEIGHT))?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

type Root<'a> = plotters::drawing::DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// The order the series are drawn in: as given, the references last.
fn drawing_order(series: &[Series]) -> Vec<usize> {
    let (mut order, references): (Vec<usize>, Vec<usize>) =
        (0..series.len()).partition(|&i| !series[i].reference);
    order.extend(references);
    order
}

/// The pixel width of `text` in the legend's and labels' font: a generous
/// estimate (DejaVu Sans' digits are 0.64 em), since the SVG's viewer
/// picks the real font.
fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * TEXT_SIZE / 1.24 * 0.64
}

fn draw_line(root: &Root<'_>, pixels: &[(f64, f64)], style: LineStyle) -> Result<(), ChartError> {
    for run in dash_runs(pixels, style.dash) {
        let run: Vec<(i32, i32)> = run.iter().map(|&(x, y)| px(x, y)).collect();
        root.draw(&PathElement::new(run, style.shape()))
            .map_err(draw_error)?;
    }
    Ok(())
}

/// The series with their lines in pixels and their final values' text.
struct Lines<'a> {
    series: &'a [Series],
    pixels: &'a [Vec<(f64, f64)>],
    labels: &'a [Option<String>],
}

/// Each line's final value just right of its end, in its colour (the
/// reference's in bold) on a white ground, within `(top, bottom)`.
fn draw_final_values(
    root: &Root<'_>,
    lines: &Lines<'_>,
    order: &[usize],
    (top, bottom): (f64, f64),
) -> Result<(), ChartError> {
    let items: Vec<(usize, (f64, f64), &str)> = order
        .iter()
        .filter_map(|&i| Some((i, *lines.pixels[i].last()?, lines.labels[i].as_deref()?)))
        .collect();
    let wanted: Vec<(f64, f64, f64)> = items
        .iter()
        .map(|&(_, (x, y), text)| (x + LEADER, y, text_width(text) + 2.0))
        .collect();
    let placed = layout::place_labels(&wanted, ROW, top + ROW / 2.0, bottom - ROW / 2.0);
    for (&(i, (x, y), text), &at) in items.iter().zip(&placed) {
        let style = lines.series[i].style;
        let lx = x + LEADER;
        // A light ground as tall as the digits: a label that lands on
        // another line stays legible, and the line still shows through.
        root.draw(&Rectangle::new(
            [
                px(lx - 1.0, at - 6.0),
                px(lx + text_width(text) + 1.0, at + 6.0),
            ],
            WHITE.mix(0.65).filled(),
        ))
        .map_err(draw_error)?;
        root.draw(&PathElement::new(
            vec![px(x, y), px(lx - 1.0, at)],
            style.rgb().stroke_width(1),
        ))
        .map_err(draw_error)?;
        let weight = if lines.series[i].reference {
            FontStyle::Bold
        } else {
            FontStyle::Normal
        };
        let font = ("sans-serif", TEXT_SIZE)
            .into_font()
            .style(weight)
            .color(&style.rgb())
            .pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(text.to_owned(), px(lx, at), font))
            .map_err(draw_error)?;
    }
    Ok(())
}

/// The legend below the axes: each series' sample line (its colour, dash
/// and width) and name, in the series' order, row by row in as many
/// columns as fit.
struct Legend {
    columns: usize,
    rows: usize,
    column_width: f64,
}

impl Legend {
    const PAD: f64 = 8.0;

    fn new(series: &[Series]) -> Legend {
        let widest = series
            .iter()
            .map(|s| text_width(&s.name))
            .fold(0.0, f64::max);
        let column_width = SAMPLE + Self::PAD + widest + 3.0 * Self::PAD;
        let room = f64::from(WIDTH) - 80.0;
        let columns = ((room / column_width).floor() as usize).clamp(1, series.len().max(1));
        Legend {
            columns,
            rows: series.len().div_ceil(columns),
            column_width,
        }
    }

    fn height(&self) -> u32 {
        if self.rows == 0 {
            return 0;
        }
        (ROW * self.rows as f64 + 2.0 * Self::PAD).ceil() as u32
    }

    fn draw(
        &self,
        root: &Root<'_>,
        series: &[Series],
        left: f64,
        top: f64,
    ) -> Result<(), ChartError> {
        for (k, s) in series.iter().enumerate() {
            let x = left + self.column_width * (k % self.columns) as f64;
            let y = top + Self::PAD + ROW * ((k / self.columns) as f64 + 0.5);
            draw_line(root, &[(x, y), (x + SAMPLE, y)], s.style)?;
            let font = ("sans-serif", TEXT_SIZE)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(
                s.name.clone(),
                px(x + SAMPLE + Self::PAD, y),
                font,
            ))
            .map_err(draw_error)?;
        }
        Ok(())
    }
}

fn px(x: f64, y: f64) -> (i32, i32) {
    (x.round() as i32, y.round() as i32)
}

/// A tick label: whole numbers without decimals, others with up to three
/// significant decimals.
fn tick(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The axes' ranges: x over the data, y from min(0, data) to 10 % above the
/// data; never empty.
fn ranges(series: &[Series]) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64, 0.0f64);
    for (x, y) in series.iter().flat_map(Series::finite) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !(x0.is_finite() && x1.is_finite()) {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = (y1 - y0) * 0.1;
    let (y0, y1) = if y1 > y0 {
        (y0 - if y0 < 0.0 { pad } else { 0.0 }, y1 + pad)
    } else {
        (y0, y0 + 1.0)
    };
    (x0..x1, y0..y1)
}
