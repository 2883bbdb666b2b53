//! Data-parallel training inside one process: `W` workers, one thread each with its own copy of
//! the model, on `burn-collective`'s all-reduce. Every step each worker takes its contiguous
//! share of the global batch, computes the gradient of its part of the global loss (its windows'
//! sum divided by the global count, so that the parts add up to the one-worker loss), and the
//! gradients are summed across workers; every worker then applies the same AdamW update to the
//! same gradient (global-norm clipping included), so the copies stay equal.
//!
//! Parameters are reduced in the modules' visiting order, not by Burn's `ParamId`s, which differ
//! between copies made independently. Collectives run on the inner (non-autodiff) backend.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::TensorPrimitive;
use burn_collective::{all_reduce, finish_collective, register, CollectiveConfig, PeerId, ReduceOperation};

use crate::TrainError;

/// One worker's place in a data-parallel run: `rank` of `world` workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// This worker, `0..world`; worker 0 validates, reports and writes the run directory.
    pub rank: usize,
    /// The number of workers.
    pub world: usize,
}

impl Peer {
    /// The only worker of an ordinary run: no collective at all.
    pub fn alone() -> Self {
        Peer { rank: 0, world: 1 }
    }

    /// Whether this worker writes files and reports progress.
    pub fn leads(&self) -> bool {
        self.rank == 0
    }

    fn id(&self) -> PeerId {
        PeerId::from(self.rank as u32)
    }

    fn error(&self, what: &str, e: impl std::fmt::Debug) -> TrainError {
        TrainError::Collective { rank: self.rank, why: format!("{what}: {e:?}") }
    }

    /// This worker's share of a batch's windows: a contiguous block, the first `len % world`
    /// workers one window larger.
    pub fn shard<'a, T>(&self, batch: &'a [T]) -> &'a [T] {
        let (base, extra) = (batch.len() / self.world, batch.len() % self.world);
        let start = self.rank * base + self.rank.min(extra);
        &batch[start..start + base + usize::from(self.rank < extra)]
    }

    /// Joins the collective of `world` workers (nothing for a worker alone).
    pub(crate) fn join<B: Backend>(&self, device: &B::Device) -> Result<(), TrainError> {
        if self.world > 1 {
            register::<B>(self.id(), device.clone(), CollectiveConfig::default().with_num_devices(self.world))
                .map_err(|e| self.error("joining the workers", e))?;
        }
        Ok(())
    }

    /// Leaves the collective.
    pub(crate) fn leave<B: Backend>(&self) -> Result<(), TrainError> {
        if self.world > 1 {
            finish_collective::<B>(self.id()).map_err(|e| self.error("leaving the workers", e))?;
        }
        Ok(())
    }

    /// `values` summed over the workers, element by element.
    pub(crate) fn sum_values<B: Backend>(&self, values: &[f64], device: &B::Device) -> Result<Vec<f64>, TrainError> {
        if self.world == 1 {
            return Ok(values.to_vec());
        }
        let t = Tensor::<B, 1>::from_data(TensorData::new(values.to_vec(), [values.len()]).convert::<B::FloatElem>(), device);
        let summed = all_reduce::<B>(self.id(), t.into_primitive().tensor(), ReduceOperation::Sum).map_err(|e| self.error("summing", e))?;
        let t = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(summed));
        Ok(t.into_data().convert::<f64>().into_vec::<f64>().expect("converted to f64"))
    }

    /// Every parameter's gradient summed over the workers, in `model`'s visiting order (the
    /// same on every worker). A parameter without a gradient on this worker takes part with
    /// zeros, so that every worker makes the same calls.
    pub(crate) fn sum_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: &M,
        grads: GradientsParams,
    ) -> Result<GradientsParams, TrainError> {
        if self.world == 1 {
            return Ok(grads);
        }
        let mut visitor = SumGrads::<B> { peer: *self, grads, failed: None, _b: std::marker::PhantomData };
        model.visit(&mut visitor);
        match visitor.failed {
            Some(e) => Err(e),
            None => Ok(visitor.grads),
        }
    }
}

struct SumGrads<B: AutodiffBackend> {
    peer: Peer,
    grads: GradientsParams,
    failed: Option<TrainError>,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SumGrads<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.failed.is_some() {
            return;
        }
        let id = param.id;
        let grad = self.grads.remove::<B::InnerBackend, D>(id).unwrap_or_else(|| param.val().inner().zeros_like());
        match all_reduce::<B::InnerBackend>(self.peer.id(), grad.into_primitive().tensor(), ReduceOperation::Sum) {
            Ok(summed) => self.grads.register::<B::InnerBackend, D>(id, Tensor::from_primitive(TensorPrimitive::Float(summed))),
            Err(e) => self.failed = Some(self.peer.error("summing gradients", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_in_order() {
        let batch: Vec<usize> = (0..32).collect();
        for world in 1..=5 {
            let joined: Vec<usize> = (0..world).flat_map(|rank| Peer { rank, world }.shard(&batch).to_vec()).collect();
            assert_eq!(joined, batch, "world {world}");
            let sizes: Vec<usize> = (0..world).map(|rank| Peer { rank, world }.shard(&batch).len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "world {world}: {sizes:?}");
        }
    }
}
