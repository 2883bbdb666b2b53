//! Tick-by-tick forecasting: one forecast per incoming row from the recurrent state, with work
//! per row that does not depend on how long the history is.

use burn::prelude::*;
use mamba2_model::{HostFloat, ModelError, StreamingStack, StreamingState};

use mamba2_data::quantile::Intervals;

use crate::features::{RowEncoder, RowRef};
use crate::forecaster::Forecaster;

/// A trained [`Forecaster`] on the host, advanced one row at a time: the rolling statistics,
/// the stack's recurrent state (in `T`) and the heads. After the rows of a history it gives what
/// [`Forecaster::forecast_history`] gives for them.
#[derive(Debug, Clone)]
pub struct ForecastStream<T: HostFloat> {
    encoder: RowEncoder,
    stack: StreamingStack<T>,
    state: StreamingState<T>,
    /// `[n_feat, d_model]` and its bias.
    input_w: Vec<f64>,
    input_b: Option<Vec<f64>>,
    /// `[d_model, H]`.
    head_w: Vec<f64>,
    /// `[n_feat, H]`, for the direct map.
    direct_w: Option<Vec<f64>>,
    /// `[T * period, H]`, the learned cycle's steps ahead.
    cycle: Option<Vec<f64>>,
    n_feat: usize,
    d_model: usize,
    horizon: usize,
    inputs: Vec<f64>,
    refs: Vec<RowRef>,
    u: Vec<T>,
    hidden: Vec<T>,
    /// The calibrated intervals, with each target's recent values for their local scale.
    intervals: Option<Intervals>,
    recent: Vec<Vec<f64>>,
}

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    mamba2_tensor::compare::to_f64_vec(t)
}

impl<T: HostFloat> ForecastStream<T> {
    /// A stream at the start of a history.
    pub fn new<B: Backend>(model: &Forecaster<B>) -> Self {
        let map = model.feature_map();
        let t_n = map.targets.len();
        let stack = StreamingStack::new(&model.mamba.backbone);
        let state = stack.zero_state(t_n);
        let d_model = model.mamba.config().d_model;
        Self {
            n_feat: map.n_feat(),
            d_model,
            horizon: model.spec().horizon,
            inputs: vec![0.0; t_n * map.n_feat()],
            refs: vec![RowRef { level: 0.0, scale: 1.0, cycle_row: 0 }; t_n],
            u: vec![T::zero(); t_n * d_model],
            hidden: vec![T::zero(); t_n * d_model],
            encoder: RowEncoder::new(&map),
            stack,
            state,
            input_w: host(model.mamba.input_proj.weight.val()),
            input_b: model.mamba.input_proj.bias.as_ref().map(|b| host(b.val())),
            head_w: host(model.mamba.output_proj.weight.val()),
            direct_w: model.direct.as_ref().map(|d| host(d.weight.val())),
            cycle: model.cycle_table().map(host),
            intervals: None,
            recent: vec![Vec::new(); t_n],
        }
    }

    /// The same stream, also keeping what [`ForecastStream::quantiles`] needs (each target's
    /// last `intervals.memory()` values: 8 bytes each per target).
    ///
    /// # Errors
    /// [`ModelError::State`] when the intervals were made for another number of targets or
    /// steps.
    pub fn with_intervals(mut self, intervals: Intervals) -> Result<Self, ModelError> {
        intervals.check(self.refs.len(), self.horizon).map_err(|why| ModelError::State { why })?;
        self.intervals = Some(intervals);
        Ok(self)
    }

    /// The quantiles, `[H, n_targets, levels]` row-major in the scaled units, of the point
    /// forecast `point` that the last [`ForecastStream::push`] returned; `None` without
    /// intervals.
    pub fn quantiles(&self, point: &[f64]) -> Option<Vec<f64>> {
        self.intervals.as_ref().map(|iv| iv.quantiles(point, |t| &self.recent[t]))
    }

    /// Adds one row (every input column, scaled as in training) at calendar clock `clock` and
    /// returns the forecast of the next `H` rows after it, `[H, n_targets]` row-major, in the
    /// scaled units of the data.
    ///
    /// # Errors
    /// [`ModelError::State`] when `row` does not hold every input column.
    pub fn push(&mut self, row: &[f64], clock: i64) -> Result<Vec<f64>, ModelError> {
        let want = self.encoder.map().targets.iter().chain(&self.encoder.map().covariates).max().map_or(0, |&m| m + 1);
        if row.len() < want {
            return Err(ModelError::State { why: format!("a row needs {want} values, got {}", row.len()) });
        }
        self.encoder.push(row, clock, &mut self.inputs, &mut self.refs);
        if let Some(iv) = &self.intervals {
            // Trimmed in bulk, so that keeping the last values costs O(1) per row.
            let keep = iv.memory().max(1);
            for (recent, &j) in self.recent.iter_mut().zip(&self.encoder.map().targets) {
                recent.push(row[j]);
                if recent.len() >= 2 * keep + 64 {
                    recent.drain(..recent.len() - keep);
                }
            }
        }
        let (f, d, h) = (self.n_feat, self.d_model, self.horizon);
        let t_n = self.refs.len();
        for c in 0..t_n {
            let x = &self.inputs[c * f..(c + 1) * f];
            for o in 0..d {
                let mut acc = self.input_b.as_ref().map_or(0.0, |b| b[o]);
                for (i, &v) in x.iter().enumerate() {
                    acc += v * self.input_w[i * d + o];
                }
                self.u[c * d + o] = <T as num_traits::NumCast>::from(acc).expect("finite");
            }
        }
        self.stack.step(&mut self.state, &self.u, &mut self.hidden)?;
        let mut y = vec![0.0; h * t_n];
        let mut out = vec![0.0; h];
        for c in 0..t_n {
            out.fill(0.0);
            for i in 0..d {
                let v: f64 = num_traits::ToPrimitive::to_f64(&self.hidden[c * d + i]).expect("finite");
                for (o, w) in out.iter_mut().zip(&self.head_w[i * h..(i + 1) * h]) {
                    *o += v * w;
                }
            }
            if let Some(dw) = &self.direct_w {
                for (i, &v) in self.inputs[c * f..(c + 1) * f].iter().enumerate() {
                    for (o, w) in out.iter_mut().zip(&dw[i * h..(i + 1) * h]) {
                        *o += v * w;
                    }
                }
            }
            let r = self.refs[c];
            for k in 0..h {
                // As Forecaster::forward: (heads * scale + cycle) + level.
                let cycle = self.cycle.as_ref().map_or(0.0, |q| q[r.cycle_row as usize * h + k]);
                y[k * t_n + c] = (out[k] * r.scale + cycle) + r.level;
            }
        }
        Ok(y)
    }
}
