use burn::prelude::*;
use mamba2_tensor::repeat_interleave;

use crate::{SsdDims, SsdError, StepInput, StepOutput};

/// One recurrent step, for decoding and streaming:
/// `state' = exp(dt A) state + dt x (outer) B`, `y = state' C + D x`.
///
/// Calling it `L` times, feeding each returned state back in, gives the same outputs and final
/// state as one [`ssd_chunked`](crate::ssd_chunked) over the `L` steps.
///
/// # Shapes
/// See [`StepInput`] and [`StepOutput`]: `x [batch, H, P]`, `dt [batch, H]`, `a [H]`,
/// `b, c [batch, G, N]`, `state [batch, H, P, N]` -> `y [batch, H, P]`, `state [batch, H, P, N]`.
///
/// # Errors
/// [`SsdError`] when the shapes do not fit together.
pub fn ssd_step<B: Backend>(input: StepInput<B>) -> Result<StepOutput<B>, SsdError> {
    let SsdDims { batch, nheads: h, headdim: p, ngroups: g, d_state: n, .. } = input.dims()?;
    let decay = (input.dt.clone() * input.a.reshape([1, h])).exp().reshape([batch, h, 1, 1]);
    let b = repeat_interleave(input.b, 1, h / g)?.reshape([batch, h, 1, n]);
    let c = repeat_interleave(input.c, 1, h / g)?.reshape([batch, h, 1, n]);
    let xdt = (input.x.clone() * input.dt.reshape([batch, h, 1])).reshape([batch, h, p, 1]);
    let state = input.state * decay + xdt * b;
    let y = (state.clone() * c).sum_dim(3).reshape([batch, h, p]);
    let y = match &input.d {
        Some(d) => d.apply(y, input.x),
        None => y,
    };
    Ok(StepOutput { y, state })
}
