use burn::prelude::*;
use mamba2_tensor::{expect_positive, pad_to_multiple, segsum};

use crate::{SsdDims, SsdError, SsdInput, SsdOutput};

/// The chunked SSD scan (state-space duality), the training algorithm of Mamba-2.
///
/// The sequence is cut into chunks of `chunk_size` steps. Inside a chunk the output is a masked
/// attention-like product (`C_i . B_j` times the decay from `j` to `i`); between chunks a
/// recurrence carries the state. The result equals [`ssd_sequential`](crate::ssd_sequential) up
/// to rounding, for any length: a sequence that is not a chunk multiple is padded internally with
/// `dt = 0` steps, which neither decay nor write the state, and the padding is sliced off.
///
/// All log-decay sums are stable segment sums ([`segsum`]) masked with `-inf` before `exp`, so
/// that no `inf * 0` can appear, forward or backward, at any decay strength.
///
/// # Shapes
/// See [`SsdInput`] and [`SsdOutput`]: `x [batch, L, H, P]`, `dt [batch, L, H]`, `a [H]`,
/// `b, c [batch, L, G, N]` -> `y [batch, L, H, P]`, `final_state [batch, H, P, N]`.
///
/// # Errors
/// [`SsdError`] when the shapes do not fit together or `chunk_size` is 0.
pub fn ssd_chunked<B: Backend>(input: SsdInput<B>, chunk_size: usize) -> Result<SsdOutput<B>, SsdError> {
    let SsdDims { batch, len, nheads: h, headdim: p, ngroups: g, d_state: n } = input.dims()?;
    expect_positive("chunk_size", chunk_size)?;
    let q = chunk_size;
    let hg = h / g;
    let device = input.x.device();

    let (x, _) = pad_to_multiple(input.x.clone(), 1, q)?;
    let (dt, _) = pad_to_multiple(input.dt, 1, q)?;
    let (bm, _) = pad_to_multiple(input.b, 1, q)?;
    let (cm, _) = pad_to_multiple(input.c, 1, q)?;
    let nc = x.dims()[1] / q;

    // Head-major inside each chunk: X = x * dt as [batch, nc, H, Q, P], a * dt as [batch, nc, H, Q].
    let xdt = (x * dt.clone().unsqueeze_dim::<4>(3)).reshape([batch, nc, q, h, p]).swap_dims(2, 3);
    let adt = (dt * input.a.reshape([1, 1, h])).reshape([batch, nc, q, h]).swap_dims(2, 3);
    let a_cumsum = adt.clone().cumsum(3);
    // decay[.., i, j] = exp(a_{j+1} + ... + a_i), zero above the diagonal.
    let decay = segsum(adt.reshape([batch * nc * h, q])).exp().reshape([batch, nc, h, q, q]);
    let bm = bm.reshape([batch, nc, q, g, n]).swap_dims(2, 3);
    let cm = cm.reshape([batch, nc, q, g, n]).swap_dims(2, 3);

    // 1. Inside each chunk: Y_diag[i] = sum_{j <= i} (C_i . B_j) decay[i, j] X_j. C . B is
    // computed once per group and broadcast over the group's heads.
    let cb = cm.clone().matmul(bm.clone().swap_dims(3, 4)).unsqueeze_dim::<6>(3);
    let scores = cb * decay.clone().reshape([batch, nc, g, hg, q, q]);
    let y_diag = scores.reshape([batch * nc * h, q, q]).matmul(xdt.clone().reshape([batch * nc * h, q, p])).reshape([batch, nc, h, q, p]);

    // 2. The state each chunk writes: S^c = sum_j decay[Q-1, j] X_j (outer) B_j. The last row
    // of the segment sums is the stable decay to the chunk's end.
    let to_end = decay.narrow(3, q - 1, 1).reshape([batch, nc, h, q, 1]);
    let chunk_states = (xdt * to_end)
        .reshape([batch, nc, g, hg, q, p])
        .swap_dims(4, 5)
        .reshape([batch, nc, g, hg * p, q])
        .matmul(bm)
        .reshape([batch, nc, h, p, n]);

    // 3. Between chunks: S_in_{c+1} = exp(sum of a over chunk c) S_in_c + S^c, all chunks at once
    // as one product with the chunk-level decay matrix.
    let initial = match input.initial_state {
        Some(s) => s,
        None => Tensor::zeros([batch, h, p, n], &device),
    };
    let states = Tensor::cat(vec![initial.unsqueeze_dim::<5>(1), chunk_states], 1);
    let totals = a_cumsum.clone().narrow(3, q - 1, 1).reshape([batch, nc, h]).swap_dims(1, 2);
    let totals = Tensor::cat(vec![Tensor::zeros([batch, h, 1], &device), totals], 2);
    let chunk_decay = segsum(totals.reshape([batch * h, nc + 1])).exp().reshape([batch, h, nc + 1, nc + 1]);
    let carried = chunk_decay.matmul(states.swap_dims(1, 2).reshape([batch, h, nc + 1, p * n]));
    let final_state = carried.clone().narrow(2, nc, 1).reshape([batch, h, p, n]);
    let states_in = carried.narrow(2, 0, nc).reshape([batch, h, nc, p, n]).swap_dims(1, 2);

    // 4. What the carried-in state contributes: Y_off[i] = exp(a_0 + ... + a_i) C_i . S_in.
    let y_off = cm
        .matmul(states_in.reshape([batch, nc, g, hg * p, n]).swap_dims(3, 4))
        .reshape([batch, nc, g, q, hg, p])
        .swap_dims(3, 4)
        .reshape([batch, nc, h, q, p])
        * a_cumsum.exp().unsqueeze_dim::<5>(4);

    let y = (y_diag + y_off).swap_dims(2, 3).reshape([batch, nc * q, h, p]).narrow(1, 0, len);
    let y = match &input.d {
        Some(d) => d.apply(y, input.x),
        None => y,
    };
    Ok(SsdOutput { y, final_state })
}
