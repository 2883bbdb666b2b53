//! Opening a forecaster's checkpoint, which may come from anyone: every size in its header is
//! bounded, and checked against the file's length, before memory is reserved for weights, and
//! the data scaler saved with it must fit the model's columns.

use std::path::Path;

use burn::prelude::Backend;
use mamba2_model::{load_checkpoint, read_checkpoint_header, Loaded};

use mamba2_data::quantile::Calibration;
use mamba2_data::{DataError, Scaler};

use crate::{ForecastError, Forecaster, ForecasterConfig};

/// A checkpoint written by `mamba2 train`: the model and the scaler it was trained with.
#[derive(Debug)]
pub struct Opened<B: Backend> {
    /// The trained model.
    pub model: Forecaster<B>,
    /// The z-scores of its feature columns, fitted on the training rows.
    pub scaler: Scaler,
    /// How its forecasts become quantiles, fitted on the validation split; `None` for a
    /// checkpoint written before intervals existed, or by a process other than `train`'s.
    pub calibration: Option<Calibration>,
    /// Everything else `train` saved with it (epoch, step, validation metrics, ...).
    pub meta: serde_json::Value,
}

/// Opens the forecaster checkpoint at `path` on `device`. A header whose config needs more
/// weights than the file can hold, or a scaler that does not fit the model's features (wrong
/// length, a non-finite mean, a standard deviation that is not positive and finite), is an
/// error naming the file.
pub fn open_forecaster<B: Backend>(path: &Path, device: &B::Device) -> Result<Opened<B>, ForecastError> {
    let fail = |why: String| ForecastError::Data(DataError::Data { origin: path.display().to_string(), why });
    let (config, _) = read_checkpoint_header::<ForecasterConfig>(path)?;
    let need = config.min_weights().map_err(|e| fail(format!("its {e}")))?;
    let len =
        std::fs::metadata(path).map_err(|cause| ForecastError::from(DataError::Io { path: path.display().to_string(), cause }))?.len();
    if (need as u64).saturating_mul(8) > len {
        return Err(fail(format!(
            "its config needs at least {need} weights, but the file ({len} bytes) can hold at most {} of them",
            len / 8
        )));
    }
    let Loaded { module, meta, .. } = load_checkpoint::<B, Forecaster<B>, ForecasterConfig>(path, device, |c, d| c.init(d))?;
    let scaler: Scaler =
        serde_json::from_value(meta["scaler"].clone()).map_err(|e| fail(format!("no usable data scaler in the checkpoint: {e}")))?;
    let n = module.spec().features.len();
    if scaler.mean.len() != n || scaler.std.len() != n {
        return Err(fail(format!(
            "its data scaler has {} means and {} deviations for the model's {n} columns",
            scaler.mean.len(),
            scaler.std.len()
        )));
    }
    if let Some(j) = (0..n).find(|&j| !(scaler.mean[j].is_finite() && scaler.std[j].is_finite() && scaler.std[j] > 0.0)) {
        return Err(fail(format!(
            "its data scaler for column `{}` is unusable (mean {}, std {})",
            module.spec().features[j],
            scaler.mean[j],
            scaler.std[j]
        )));
    }
    let calibration = match meta.get("calibration") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => {
            let c: Calibration =
                serde_json::from_value(v.clone()).map_err(|e| fail(format!("its quantile calibration is unreadable: {e}")))?;
            let (t, h) = (module.spec().targets.len(), module.spec().horizon);
            for iv in [&c.model, &c.repeat] {
                iv.check(t, h).map_err(fail)?;
            }
            Some(c)
        }
    };
    Ok(Opened { model: module, scaler, calibration, meta })
}
