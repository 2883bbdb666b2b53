use burn::prelude::*;
use mamba2_tensor::{expect_divides, expect_positive, expect_shape, ShapeError};

use crate::SsdError;

/// The skip connection `D`: one scalar per head, or one per channel (`D_has_hdim`).
#[derive(Debug, Clone)]
pub enum Skip<B: Backend> {
    /// `D` of shape `[H]`.
    PerHead(Tensor<B, 1>),
    /// `D` of shape `[H, P]`.
    PerChannel(Tensor<B, 2>),
}

impl<B: Backend> Skip<B> {
    fn check(&self, nheads: usize, headdim: usize) -> Result<(), ShapeError> {
        match self {
            Skip::PerHead(d) => expect_shape("d", &d.dims(), &[nheads]),
            Skip::PerChannel(d) => expect_shape("d", &d.dims(), &[nheads, headdim]),
        }
    }

    /// `y + D * x` for `x` shaped `[..., H, P]`: `D` is broadcast over the leading axes (and over
    /// `P` when it is per head).
    pub(crate) fn apply<const R: usize>(&self, y: Tensor<B, R>, x: Tensor<B, R>) -> Tensor<B, R> {
        let dims = x.dims();
        let mut shape = [1; R];
        shape[R - 2] = dims[R - 2];
        if let Skip::PerChannel(_) = self {
            shape[R - 1] = dims[R - 1];
        }
        let d = match self {
            Skip::PerHead(d) => d.clone().reshape(shape),
            Skip::PerChannel(d) => d.clone().reshape(shape),
        };
        y + x * d
    }
}

/// The sizes of one scan, read off and checked against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsdDims {
    /// Batch rows.
    pub batch: usize,
    /// Sequence length `L`.
    pub len: usize,
    /// Heads `H`.
    pub nheads: usize,
    /// Channels per head `P`.
    pub headdim: usize,
    /// Groups `G` of B and C; head `h` reads group `h / (H / G)`.
    pub ngroups: usize,
    /// State size `N`.
    pub d_state: usize,
}

/// The inputs of a whole-sequence scan.
///
/// # Shapes
/// - `x`: `[batch, L, H, P]`
/// - `dt`: `[batch, L, H]`, already positive (after softplus and clamping)
/// - `a`: `[H]`, negative (`-exp(A_log)`)
/// - `b`, `c`: `[batch, L, G, N]`
/// - `d`: `[H]` or `[H, P]`
/// - `initial_state`: `[batch, H, P, N]`, zeros when absent
#[derive(Debug, Clone)]
pub struct SsdInput<B: Backend> {
    /// The per-head inputs.
    pub x: Tensor<B, 4>,
    /// The positive step sizes.
    pub dt: Tensor<B, 3>,
    /// The negative continuous-time decay rates.
    pub a: Tensor<B, 1>,
    /// The input projections into the state.
    pub b: Tensor<B, 4>,
    /// The output projections out of the state.
    pub c: Tensor<B, 4>,
    /// The optional skip connection.
    pub d: Option<Skip<B>>,
    /// The optional state to continue from.
    pub initial_state: Option<Tensor<B, 4>>,
}

impl<B: Backend> SsdInput<B> {
    /// The required inputs, with no skip connection and a zero initial state.
    pub fn new(x: Tensor<B, 4>, dt: Tensor<B, 3>, a: Tensor<B, 1>, b: Tensor<B, 4>, c: Tensor<B, 4>) -> Self {
        Self { x, dt, a, b, c, d: None, initial_state: None }
    }

    /// Adds the skip connection `D`.
    pub fn with_d(mut self, d: Skip<B>) -> Self {
        self.d = Some(d);
        self
    }

    /// Continues from `state` instead of zeros.
    pub fn with_initial_state(mut self, state: Tensor<B, 4>) -> Self {
        self.initial_state = Some(state);
        self
    }

