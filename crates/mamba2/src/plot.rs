//! PNG line charts with axes, ticks, labels, a title and a legend (plotters, drawn into memory
//! and written atomically with the `png` crate; the text in DejaVu Sans, embedded).

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

use crate::PlotError;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Line<'a> {
    /// Its name in the legend.
    pub label: &'a str,
    /// Its points; non-finite ones are left out.
    pub points: Vec<(f64, f64)>,
    /// Its colour.
    pub rgb: [u8; 3],
    /// A marker at every point; lines of 24 points or fewer get them anyway, so that a single
    /// point is never invisible.
    pub markers: bool,
    /// Dashed rather than solid.
    pub dashed: bool,
}

/// The colour of the forecast interval in `forecast.png`: a light tint of the forecast's red.
pub const BAND_RGB: [u8; 3] = [246, 196, 196];

/// A shaded band between two curves over the same x values (a forecast interval), drawn under
/// the lines in one opaque colour.
#[derive(Debug, Clone)]
pub struct Band<'a> {
    /// Its name in the legend.
    pub label: &'a str,
    /// `(x, lower, upper)`; non-finite ones are left out.
    pub points: Vec<(f64, f64, f64)>,
    /// Its colour (opaque: a light tint of the line it belongs to).
    pub rgb: [u8; 3],
}

/// A chart: lines over shared axes, and labelled vertical marks.
#[derive(Debug, Clone, Default)]
pub struct Chart<'a> {
    /// Above the plot.
    pub title: &'a str,
    /// Under the x axis.
    pub x_label: &'a str,
    /// Beside the y axis.
    pub y_label: &'a str,
    /// The lines, drawn in order.
    pub lines: Vec<Line<'a>>,
    /// Vertical marks at these x values, with their labels in the legend (e.g. the best
    /// epoch).
    pub marks: Vec<(f64, String)>,
    /// The x values are whole numbers (epochs, steps): only those get ticks.
    pub integer_x: bool,
    /// Bands drawn under the lines.
    pub bands: Vec<Band<'a>>,
}

impl Band<'_> {
    fn finite(&self) -> impl Iterator<Item = (f64, f64, f64)> + '_ {
        self.points.iter().copied().filter(|(x, a, b)| x.is_finite() && a.is_finite() && b.is_finite())
    }
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType font shipped by the `dejavu` crate.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    });
}

fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if lo > hi {
        return None;
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { lo.abs().max(1.0) * 0.5 };
    Some((lo - pad, hi + pad))
}

/// The points of every line and 16 more along each of its segments, so that a legend placed
/// clear of them is clear of the lines too, not only of their markers.
fn traced(chart: &Chart) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let edges: Vec<Line> = chart
        .bands
        .iter()
        .flat_map(|b| {
            let edge = |upper: bool| Line {
                label: "",
                points: b.finite().map(|(x, lo, hi)| (x, if upper { hi } else { lo })).collect(),
                rgb: b.rgb,
                markers: false,
                dashed: false,
            };
            [edge(false), edge(true)]
        })
        .collect();
    for l in chart.lines.iter().chain(&edges) {
        let pts: Vec<(f64, f64)> = l.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        out.extend(pts.windows(2).flat_map(|w| {
            let ((xa, ya), (xb, yb)) = (w[0], w[1]);
            (0..17).map(move |k| {
                let t = f64::from(k) / 17.0;
                (xa + t * (xb - xa), ya + t * (yb - ya))
            })
        }));
        out.extend(pts.last());
    }
    out
}

/// Where the legend goes, and the y range to draw: the corner of the plot with no points under
/// where the legend would sit, and when every corner has some, the upper right of a y range
/// raised by the legend's share, so that the legend never hides a line.
fn legend_place(points: &[(f64, f64)], x: (f64, f64), (y0, y1): (f64, f64)) -> (SeriesLabelPosition, (f64, f64)) {
    let (corner, covered) = legend_corner(points, x, (y0, y1));
    if covered == 0 {
        return (corner, (y0, y1));
    }
    // The top 30 % of [y0, top] is above every point when top - y1 = 0.3 (top - y0).
    (SeriesLabelPosition::UpperRight, (y0, (y1 - 0.3 * y0) / 0.7))
}

