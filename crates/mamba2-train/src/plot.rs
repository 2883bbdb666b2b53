//! Minimal PNG line charts (no text: the caller names the file and documents the colours).

use std::path::Path;

use crate::TrainError;

/// A series to draw: its values and an RGB colour.
pub struct Series<'a> {
    /// The y values, one per x step.
    pub values: &'a [f64],
    /// Line colour.
    pub rgb: [u8; 3],
}

/// Draws `series` on a white `width x height` canvas with a grey frame and a zero line when
/// zero is in range, and writes it to `path` atomically.
pub fn line_chart(path: &Path, series: &[Series], width: usize, height: usize) -> Result<(), TrainError> {
    let margin = 20usize;
    let fail = |why: String| TrainError::Plot { path: path.display().to_string(), why };
    // The frame needs room inside the margins, and PNG sizes are 32-bit.
    let (min, max) = (2 * margin + 2, u32::MAX as usize / 4);
    if !(min..=max).contains(&width) || !(min..=max).contains(&height) {
        return Err(fail(format!("size {width} x {height} is outside {min}..={max} pixels per side")));
    }
    let mut px = vec![255u8; width * height * 3];
    let (lo, hi) = series
        .iter()
        .flat_map(|s| s.values.iter().copied().filter(|v| v.is_finite()))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo < hi { (lo, hi) } else { (lo - 1.0, lo + 1.0) };
    let n = series.iter().map(|s| s.values.len()).max().unwrap_or(0).max(2);
    let mut put = |x: usize, y: usize, c: [u8; 3]| {
        if x < width && y < height {
            px[(y * width + x) * 3..(y * width + x) * 3 + 3].copy_from_slice(&c);
        }
    };
    let to_xy = |i: usize, v: f64| -> (f64, f64) {
        let x = margin as f64 + i as f64 / (n - 1) as f64 * (width - 2 * margin) as f64;
        let y = (height - margin) as f64 - (v - lo) / (hi - lo) * (height - 2 * margin) as f64;
        (x, y)
    };
    for x in margin..=width - margin {
        put(x, margin, [160; 3]);
        put(x, height - margin, [160; 3]);
    }
    for y in margin..=height - margin {
        put(margin, y, [160; 3]);
        put(width - margin, y, [160; 3]);
    }
    if lo < 0.0 && hi > 0.0 {
        let (_, y0) = to_xy(0, 0.0);
        for x in margin..=width - margin {
            put(x, y0 as usize, [210; 3]);
        }
    }
    for s in series {
        for (i, w) in s.values.windows(2).enumerate() {
            let (x0, y0) = to_xy(i, w[0]);
            let (x1, y1) = to_xy(i + 1, w[1]);
            let steps = ((x1 - x0).abs().max((y1 - y0).abs()) as usize).max(1) * 2;
            for k in 0..=steps {
                let t = k as f64 / steps as f64;
                let (x, y) = (x0 + t * (x1 - x0), y0 + t * (y1 - y0));
                if x.is_finite() && y.is_finite() {
                    put(x as usize, y as usize, s.rgb);
                    put(x as usize, y as usize + 1, s.rgb);
                }
            }
        }
    }
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, width as u32, height as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| fail(format!("png: {e}")))?;
        w.write_image_data(&px).map_err(|e| fail(format!("png: {e}")))?;
    }
    mamba2_model::write_atomically(path, &bytes).map_err(TrainError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("mamba2-plot-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A chart is a PNG of the asked size with the series' colour in it.
    #[test]
    fn a_chart_is_a_png_of_the_asked_size() {
        let path = scratch("ok").join("c.png");
        let values = [1.0, -2.0, 3.0, f64::NAN, 0.5];
        line_chart(&path, &[Series { values: &values, rgb: [200, 10, 10] }], 120, 80).unwrap();
        let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (120, 80));
        assert!(buf[..info.buffer_size()].chunks(3).any(|p| p == [200, 10, 10]));
    }

    /// Too small a canvas is a chart error naming the file and the size, and writes nothing.
    #[test]
    fn too_small_a_canvas_is_an_error() {
        let path = scratch("small").join("c.png");
        for (w, h) in [(10, 80), (120, 5), (0, 0)] {
            match line_chart(&path, &[Series { values: &[1.0, 2.0], rgb: [0; 3] }], w, h) {
                Err(e @ TrainError::Plot { .. }) => assert!(e.to_string().contains(&format!("{w} x {h}")), "{e}"),
                other => panic!("{w} x {h}: {other:?}"),
            }
        }
        assert!(!path.exists());
    }
}
