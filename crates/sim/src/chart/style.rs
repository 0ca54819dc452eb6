//! How a series' line looks: a colour, a width and a dash pattern, chosen
//! so that every line of a chart differs from every other in colour *and*
//! in dash, and the chart still reads when printed in greyscale or seen by
//! a colour-blind reader.
//!
//! plotters' own dashed series takes one dash length and one gap, and its
//! SVG backend has no `stroke-dasharray`; [`dash_runs`] cuts the line into
//! its drawn stretches instead, measuring along the whole polyline (the
//! pattern runs on through the data points, as a PostScript dash does), so
//! the SVG and the PNG rasterized from it look the same.

use plotters::prelude::{RGBColor, ShapeStyle};
use plotters::style::Color;

/// Colours for successive series: the Okabe–Ito colour-blind-safe
/// palette without its yellow (too light for a line or a label on white)
/// and its black (the reference's), completed with Paul Tol's wine and
/// olive. Orange comes first, as in seed 004's fixed-window figure.
pub const PALETTE: [(u8, u8, u8); 8] = [
    (230, 159, 0),
    (0, 114, 178),
    (0, 158, 115),
    (204, 121, 167),
    (213, 94, 0),
    (86, 180, 233),
    (136, 34, 85),
    (153, 153, 51),
];

/// Dash patterns for successive series, each different from the others
/// and from the reference's solid line: lengths in pixels of alternating
/// drawn and skipped stretches, starting with a drawn one.
pub const DASHES: [&[u32]; 8] = [
    &[10, 5],
    &[3, 4],
    &[14, 4, 3, 4],
    &[22, 6],
    &[8, 3, 2, 3, 2, 3],
    &[2, 8],
    &[18, 4, 7, 4],
    &[18, 4, 2, 3, 2, 3, 2, 4],
];

/// How a series' line is drawn.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LineStyle {
    /// Colour as `(red, green, blue)`.
    pub color: (u8, u8, u8),
    /// Stroke width in pixels.
    pub width: u32,
    /// Lengths in pixels of alternating drawn and skipped stretches,
    /// starting with a drawn one (as SVG's `stroke-dasharray`); empty, or
    /// all zeros, for a solid line.
    pub dash: &'static [u32],
}

impl LineStyle {
    /// The reference line (the perfect window, the centralized limiter):
    /// black and solid, a pixel thinner than the others, so that drawn on
    /// top of a series that follows it exactly, that series' colour still
    /// shows on either side.
    pub const REFERENCE: LineStyle = LineStyle {
        color: (0, 0, 0),
        width: 2,
        dash: &[],
    };

    /// A guide that is not data (a limit drawn across the chart): thin,
    /// grey and finely dotted, unlike any series.
    pub const GUIDE: LineStyle = LineStyle {
        color: (110, 110, 110),
        width: 1,
        dash: &[1, 3],
    };

    /// The style of the `index`th series: [`PALETTE`] colour `index` and,
    /// from the second round of the palette on, a dash shifted by one more
    /// each round, so that the first 64 indices all differ in (colour,
    /// dash), and the first 8 in both.
    pub const fn series(index: usize) -> LineStyle {
        let n = PALETTE.len();
        LineStyle {
            color: PALETTE[index % n],
            width: 3,
            dash: DASHES[(index + index / n) % DASHES.len()],
        }
    }

    /// Whether the line is drawn solid.
    pub fn is_solid(&self) -> bool {
        self.dash.iter().all(|&l| l == 0)
    }

    pub(crate) fn rgb(&self) -> RGBColor {
        let (r, g, b) = self.color;
        RGBColor(r, g, b)
    }

    pub(crate) fn shape(&self) -> ShapeStyle {
        self.rgb().stroke_width(self.width)
    }
}

/// The drawn stretches of `path` under the dash `pattern` (see
/// [`LineStyle::dash`]): each a polyline of at least two points, measured
/// along the whole path, so the pattern carries on through its vertices.
/// A solid pattern gives the path itself. A path with a point that is not
/// finite cannot be drawn, and gives nothing (an infinite segment would
/// never end its pattern).
pub fn dash_runs(path: &[(f64, f64)], pattern: &[u32]) -> Vec<Vec<(f64, f64)>> {
    if path.len() < 2 || path.iter().any(|p| !p.0.is_finite() || !p.1.is_finite()) {
        return Vec::new();
    }
    // A pattern of zeros would never advance: it is solid, as in SVG.
    if pattern.iter().all(|&l| l == 0) {
        return vec![path.to_vec()];
    }
    let mut runs = Vec::new();
    let mut k = 0;
    let mut left = f64::from(pattern[0]);
    let mut on = true;
    let mut current = vec![path[0]];
    for pair in path.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let len = (b.0 - a.0).hypot(b.1 - a.1);
        let mut at = 0.0;
        // Every boundary of the pattern that falls inside this segment.
        while len - at > left {
            at += left;
            let t = at / len;
            let p = (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
            if on {
                current.push(p);
                runs.push(std::mem::take(&mut current));
            } else {
                current = vec![p];
            }
            on = !on;
            k = (k + 1) % pattern.len();
            left = f64::from(pattern[k]);
        }
        left -= len - at;
        if on {
            current.push(b);
        }
    }
    if on {
        runs.push(current);
    }
    // Zero-length stretches (a 0 in the pattern, a stretch ending on the
    // path's last point) draw nothing.
    runs.retain(|run| run.windows(2).any(|w| w[0] != w[1]));
    runs
}