/// The corner of the plot with the fewest points under where the legend would sit, and how many.
fn legend_corner(points: &[(f64, f64)], (x0, x1): (f64, f64), (y0, y1): (f64, f64)) -> (SeriesLabelPosition, usize) {
    let (fx, fy) = ((x1 - x0) * 0.4, (y1 - y0) * 0.3);
    let corners = [
        (SeriesLabelPosition::UpperRight, x1 - fx, x1, y1 - fy, y1),
        (SeriesLabelPosition::UpperLeft, x0, x0 + fx, y1 - fy, y1),
        (SeriesLabelPosition::LowerRight, x1 - fx, x1, y0, y0 + fy),
        (SeriesLabelPosition::LowerLeft, x0, x0 + fx, y0, y0 + fy),
    ];
    let under = |&(_, a, b, c, d): &(SeriesLabelPosition, f64, f64, f64, f64)| {
        points.iter().filter(|&&(x, y)| (a..=b).contains(&x) && (c..=d).contains(&y)).count()
    };
    // The first corner wins ties, so an empty upper right is where legends usually are.
    let best = corners.iter().min_by_key(|c| under(c)).expect("four corners");
    (best.0.clone(), under(best))
}

/// Draws `chart` on a white `width x height` canvas and writes it to `path` as a PNG,
/// atomically.
pub fn draw(path: &Path, chart: &Chart, width: u32, height: u32) -> Result<(), PlotError> {
    let fail = |why: String| PlotError::Chart { path: path.display().to_string(), why };
    let (min, max) = (200, 8192);
    if !(min..=max).contains(&width) || !(min..=max).contains(&height) {
        return Err(fail(format!("size {width} x {height} is outside {min}..={max} pixels per side")));
    }
    let band_points = || chart.bands.iter().flat_map(|b| b.finite().flat_map(|(x, lo, hi)| [(x, lo), (x, hi)]));
    let points =
        || chart.lines.iter().flat_map(|l| l.points.iter().copied()).filter(|(x, y)| x.is_finite() && y.is_finite()).chain(band_points());
    let (x0, x1) = bounds(points().map(|p| p.0).chain(chart.marks.iter().map(|m| m.0))).ok_or_else(|| fail("nothing to draw".into()))?;
    let y = bounds(points().map(|p| p.1)).ok_or_else(|| fail("nothing to draw".into()))?;
    let (legend, (y0, y1)) = legend_place(&traced(chart), (x0, x1), y);
    register_font();
    let mut px = vec![255u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut px, (width, height)).into_drawing_area();
        let e = |err: plotters::drawing::DrawingAreaErrorKind<_>| fail(format!("drawing: {err}"));
        root.fill(&WHITE).map_err(e)?;
        let mut c = ChartBuilder::on(&root)
            .caption(chart.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(e)?;
        // Round ticks to the digits they need: `2` rather than `2.0`, `0.3` rather than
        // `0.30000000000000004`.
        let tick = |v: &f64| {
            let r = (v * 1e6).round() / 1e6;
            format!("{r}")
        };
        // Whole-number axes label only the whole ticks (no `epoch 1.5`).
        let x_tick = |v: &f64| if chart.integer_x && (v - v.round()).abs() > 1e-6 { String::new() } else { tick(v) };
        c.configure_mesh()
            .x_label_formatter(&x_tick)
            .y_label_formatter(&tick)
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .label_style(("sans-serif", 12))
            .axis_desc_style(("sans-serif", 13))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(e)?;
        let mut labelled = false;
        for b in &chart.bands {
            let color = RGBColor(b.rgb[0], b.rgb[1], b.rgb[2]);
            let pts: Vec<(f64, f64, f64)> = b.finite().collect();
            // A single point has no area: a vertical bar shows it.
            if pts.len() == 1 {
                let (x, lo, hi) = pts[0];
                c.draw_series(std::iter::once(PathElement::new(vec![(x, lo), (x, hi)], color.stroke_width(6)))).map_err(e)?;
            }
            // One quadrilateral per segment: a polygon of the whole band could fold over itself.
            let quad = |w: &[(f64, f64, f64)]| {
                Polygon::new(vec![(w[0].0, w[0].1), (w[1].0, w[1].1), (w[1].0, w[1].2), (w[0].0, w[0].2)], color.filled())
            };
            let anno = c.draw_series(pts.windows(2).map(quad)).map_err(e)?;
            if !b.label.is_empty() {
                labelled = true;
                anno.label(b.label).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], color.filled()));
            }
        }
        for l in &chart.lines {
            let color = RGBColor(l.rgb[0], l.rgb[1], l.rgb[2]);
            let pts: Vec<(f64, f64)> = l.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
            let style = color.stroke_width(2);
            let anno = if l.dashed {
                c.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style)).map_err(e)?
            } else {
                c.draw_series(LineSeries::new(pts.clone(), style)).map_err(e)?
            };
            if !l.label.is_empty() {
                labelled = true;
                anno.label(l.label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            }
            if l.markers || pts.len() <= 24 {
                c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(e)?;
            }
        }
        for (x, label) in &chart.marks {
            let grey = RGBColor(110, 110, 110);
            let anno = c.draw_series(DashedLineSeries::new(vec![(*x, y0), (*x, y1)], 6, 4, grey.stroke_width(1))).map_err(e)?;
            anno.label(label.trim())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 6, y), (x + 10, y), (x + 16, y)], grey.stroke_width(1)));
            labelled = true;
        }
        if labelled {
            c.configure_series_labels()
                .label_font(("sans-serif", 12))
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(180, 180, 180))
                .position(legend)
                .draw()
                .map_err(e)?;
        }
        root.present().map_err(e)?;
    }
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| fail(format!("png: {e}")))?;
        w.write_image_data(&px).map_err(|e| fail(format!("png: {e}")))?;
    }
    mamba2_model::write_atomically(path, &bytes).map_err(PlotError::from)
}

