use burn::prelude::*;
use burn::tensor::TensorData;
use mamba2_cpu::Picks;

use crate::block::Mamba2Block;
use crate::bridge;
use crate::mixer::{join_pieces, pieces};
use crate::norm::RmsNorm;
use crate::{Mamba2Config, Mamba2State, ModelError};

/// The residual stack: `n_layer` blocks and a final RMS norm, from `[batch, L, d_model]` to
/// `[batch, L, d_model]`. The heads ([`Mamba2TimeSeries`](crate::Mamba2TimeSeries),
/// [`Mamba2LM`](crate::Mamba2LM)) put inputs into it and read outputs out of it.
#[derive(Module, Debug)]
pub struct Mamba2Stack<B: Backend> {
    /// The blocks, first first.
    pub layers: Vec<Mamba2Block<B>>,
    /// The final norm, `[d_model]`.
    pub norm_f: RmsNorm<B>,
    #[module(skip)]
    config: Mamba2Config,
}

impl<B: Backend> Mamba2Stack<B> {
    /// A stack with mamba_ssm's initialisation.
    pub fn init(config: &Mamba2Config, device: &B::Device) -> Result<Self, ModelError> {
        config.validate()?;
        let layers = (0..config.n_layer).map(|_| Mamba2Block::init(config, device)).collect::<Result<_, _>>()?;
        Ok(Self { layers, norm_f: RmsNorm::new(config.d_model, device), config: config.clone() })
    }

    pub(crate) fn from_parts(config: &Mamba2Config, layers: Vec<Mamba2Block<B>>, norm_f: RmsNorm<B>) -> Self {
        Self { layers, norm_f, config: config.clone() }
    }

    /// The config this stack was built with.
    pub fn config(&self) -> &Mamba2Config {
        &self.config
    }

    fn check_state(&self, state: &Mamba2State<B>, batch: usize) -> Result<(), ModelError> {
        if state.layers.len() != self.layers.len() {
            return Err(ModelError::State { why: format!("state has {} layers, the model {}", state.layers.len(), self.layers.len()) });
        }
        if state.batch() != batch {
            return Err(ModelError::State { why: format!("state is for batch {}, the input has {batch} rows", state.batch()) });
        }
        Ok(())
    }

    /// The stack over a sequence, continuing from `state` (zeros when `None`).
    ///
    /// Sequences longer than [`MAX_PIECE`](crate::MAX_PIECE) rows run piece by piece through all the layers, each
    /// piece continuing from the states the last one left: the same function, but every
    /// intermediate tensor is one piece long, so it stays in cache and in the allocator's
    /// reusable range, and the time per token does not grow with `L`.
    ///
    /// # Shapes
    /// - `h`: `[batch, L, d_model]`; output: `[batch, L, d_model]` (after the final norm)
    pub fn forward(&self, h: Tensor<B, 3>, state: Option<Mamba2State<B>>) -> Result<(Tensor<B, 3>, Mamba2State<B>), ModelError> {
        self.run(h, state, None)
    }

    /// [`forward`](Self::forward)'s output at `picks`' rows of each sequence alone: its last row
    /// and, going back `picks.every` rows at a time, `picks.n - 1` more, oldest first. The state
    /// handed on is the same as `forward`'s.
    ///
    /// For a head that reads only some rows (a forecaster scores every second one in training):
    /// on the CPU backends the last block's `out_proj`, residual and final norm then run at those
    /// rows alone, forward and backward. Elsewhere (and for sequences longer than
    /// [`MAX_PIECE`](crate::MAX_PIECE)) this is `forward` followed by the selection of the rows.
    ///
    /// # Errors
    /// [`ModelError::Picks`] when `picks` are not rows of the sequence.
    ///
    /// # Shapes
    /// - `h`: `[batch, L, d_model]`; output: `[batch, picks.n, d_model]`
    pub fn forward_picked(
        &self,
        h: Tensor<B, 3>,
        state: Option<Mamba2State<B>>,
        picks: Picks,
    ) -> Result<(Tensor<B, 3>, Mamba2State<B>), ModelError> {
        let len = h.dims()[1];
        if !picks.fit(len) {
            return Err(ModelError::Picks { n: picks.n, every: picks.every, len });
        }
        self.run(h, state, Some(picks))
    }

    fn run(
        &self,
        h: Tensor<B, 3>,
        state: Option<Mamba2State<B>>,
        picks: Option<Picks>,
    ) -> Result<(Tensor<B, 3>, Mamba2State<B>), ModelError> {
        let [batch, len, _] = h.dims();
        let mut states: Vec<_> = match state {
            Some(s) => {
                self.check_state(&s, batch)?;
                s.layers.into_iter().map(Some).collect()
            }
            None => vec![None; self.layers.len()],
        };
        let mut outs = Vec::new();
        let eps = self.config.norm_eps;
        let last = self.layers.len().checked_sub(1);
        let host = bridge::runs_on_host::<B>();
        let pieces = pieces(h);
        // The host kernel picks the rows inside the last block where the sequence is one piece;
        // otherwise they are selected from the whole output below.
        let (inside, after) = match picks {
            Some(p) if p.all(len) => (None, None),
            Some(p) if host && pieces.len() == 1 && last.is_some() => (Some(p), None),
            other => (None, other),
        };
        for mut piece in pieces {
            for (i, (layer, s)) in self.layers.iter().zip(states.iter_mut()).enumerate() {
                let post_norm = (Some(i) == last).then_some(&self.norm_f);
                // On the CPU backends a block and, after the last one, the final norm are one
                // call into the host kernels.
                let (next, state_after) = if host {
                    bridge::block(layer, piece, s.take(), post_norm, inside.filter(|_| Some(i) == last))?
                } else {
                    let (y, state_after) = layer.forward(piece, s.take())?;
                    (if let Some(norm) = post_norm { norm.forward(y, eps) } else { y }, state_after)
                };
                piece = next;
                *s = Some(state_after);
            }
            outs.push(if last.is_some() { piece } else { self.norm_f.forward(piece, eps) });
        }
        let mut out = join_pieces(outs);
        if let Some(p) = after {
            let rows: Vec<i64> = (0..p.n).map(|j| p.row(len, j) as i64).collect();
            let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [p.n]), &out.device());
            out = out.select(1, rows);
        }
        let layers = states.into_iter().map(|s| s.expect("every layer ran at least once")).collect();
        Ok((out, Mamba2State { layers }))
    }

    /// One step for one new row per batch entry.
    ///
    /// # Shapes
    /// - `h`: `[batch, d_model]`; output: `[batch, d_model]`
    pub fn step(&self, mut h: Tensor<B, 2>, state: Mamba2State<B>) -> Result<(Tensor<B, 2>, Mamba2State<B>), ModelError> {
        self.check_state(&state, h.dims()[0])?;
        let mut out = Vec::with_capacity(self.layers.len());
        for (layer, s) in self.layers.iter().zip(state.layers) {
            let (next, s) = layer.step(h, s)?;
            h = next;
            out.push(s);
        }
        Ok((self.norm_f.forward(h, self.config.norm_eps), Mamba2State { layers: out }))
    }
}
