use burn::prelude::*;
use mamba2_tensor::repeat_interleave;

use crate::{SsdDims, SsdError, SsdInput, SsdOutput};

/// The scan as its defining recurrence, one step at a time: the reference for
/// [`ssd_chunked`](crate::ssd_chunked).
///
/// `S_t = exp(dt_t A) S_{t-1} + dt_t x_t (outer) B_t`, `y_t = S_t C_t + D x_t`.
///
/// It costs `L` sequential steps (and as many autodiff nodes); use it to check results, not to
/// train.
///
/// # Shapes
/// The same as [`ssd_chunked`](crate::ssd_chunked).
///
/// # Errors
/// [`SsdError`] when the shapes do not fit together.
pub fn ssd_sequential<B: Backend>(input: SsdInput<B>) -> Result<SsdOutput<B>, SsdError> {
    let SsdDims { batch, len, nheads: h, headdim: p, ngroups: g, d_state: n } = input.dims()?;
    let device = input.x.device();
    let decay = (input.dt.clone() * input.a.reshape([1, 1, h])).exp();
    let xdt = input.x.clone() * input.dt.unsqueeze_dim::<4>(3);
    let bh = repeat_interleave(input.b, 2, h / g)?;
    let ch = repeat_interleave(input.c, 2, h / g)?;

    let mut state = match input.initial_state {
        Some(s) => s,
        None => Tensor::zeros([batch, h, p, n], &device),
    };
    let mut ys = Vec::with_capacity(len);
    for t in 0..len {
        let decay_t = decay.clone().narrow(1, t, 1).reshape([batch, h, 1, 1]);
        let x_t = xdt.clone().narrow(1, t, 1).reshape([batch, h, p, 1]);
        let b_t = bh.clone().narrow(1, t, 1).reshape([batch, h, 1, n]);
        let c_t = ch.clone().narrow(1, t, 1).reshape([batch, h, n, 1]);
        state = state * decay_t + x_t * b_t;
        ys.push(state.clone().matmul(c_t).reshape([batch, 1, h, p]));
    }
    let y = Tensor::cat(ys, 1);
    let y = match &input.d {
        Some(d) => d.apply(y, input.x),
        None => y,
    };
    Ok(SsdOutput { y, final_state: state })
}
