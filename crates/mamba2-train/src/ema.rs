//! An exponential moving average of a model's weights over the optimizer's steps (Polyak
//! averaging): the average of the last few hundred steps' weights forecasts better than the
//! weights of any one step, whose noise the average cancels.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::prelude::*;

use mamba2_forecast::Forecaster;

/// The averaged weights, in a model of their own.
#[derive(Debug, Clone)]
pub struct Ema<B: Backend> {
    /// The model holding the averages.
    pub model: Forecaster<B>,
    decay: f64,
    updates: u64,
}

struct Collect<B: Backend>(HashMap<ParamId, Tensor<B, 1>>);

impl<B: Backend> ModuleVisitor<B> for Collect<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        let n = t.shape().num_elements();
        self.0.insert(param.id, t.reshape([n]));
    }
}

struct Mix<B: Backend> {
    current: HashMap<ParamId, Tensor<B, 1>>,
    keep: f64,
}

impl<B: Backend> ModuleMapper<B> for Mix<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(cur) = self.current.remove(&param.id) else { return param };
        let keep = self.keep;
        param.map(|avg| {
            let shape = avg.shape();
            avg.mul_scalar(keep) + cur.reshape(shape).mul_scalar(1.0 - keep)
        })
    }
}

impl<B: Backend> Ema<B> {
    /// An average that starts at `model`'s weights and keeps `decay` of itself per update (a
    /// time constant of `1 / (1 - decay)` steps).
    pub fn new(model: Forecaster<B>, decay: f64) -> Self {
        Self { model, decay, updates: 0 }
    }

    /// The average as it stood after `updates` updates (on resume).
    pub fn resumed(model: Forecaster<B>, decay: f64, updates: u64) -> Self {
        Self { model, decay, updates }
    }

    /// Updates so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Moves the average towards `current` (a model of the same structure, whose parameters
    /// have the same ids, as [`AutodiffModule::valid`](burn::module::AutodiffModule::valid)
    /// keeps them). After `n` updates it keeps at most `(1 + n) / (10 + n)` of itself, so that
    /// early on it averages about the last tenth of the steps so far: a plain mean of all of
    /// them would still hold the first, untrained weights at the end of a short run (on 3,000
    /// rows of ETTh1 that cost 5 % of validation MSE).
    pub fn update(&mut self, current: &Forecaster<B>) {
        let n = self.updates as f64;
        let keep = self.decay.min((1.0 + n) / (10.0 + n));
        let mut collect = Collect(HashMap::new());
        current.visit(&mut collect);
        self.model = self.model.clone().map(&mut Mix { current: collect.0, keep });
        self.updates += 1;
    }
}
