//! Line charts as SVG, in the style of the figures the simulator reproduces
//! (seed 004's "count in the window against time", the thesis' rejections
//! over time): a few named series on shared axes, a legend, nothing else.
//!
//! Drawn with `plotters`' SVG backend only: no bitmap backend and no system
//! fonts (text is laid out with plotters' built-in naive metrics and left
//! to the SVG viewer to render), so a chart is a pure function of its data.
//!
//! ```no_run
//! use std::path::Path;
//! use tollgate_sim::chart::{line_chart, LineStyle, Series};
//!
//! let series = [
//!     Series::new("perfect", vec![(0.0, 0.0), (60.0, 100.0)], LineStyle::REFERENCE),
//!     Series::new("fixed window", vec![(0.0, 0.0), (60.0, 90.0)], LineStyle::dashed(0)),
//! ];
//! line_chart(Path::new("count.svg"), "count", "time (s)", "hits", &series)?;
//! # Ok::<(), tollgate_sim::chart::ChartError>(())
//! ```

use std::path::Path;

use plotters::prelude::{
    ChartBuilder, DashedLineSeries, IntoDrawingArea, LineSeries, PathElement, RGBColor, SVGBackend,
    SeriesLabelPosition, ShapeStyle, BLACK, WHITE,
};
use plotters::style::Color;
use thiserror::Error;

/// Width of a chart, in SVG pixels.
pub const WIDTH: u32 = 1000;
/// Height of a chart, in SVG pixels.
pub const HEIGHT: u32 = 500;

/// Colours for successive series (colour-blind-safe Okabe–Ito order,
/// orange first as in seed 004's fixed-window figure).
pub const PALETTE: [(u8, u8, u8); 7] = [
    (230, 159, 0),
    (0, 114, 178),
    (0, 158, 115),
    (204, 121, 167),
    (213, 94, 0),
    (86, 180, 233),
    (240, 228, 66),
];

/// How a series' line is drawn.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LineStyle {
    /// Colour as `(red, green, blue)`.
    pub color: (u8, u8, u8),
    /// Stroke width in pixels.
    pub width: u32,
    /// Dashed rather than solid.
    pub dashed: bool,
}

impl LineStyle {
    /// The reference line (the perfect window, the centralized limiter):
    /// grey, solid and a little thicker, as in seed 004's figures.
    pub const REFERENCE: LineStyle = LineStyle {
        color: (150, 150, 150),
        width: 3,
        dashed: false,
    };

    /// A solid line in [`PALETTE`] colour `index` (wrapping around).
    pub const fn solid(index: usize) -> LineStyle {
        LineStyle {
            color: PALETTE[index % PALETTE.len()],
            width: 2,
            dashed: false,
        }
    }

    /// A dashed line in [`PALETTE`] colour `index` (wrapping around).
    pub const fn dashed(index: usize) -> LineStyle {
        LineStyle {
            color: PALETTE[index % PALETTE.len()],
            width: 2,
            dashed: true,
        }
    }

    fn shape(&self) -> ShapeStyle {
        let (r, g, b) = self.color;
        RGBColor(r, g, b).stroke_width(self.width)
    }
}

/// One named line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub name: String,
    /// `(x, y)` points, drawn in order; non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
    /// How the line is drawn.
    pub style: LineStyle,
}

impl Series {
    /// A series named `name`.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>, style: LineStyle) -> Series {
        Series {
            name: name.into(),
            points,
            style,
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

/// An SVG line chart of `series` on shared axes, with a legend of their
/// names. The x axis spans the data; the y axis starts at zero (or below,
/// for negative data) and leaves 10 % headroom above the largest value.
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<String, ChartError> {
    let (x_range, y_range) = ranges(series);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 28))
            .margin(12)
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
        for s in series {
            let style = s.style.shape();
            let legend = move |(x, y): (i32, i32)| {
                PathElement::new(vec![(x, y), (x + 24, y)], style.stroke_width(3))
            };
            let drawn = if s.style.dashed {
                chart
                    .draw_series(DashedLineSeries::new(s.finite(), 6, 4, style))
                    .map_err(draw_error)?
            } else {
                chart
                    .draw_series(LineSeries::new(s.finite(), style))
                    .map_err(draw_error)?
            };
            drawn.label(s.name.as_str()).legend(legend);
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .label_font(("sans-serif", 15))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(draw_error)?;
        }
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
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
