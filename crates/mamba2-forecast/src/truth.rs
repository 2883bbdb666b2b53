//! What a training batch's forecasts are scored against: each forecast position's next `H`
//! values relative to its last one, kept once per sequence.

use burn::prelude::*;
use rayon::prelude::*;

/// What followed each forecast position of a batch, relative to its last value: step `s`
/// after position `j` of sequence `i` is `values[i * seq_stride + starts[j] + s] - level`. A
/// training batch holds each sequence's values once (the positions' overlap), an evaluation batch
/// each position's own `H` values.
#[derive(Debug, Clone)]
pub struct RelativeTruth {
    pub(crate) values: Vec<f64>,
    pub(crate) seq_stride: usize,
    pub(crate) starts: Vec<usize>,
    pub(crate) level: Vec<f64>,
    pub(crate) horizon: usize,
}

impl RelativeTruth {
    /// Forecast positions in all, `n_seq * n_pos`.
    pub fn positions(&self) -> usize {
        self.level.len()
    }

    /// Step `s` (`0..H`) after forecast position `q` (`0..positions()`, sequence after
    /// sequence), minus the position's last value.
    pub fn get(&self, q: usize, s: usize) -> f64 {
        let (values, level) = self.view().window(q, self.horizon);
        values[s] - level
    }

    /// `[n_seq, n_pos, H]` on `device`, for the loss as tensor operations.
    pub fn tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 3> {
        let (n_pos, h) = (self.starts.len().max(1), self.horizon);
        let mut out = vec![B::FloatElem::from_elem(0.0); self.positions() * h];
        // A million values at the default shape: written in parallel, in place.
        out.par_chunks_mut(h.max(1)).enumerate().for_each(|(q, o)| {
            let (values, level) = self.view().window(q, h);
            for (o, &v) in o.iter_mut().zip(values) {
                *o = B::FloatElem::from_elem(v - level);
            }
        });
        Tensor::from_data(TensorData::new(out, [self.positions() / n_pos, n_pos, h]), device)
    }

    /// The form the fused loss reads.
    pub(crate) fn view(&self) -> mamba2_cpu::readout::TruthRef<'_> {
        mamba2_cpu::readout::TruthRef { values: &self.values, seq_stride: self.seq_stride, starts: &self.starts, level: &self.level }
    }
}