    /// Reads the sizes off `x` and `b` and checks every other tensor against them.
    pub fn dims(&self) -> Result<SsdDims, SsdError> {
        let [batch, len, nheads, headdim] = self.x.dims();
        let [_, _, ngroups, d_state] = self.b.dims();
        for (what, v) in [
            ("batch", batch),
            ("sequence length", len),
            ("nheads", nheads),
            ("headdim", headdim),
            ("ngroups", ngroups),
            ("d_state", d_state),
        ] {
            expect_positive(what, v)?;
        }
        expect_divides("ngroups into nheads", ngroups, nheads)?;
        expect_shape("dt", &self.dt.dims(), &[batch, len, nheads])?;
        expect_shape("a", &self.a.dims(), &[nheads])?;
        expect_shape("b", &self.b.dims(), &[batch, len, ngroups, d_state])?;
        expect_shape("c", &self.c.dims(), &[batch, len, ngroups, d_state])?;
        if let Some(d) = &self.d {
            d.check(nheads, headdim)?;
        }
        if let Some(s) = &self.initial_state {
            expect_shape("initial_state", &s.dims(), &[batch, nheads, headdim, d_state])?;
        }
        Ok(SsdDims { batch, len, nheads, headdim, ngroups, d_state })
    }
}

/// The result of a whole-sequence scan.
///
/// # Shapes
/// - `y`: `[batch, L, H, P]`
/// - `final_state`: `[batch, H, P, N]`
#[derive(Debug, Clone)]
pub struct SsdOutput<B: Backend> {
    /// The outputs at every step.
    pub y: Tensor<B, 4>,
    /// The state after the last step.
    pub final_state: Tensor<B, 4>,
}

/// The inputs of one recurrent step.
///
/// # Shapes
/// - `x`: `[batch, H, P]`; `dt`: `[batch, H]`; `a`: `[H]`
/// - `b`, `c`: `[batch, G, N]`; `d`: `[H]` or `[H, P]`
/// - `state`: `[batch, H, P, N]`
#[derive(Debug, Clone)]
pub struct StepInput<B: Backend> {
    /// The per-head input of this step.
    pub x: Tensor<B, 3>,
    /// The positive step size of this step.
    pub dt: Tensor<B, 2>,
    /// The negative continuous-time decay rates.
    pub a: Tensor<B, 1>,
    /// The input projection of this step.
    pub b: Tensor<B, 3>,
    /// The output projection of this step.
    pub c: Tensor<B, 3>,
    /// The optional skip connection.
    pub d: Option<Skip<B>>,
    /// The state before this step.
    pub state: Tensor<B, 4>,
}

impl<B: Backend> StepInput<B> {
    /// Reads the sizes (with `len = 1`) and checks every tensor against them.
    pub fn dims(&self) -> Result<SsdDims, SsdError> {
        let [batch, nheads, headdim] = self.x.dims();
        let [_, ngroups, d_state] = self.b.dims();
        for (what, v) in [("batch", batch), ("nheads", nheads), ("headdim", headdim), ("ngroups", ngroups), ("d_state", d_state)] {
            expect_positive(what, v)?;
        }
        expect_divides("ngroups into nheads", ngroups, nheads)?;
        expect_shape("dt", &self.dt.dims(), &[batch, nheads])?;
        expect_shape("a", &self.a.dims(), &[nheads])?;
        expect_shape("b", &self.b.dims(), &[batch, ngroups, d_state])?;
        expect_shape("c", &self.c.dims(), &[batch, ngroups, d_state])?;
        expect_shape("state", &self.state.dims(), &[batch, nheads, headdim, d_state])?;
        if let Some(d) = &self.d {
            d.check(nheads, headdim)?;
        }
        Ok(SsdDims { batch, len: 1, nheads, headdim, ngroups, d_state })
    }
}

/// The result of one recurrent step.
///
/// # Shapes
/// - `y`: `[batch, H, P]`; `state`: `[batch, H, P, N]`
#[derive(Debug, Clone)]
pub struct StepOutput<B: Backend> {
    /// The output of this step.
    pub y: Tensor<B, 3>,
    /// The state after this step.
    pub state: Tensor<B, 4>,
}
