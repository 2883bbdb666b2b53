//! A mixer's sizes and the layout of its rows, in one place for the training kernel and the
//! streaming step alike.
//!
//! `in_proj` writes one row of `width()` values per position: `z | xBC | dt`, with `z` and the
//! `x` part of `xBC` `d_inner` wide, `B` and `C` `ngroups * d_state` each, `dt` `nheads`. Head
//! `h` reads columns `h * headdim..` of `x` and the `B` and `C` of its group `h / (nheads /
//! ngroups)`. The methods below name those ranges; no pass spells the offsets out itself.

use std::ops::Range;

/// Sizes and settings of one call; the names are the config's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    /// Sequences in the call.
    pub batch: usize,
    /// Positions per sequence.
    pub len: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Scan heads.
    pub nheads: usize,
    /// Channels per head.
    pub headdim: usize,
    /// Groups sharing one `B` and `C`.
    pub ngroups: usize,
    /// State size per channel.
    pub d_state: usize,
    /// Taps of the causal convolution.
    pub d_conv: usize,
    /// `D` per channel (`[d_inner]`) rather than per head.
    pub d_per_channel: bool,
    /// `dt`'s clamp: no lower bound when 0, no upper bound when infinite.
    pub dt_lo: f64,
    /// See `dt_lo`.
    pub dt_hi: f64,
    /// Gate before the norm (`norm_before_gate = false`, the default) or after it.
    pub gate_first: bool,
    /// The norms' epsilon.
    pub eps: f64,
}

impl Dims {
    /// `nheads * headdim`: the width of `z`, of `x` and of the scan's output.
    #[inline]
    pub fn d_inner(&self) -> usize {
        self.nheads * self.headdim
    }
    /// Width of `xBC`, what the convolution runs over.
    #[inline]
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.ngroups * self.d_state
    }
    /// Width of an `in_proj` output row: `z | xBC | dt`.
    #[inline]
    pub fn width(&self) -> usize {
        self.d_inner() + self.conv_dim() + self.nheads
    }
    /// Values of one sequence's scan state, `nheads * headdim * d_state`.
    #[inline]
    pub fn state_len(&self) -> usize {
        self.nheads * self.headdim * self.d_state
    }
    /// Positions in the call, `batch * len`.
    #[inline]
    pub fn rows(&self) -> usize {
        self.batch * self.len
    }

    /// `z`'s columns in an `in_proj` row.
    #[inline]
    pub fn z(&self) -> Range<usize> {
        0..self.d_inner()
    }
    /// `xBC`'s columns in an `in_proj` row.
    #[inline]
    pub fn xbc(&self) -> Range<usize> {
        self.d_inner()..self.d_inner() + self.conv_dim()
    }
    /// `dt`'s columns in an `in_proj` row (one per head).
    #[inline]
    pub fn dt(&self) -> Range<usize> {
        let at = self.d_inner() + self.conv_dim();
        at..at + self.nheads
    }
    /// The group whose `B` and `C` head `head` reads.
    #[inline]
    pub fn group_of(&self, head: usize) -> usize {
        head / (self.nheads / self.ngroups)
    }
    /// Head `head`'s columns of `x` in an `xBC` row (and of the scan's output row).
    #[inline]
    pub fn x_of(&self, head: usize) -> Range<usize> {
        head * self.headdim..(head + 1) * self.headdim
    }
    /// The `B` columns of group `group` in an `xBC` row.
    #[inline]
    pub fn b_of(&self, group: usize) -> Range<usize> {
        let at = self.d_inner() + group * self.d_state;
        at..at + self.d_state
    }
    /// All `B` and then all `C` columns of an `xBC` row.
    #[inline]
    pub fn bc(&self) -> Range<usize> {
        self.d_inner()..self.conv_dim()
    }
    /// The `C` columns of group `group` in an `xBC` row.
    #[inline]
    pub fn c_of(&self, group: usize) -> Range<usize> {
        let at = self.d_inner() + (self.ngroups + group) * self.d_state;
        at..at + self.d_state
    }
}

/// Rows of each sequence that a layer's output is wanted at: the last one and, going back
/// `every` rows at a time, `n - 1` more. A forecaster scores only these rows, so its last layer
/// need not run `out_proj`, the residual and the final norm anywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Picks {
    /// Rows picked per sequence.
    pub n: usize,
    /// Rows between two picked rows.
    pub every: usize,
}

impl Picks {
    /// The row of pick `j` (`0..n`, oldest first) in a sequence of `len` rows.
    #[inline]
    pub fn row(&self, len: usize, j: usize) -> usize {
        len - 1 - (self.n - 1 - j) * self.every
    }

    /// Whether these are rows of a sequence of `len`: at least one, `every >= 1`, and the oldest
    /// at row 0 or after it.
    pub fn fit(&self, len: usize) -> bool {
        self.n >= 1 && self.every >= 1 && (self.n - 1).checked_mul(self.every).is_some_and(|back| back < len)
    }

    /// Whether these are all `len` rows, in order.
    pub fn all(&self, len: usize) -> bool {
        self.n == len && (self.every == 1 || len == 1)
    }

    /// The picked rows of `batch` sequences of `len` rows as indices into all `batch * len` of
    /// them, sequence after sequence.
    pub fn indices(&self, batch: usize, len: usize) -> Vec<usize> {
        (0..batch).flat_map(|b| (0..self.n).map(move |j| b * len + self.row(len, j))).collect()
    }
}
