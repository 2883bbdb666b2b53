//! Autodiff on several threads of one process, without losing gradients.
//!
//! Burn 0.21's autodiff keeps one registry of graphs for the whole process, and every
//! `backward()` ends by sweeping it for graphs that look unused. A graph that another thread is
//! building looks unused for a moment: the first operation on a parameter starts a graph of one
//! node, and some operations let go of their inputs before they register themselves. A sweep in
//! that moment deletes the node, and the parameter silently gets no gradient from that pass
//! (burn issue 5573, fixed after 0.21). Two tests that train on two threads hit it about once in
//! thirty runs here, and the data-parallel trainer, whose workers are threads, would have taken
//! the missing gradient for zero.
//!
//! The cure here is a rule: a thread builds a graph only inside [`recording`], and calls
//! `backward()` only through [`backward`]. Recordings run side by side; a backward waits until
//! no thread records and keeps them out while it runs. A graph that is complete and waits for
//! its backward is safe: its loss tensor holds its nodes. One thread alone pays one uncontended
//! lock per pass.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::prelude::*;
//! use mamba2_tensor::graph;
//!
//! type B = Autodiff<NdArray<f64>>;
//! let device = Default::default();
//! let w = Tensor::<B, 1>::from_data([1.0, 2.0], &device).require_grad();
//! let loss = {
//!     let _building = graph::recording();
//!     (w.clone() * w.clone()).sum()
//! };
//! let grads = graph::backward(loss);
//! assert_eq!(w.grad(&grads).unwrap().into_data().to_vec::<f64>().unwrap(), vec![2.0, 4.0]);
//! ```

use std::cell::Cell;
use std::sync::{RwLock, RwLockReadGuard};

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

static GRAPHS: RwLock<()> = RwLock::new(());

thread_local! {
    /// How many [`Recording`]s this thread holds: only the outermost takes the lock, so that
    /// nested recordings cannot queue behind a waiting backward and deadlock.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Proof that this thread may build autodiff graphs; see [`recording`].
#[derive(Debug)]
#[must_use = "the graph is only safe to build while the Recording is held"]
pub struct Recording {
    _shared: Option<RwLockReadGuard<'static, ()>>,
}

impl Drop for Recording {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Held while this thread builds an autodiff graph (a forward pass whose result will be
/// differentiated). Other threads may record at the same time; a [`backward`] waits for all of
/// them. Recordings nest.
pub fn recording() -> Recording {
    let outer = DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() == 1
    });
    // A poisoned lock only means another thread panicked while holding it; the unit it guards
    // cannot be left half-written.
    Recording { _shared: outer.then(|| GRAPHS.read().unwrap_or_else(|e| e.into_inner())) }
}

/// `loss.backward()` while no thread builds a graph.
///
/// # Panics
/// When this thread holds a [`Recording`]: it would wait for itself forever.
pub fn backward<B: AutodiffBackend, const D: usize>(loss: Tensor<B, D>) -> B::Gradients {
    assert_eq!(DEPTH.with(Cell::get), 0, "graph::backward inside a graph::recording on the same thread: drop the Recording first");
    let _alone = GRAPHS.write().unwrap_or_else(|e| e.into_inner());
    loss.backward()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};

    type B = Autodiff<Flex>;

    /// A backward on another thread waits while this thread records, through nested
    /// recordings, and runs once the outermost is dropped.
    #[test]
    fn a_backward_waits_for_every_recording() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::Duration;
        let done = AtomicBool::new(false);
        let outer = recording();
        let inner = recording();
        std::thread::scope(|s| {
            let other = s.spawn(|| {
                let device = Default::default();
                let w = Tensor::<B, 1>::ones([2], &device).require_grad();
                let loss = {
                    let _building = recording();
                    (w.clone() * 3.0).sum()
                };
                let grads = backward(loss);
                done.store(true, Ordering::SeqCst);
                w.grad(&grads).map(|g| g.into_data().to_vec::<f32>().unwrap())
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(!done.load(Ordering::SeqCst), "the backward ran during a recording");
            drop(inner);
            std::thread::sleep(Duration::from_millis(50));
            assert!(!done.load(Ordering::SeqCst), "the backward ran during the outer recording");
            drop(outer);
            assert_eq!(other.join().unwrap(), Some(vec![3.0, 3.0]));
        });
        assert_eq!(DEPTH.with(Cell::get), 0);
    }

    #[test]
    #[should_panic(expected = "drop the Recording first")]
    fn backward_inside_a_recording_is_refused() {
        let device = Default::default();
        let w = Tensor::<B, 1>::ones([2], &device).require_grad();
        let _building = recording();
        let _ = backward(w.sum());
    }
}