/// A decoded PNG's size and RGB pixels, for tests and checks of the charts.
pub fn read_png(path: &Path) -> Result<(u32, u32, Vec<u8>), PlotError> {
    let fail = |why: String| PlotError::Chart { path: path.display().to_string(), why };
    let file = std::fs::File::open(path).map_err(|cause| PlotError::Io { path: path.display().to_string(), cause })?;
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().map_err(|e| fail(format!("png: {e}")))?;
    let mut buf = vec![0; reader.output_buffer_size().ok_or_else(|| fail("png: no size".into()))?];
    let info = reader.next_frame(&mut buf).map_err(|e| fail(format!("png: {e}")))?;
    buf.truncate(info.buffer_size());
    Ok((info.width, info.height, buf))
}

/// Whether a chart drawn by [`draw`] has its axes: a long run of dark pixels along a row (the x
/// axis) and along a column (the y axis), beside the colour of each line.
pub fn has_axes_and(rgb: &[u8], width: u32, height: u32, colours: &[[u8; 3]]) -> bool {
    let (w, h) = (width as usize, height as usize);
    let dark = |x: usize, y: usize| rgb[(y * w + x) * 3..(y * w + x) * 3 + 3].iter().all(|&c| c < 80);
    let longest =
        |n: usize, m: usize, at: &dyn Fn(usize, usize) -> bool| (0..n).map(|i| (0..m).filter(|&j| at(i, j)).count()).max().unwrap_or(0);
    let x_axis = longest(h, w, &|y, x| dark(x, y)) > w / 2;
    let y_axis = longest(w, h, &|x, y| dark(x, y)) > h / 2;
    let coloured = colours.iter().all(|c| rgb.chunks(3).any(|p| p == c));
    x_axis && y_axis && coloured
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("mamba2-plot-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A chart is a PNG of the asked size, with axes and each line's colour in it, even for a
    /// single point (drawn as a marker) and with a non-finite value left out.
    #[test]
    fn a_chart_is_a_png_with_axes_and_its_lines() {
        let path = scratch("ok").join("c.png");
        let chart = Chart {
            title: "t",
            x_label: "x",
            y_label: "y",
            lines: vec![
                Line {
                    label: "a",
                    points: vec![(1.0, 1.0), (2.0, -2.0), (3.0, f64::NAN), (4.0, 0.5)],
                    rgb: [200, 10, 10],
                    markers: false,
                    dashed: false,
                },
                Line { label: "b", points: vec![(2.0, 0.0)], rgb: [10, 10, 200], markers: true, dashed: false },
            ],
            marks: vec![(2.0, "best".into())],
            integer_x: false,
            bands: Vec::new(),
        };
        draw(&path, &chart, 480, 320).unwrap();
        let (w, h, rgb) = read_png(&path).unwrap();
        assert_eq!((w, h), (480, 320));
        assert!(has_axes_and(&rgb, w, h, &[[200, 10, 10], [10, 10, 200]]));
        assert!(!has_axes_and(&vec![255; rgb.len()], w, h, &[]), "a blank canvas has no axes");
    }

    /// The legend takes an empty corner when there is one; when lines run through all four (a
    /// loss curve falling from the upper left to the lower right, with a flat line across the
    /// top), the y range grows until the upper right is empty.
    #[test]
    fn the_legend_never_sits_on_a_point() {
        let x = (1.0, 10.0);
        let falling: Vec<(f64, f64)> = (1..=10).map(|i| (i as f64, 1.0 / i as f64)).collect();
        let (corner, y) = legend_place(&falling, x, (0.1, 1.0));
        assert_eq!((corner, y), (SeriesLabelPosition::UpperRight, (0.1, 1.0)), "the upper right of a falling curve is empty");
        let mut crowded = falling.clone();
        crowded.extend((1..=10).map(|i| (i as f64, 0.95)));
        crowded.push((1.0, 0.1));
        assert!(legend_corner(&crowded, x, (0.1, 1.0)).1 > 0, "every corner has points");
        let (corner, (y0, y1)) = legend_place(&crowded, x, (0.1, 1.0));
        assert_eq!(corner, SeriesLabelPosition::UpperRight);
        assert_eq!(y0, 0.1);
        assert_eq!(legend_corner(&crowded, x, (y0, y1)), (SeriesLabelPosition::UpperRight, 0));
        // A segment through a corner counts even where it has no point there: a V whose lowest
        // point lies between the two lower corners crosses both.
        let chart = Chart {
            lines: vec![Line { label: "v", points: vec![(1.0, 1.0), (5.5, 0.1), (10.0, 1.0)], rgb: [0; 3], markers: false, dashed: false }],
            ..Chart::default()
        };
        let dense = traced(&chart);
        assert_eq!(dense.len(), 2 * 17 + 1);
        assert_eq!(legend_corner(&chart.lines[0].points, x, (0.1, 1.0)), (SeriesLabelPosition::LowerRight, 0));
        assert!(legend_corner(&dense, x, (0.1, 1.0)).1 > 0, "the V's arms run through every corner");
    }

    /// Too small a canvas, or nothing to draw, is a chart error naming the file, and writes
    /// nothing.
    #[test]
    fn too_small_a_canvas_or_no_data_is_an_error() {
        let path = scratch("small").join("c.png");
        let one = Chart {
            lines: vec![Line { label: "", points: vec![(0.0, 1.0)], rgb: [0; 3], markers: true, dashed: false }],
            ..Chart::default()
        };
        for (w, h) in [(10, 80), (120, 5), (0, 0)] {
            match draw(&path, &one, w, h) {
                Err(e @ PlotError::Chart { .. }) => assert!(e.to_string().contains(&format!("{w} x {h}")), "{e}"),
                other => panic!("{w} x {h}: {other:?}"),
            }
        }
        let empty = Chart {
            lines: vec![Line { label: "", points: vec![(0.0, f64::NAN)], rgb: [0; 3], markers: true, dashed: false }],
            ..Chart::default()
        };
        assert!(matches!(draw(&path, &empty, 300, 300), Err(PlotError::Chart { .. })));
        assert!(!path.exists());
    }
}
