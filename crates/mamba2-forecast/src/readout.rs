//! The forecaster's training loss on the CPU backends: the head, the direct map, the cycle and
//! the loss over the scored rows as one autodiff node (`mamba2_cpu::readout`), instead of a
//! dozen tensor passes over the `[rows, H]` forecasts. [`Forecaster::loss`](crate::Forecaster::loss)
//! chooses it where `mamba2_model::runs_on_host` holds and the model has no active dropout; its
//! tensor version stays the reference (`tests/forecast.rs` checks both agree on the loss and on
//! every gradient).

use std::sync::Arc;

use mamba2_cpu::readout::{self, CycleRef, LossWeights, ReadoutDims, ReadoutPlan, ReadoutSaved};
use mamba2_model::{HostFloat, HostOp};

use crate::truth::RelativeTruth;

/// The node's inputs by position: what [`Readout`] reads from each.
pub(crate) const HIDDEN: usize = 0;
pub(crate) const HEAD: usize = 1;
pub(crate) const DIRECT: usize = 2;
pub(crate) const CYCLE: usize = 3;
pub(crate) const INPUTS: usize = 4;
pub(crate) const SCALE: usize = 5;
/// Inputs of the node.
pub(crate) const PARENTS: usize = 6;

/// The readout's sizes and the constants that are not tensors: the cycle's rows, the truth
/// (which has no gradient, and stays on the host in its compact form) and the loss.
#[derive(Debug, Clone)]
pub(crate) struct Readout {
    pub dims: ReadoutDims,
    /// `series * period + phase` of each scored row, and the period, when the model has a cycle.
    pub cycle: Option<(Vec<i64>, usize)>,
    pub truth: Arc<RelativeTruth>,
    pub loss: LossWeights,
}

impl Readout {
    fn plan<'a, T: HostFloat>(&'a self, x: &[Option<&'a [T]>; PARENTS]) -> ReadoutPlan<'a, T> {
        let need = |i: usize| x[i].expect("given by Forecaster::loss");
        ReadoutPlan {
            dims: self.dims,
            hidden: need(HIDDEN),
            head_w: need(HEAD),
            direct: x[DIRECT].map(|w| (need(INPUTS), w)),
            scale: x[SCALE],
            cycle: self.cycle.as_ref().map(|(now, period)| CycleRef { q: need(CYCLE), now, period: *period }),
            truth: self.truth.view(),
            loss: self.loss,
        }
    }
}

impl HostOp<PARENTS> for Readout {
    type Saved<T: HostFloat> = ReadoutSaved<T>;

    fn out_len(&self) -> usize {
        1
    }

    fn forward<T: HostFloat>(&self, inputs: [Option<&[T]>; PARENTS], keep: bool) -> (Vec<T>, Option<ReadoutSaved<T>>) {
        let (loss, saved) = readout::forward(&self.plan(&inputs), keep);
        (vec![T::from(loss).expect("a float")], saved)
    }

    fn backward<T: HostFloat>(
        &self,
        inputs: [Option<&[T]>; PARENTS],
        saved: &ReadoutSaved<T>,
        gout: &[T],
        _wanted: [bool; PARENTS],
    ) -> [Vec<T>; PARENTS] {
        let g = readout::backward(&self.plan(&inputs), saved, gout[0]);
        let mut out: [Vec<T>; PARENTS] = Default::default();
        out[HIDDEN] = g.hidden;
        out[HEAD] = g.head_w;
        out[DIRECT] = g.direct_w;
        out[CYCLE] = g.q;
        out
    }
}
