//! What the core's passes share: the parameters and inputs they read, and what the forward keeps
//! for the backward. "Core" is everything between `in_proj` and `out_proj`.

/// The learned parameters the core reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params<'a, T> {
    /// `[conv_dim, d_conv]`.
    pub conv_w: &'a [T],
    pub conv_b: Option<&'a [T]>,
    pub dt_bias: &'a [T],
    pub a_log: &'a [T],
    /// `[nheads]` or `[d_inner]`.
    pub d: &'a [T],
    /// `[d_inner]`.
    pub norm_w: &'a [T],
}

/// The inputs that vary per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs<'a, T> {
    /// `[batch, L, width]`, the `in_proj` output.
    pub zx: &'a [T],
    /// `[batch, d_conv - 1, conv_dim]`, the convolution's left context; zeros when `None`.
    pub tail: Option<&'a [T]>,
    /// `[batch, nheads, headdim, d_state]`; zeros when `None`.
    pub h0: Option<&'a [T]>,
}

/// What the forward keeps for the backward.
#[derive(Debug)]
pub(crate) struct Saved<T> {
    /// The sigmoid of the convolution's output, `[rows, conv_dim]`: with `xa` it gives the
    /// SiLU's derivative, `s (1 + x (1 - s)) = s + xa (1 - s)`, without a sigmoid in the backward.
    pub(crate) sx: Vec<T>,
    /// After the SiLU: `x | B | C`, `[rows, conv_dim]`.
    pub(crate) xa: Vec<T>,
    /// Per row `[dt | decay = exp(dt A) | d dt / d dt_raw]`, `[rows, 3 nheads]`: the decay and
    /// the derivative (0 where the clamp bites) computed once, not again in the backward.
    pub(crate) dt: Vec<T>,
    /// The scan output with the skip, before the norm, `[rows, d_inner]`.
    pub(crate) y: Vec<T>,
    /// `1 / rms` per row of the norm's output and norm group, `[out rows, ngroups]`.
    pub(crate) rstd: Vec<T>,
}
