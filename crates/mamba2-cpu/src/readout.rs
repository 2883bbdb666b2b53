//! A forecaster's readout and its training loss in one pass: the linear head over the stack's
//! output and the direct linear map over the row's own inputs, at the scored rows of each
//! sequence, plus a learned cycle's steps, against the truth, as MSE and MAE.
//!
//! Written as tensor operations, the readout is a dozen passes over its `[rows, H]` output
//! forward and as many backward (the selection of the scored rows, two products, the sums, the
//! cycle's gather, the difference, its square and absolute value, their means), each a buffer
//! allocated, filled and read once more. Here the scored rows go in blocks that stay in a core's
//! cache: each block's `[hidden | inputs]` is gathered, multiplied by the head and the direct
//! map in one product, turned into the loss and its derivative in one pass, and, in training,
//! into its share of every gradient (two more products and the cycle's fold) before the next
//! block; the backward only scales those gradients by the incoming one. `mamba2-train`'s
//! `Forecaster::loss` runs it on the CPU backends and keeps the tensor version as the reference
//! both are tested against.

use rayon::prelude::*;

use crate::buffers::BUILD_CHUNK;
use crate::float::{multiversion, reduce, HostFloat, LANES};
use crate::layout::Picks;
use crate::matmul::{matmul_serial, Mat};

/// The sizes of a readout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadoutDims {
    /// Sequences.
    pub n_seq: usize,
    /// Rows per sequence.
    pub len: usize,
    /// Scored rows per sequence: the last and, going back `every` rows at a time, `n_pos - 1`
    /// more.
    pub n_pos: usize,
    /// See `n_pos`.
    pub every: usize,
    /// Width of the stack's output.
    pub d_model: usize,
    /// Inputs per row, read by the direct map (0 without one).
    pub n_feat: usize,
    /// Forecast steps, `H`.
    pub horizon: usize,
}

impl ReadoutDims {
    /// Scored rows in all: `n_seq * n_pos`.
    pub fn rows(&self) -> usize {
        self.n_seq * self.n_pos
    }

    /// The row of sequence-local position `j` (`0..n_pos`, oldest first).
    pub fn position(&self, j: usize) -> usize {
        self.picks().row(self.len, j)
    }

    /// The scored rows as the stack's [`Picks`].
    pub fn picks(&self) -> Picks {
        Picks { n: self.n_pos, every: self.every }
    }

    /// Values of the product's left side per scored row: the stack's output, then the inputs.
    fn width(&self) -> usize {
        self.d_model + self.n_feat
    }
}

/// The loss: `mse * mean(r^2) + mae * mean(|r|)` over every scored row and step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossWeights {
    /// Weight of the mean squared error.
    pub mse: f64,
    /// Weight of the mean absolute error.
    pub mae: f64,
}

/// A learned additive cycle per series: the forecast `k` steps after a row at phase `p` of
/// series `c` adds `q[c * period + (p + k) % period] - q[c * period + p]`.
#[derive(Debug, Clone, Copy)]
pub struct CycleRef<'a, T> {
    /// `[series * period]`.
    pub q: &'a [T],
    /// `series * period + phase` of each scored row, `[n_seq * n_pos]`.
    pub now: &'a [i64],
    /// Rows per cycle.
    pub period: usize,
}

/// What followed each scored row, as the loss reads it: step `s` after scored row `r` (position
/// `j` of sequence `i`) is `values[i * seq_stride + starts[j] + s] - level[r]`, in f64 and then
/// in the element type. Training windows give each sequence's values once (`starts` are then the
/// rows themselves, and positions share values), not `H` of them per scored row: 0.3 MB at the
/// default shape instead of 4 MB written and read again.
#[derive(Debug, Clone, Copy)]
pub struct TruthRef<'a> {
    /// Each sequence's values, `seq_stride` apart.
    pub values: &'a [f64],
    /// See `values`.
    pub seq_stride: usize,
    /// Where position `j`'s `H` values start in its sequence's, `[n_pos]`.
    pub starts: &'a [usize],
    /// The last value at each scored row, `[n_seq * n_pos]`.
    pub level: &'a [f64],
}

impl<'a> TruthRef<'a> {
    /// The `h` values that followed scored row `r` (`0..n_seq * n_pos`), and its last value.
    pub fn window(&self, r: usize, h: usize) -> (&'a [f64], f64) {
        let n_pos = self.starts.len();
        let at = (r / n_pos) * self.seq_stride + self.starts[r % n_pos];
        (&self.values[at..at + h], self.level[r])
    }
}

/// A readout's inputs, as row-major slices.
#[derive(Debug, Clone, Copy)]
pub struct ReadoutPlan<'a, T> {
    /// The sizes.
    pub dims: ReadoutDims,
    /// The stack's output at the scored rows, `[n_seq, n_pos, d_model]` (the stack computes
    /// it there alone: `mamba2-model`'s `Mamba2Stack::forward_picked`).
    pub hidden: &'a [T],
    /// The head, `[d_model, H]`.
    pub head_w: &'a [T],
    /// The rows' inputs `[n_seq, len, n_feat]` and the direct map `[n_feat, H]`, when there is
    /// one (`n_feat` is then their width, else 0).
    pub direct: Option<(&'a [T], &'a [T])>,
    /// What the head's and direct map's output is multiplied by, `[n_seq * n_pos, H]`.
    pub scale: Option<&'a [T]>,
    /// The learned cycle.
    pub cycle: Option<CycleRef<'a, T>>,
    /// What followed each scored row, and its last value.
    pub truth: TruthRef<'a>,
    /// The loss.
    pub loss: LossWeights,
}

/// What the forward keeps for the backward: the loss's gradients, which the backward scales.
#[derive(Debug)]
pub struct ReadoutSaved<T> {
    /// `[n_seq, n_pos, d_model]`, the stack's output's: moved out by the backward (which runs
    /// once per graph) rather than copied, 1.4 MB at the default shape.
    hidden: std::sync::Mutex<Vec<T>>,
    /// `[width, H]`, the head's then the direct map's.
    gw: Vec<T>,
    /// The cycle's (empty without one).
    q: Vec<T>,
}

/// The gradients of a readout's loss.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadoutGrads<T> {
    /// `[n_seq, n_pos, d_model]`, the stack's output's at the scored rows.
    pub hidden: Vec<T>,
    /// `[d_model, H]`.
    pub head_w: Vec<T>,
    /// `[n_feat, H]` (empty without a direct map).
    pub direct_w: Vec<T>,
    /// `[series * period]` (empty without a cycle).
    pub q: Vec<T>,
}

/// Scored rows per block of [`forward`] (a block's gather and forecasts stay in a core's cache).
const ROWS_PER_TASK: usize = 128;

/// Chains of blocks that [`forward`] sums separately (in parallel) and then adds in order.
const CHAINS: usize = 16;

fn check<T>(p: &ReadoutPlan<T>) {
    let d = p.dims;
    let (m, h) = (d.rows(), d.horizon);
    assert!(d.picks().fit(d.len), "readout: {d:?} has no such positions");
    assert_eq!(p.hidden.len(), m * d.d_model, "readout: hidden");
    assert_eq!(p.head_w.len(), d.d_model * h, "readout: head");
    match p.direct {
        Some((inputs, w)) => assert!(inputs.len() == d.n_seq * d.len * d.n_feat && w.len() == d.n_feat * h, "readout: direct map"),
        None => assert_eq!(d.n_feat, 0, "readout: inputs without a direct map"),
    }
    assert!(p.scale.is_none_or(|s| s.len() == m * h), "readout: scale");
    let t = p.truth;
    assert!(t.starts.len() == d.n_pos && t.level.len() == m, "readout: truth's positions and levels");
    // The last sequence's furthest position reads furthest.
    if let Some(last) = d.n_seq.checked_sub(1) {
        let end = last * t.seq_stride + t.starts.iter().max().expect("n_pos >= 1") + h;
        assert!(end <= t.values.len(), "readout: the truth holds {} values, not the {end} its positions read", t.values.len());
    }
    if let Some(c) = &p.cycle {
        assert!(c.period >= 1 && c.now.len() == m, "readout: cycle rows");
        assert!(c.now.iter().all(|&r| r >= 0 && (r as usize) < c.q.len()), "readout: a cycle row outside the table");
    }
}

multiversion! {
    /// One scored row's forecasts `f` become its errors: `f * scale + rot[s % period] - q_now -
    /// (truth - level)` at step `s` (the scale and the cycle where given; `rot` is empty without
    /// a cycle), in that order, as separate passes that each vectorise.
    fn errors_row<T>(f: &mut [T], scale: Option<&[T]>, rot: &[T], q_now: T, truth: &[f64], level: f64) {
        if let Some(scale) = scale {
            f.iter_mut().zip(scale).for_each(|(v, &s)| *v = *v * s);
        }
        if !rot.is_empty() {
            for piece in f.chunks_mut(rot.len()) {
                piece.iter_mut().zip(rot).for_each(|(v, &c)| *v = *v + c - q_now);
            }
        }
        f.iter_mut().zip(truth).for_each(|(v, &t)| *v = *v - T::from(t - level).expect("a float"));
    }
}

multiversion! {
    /// The sums of the squares and of the absolute values of one row of errors `e`, which it
    /// overwrites with the loss's derivative `two_mse * e + mae * sign(e)`.
    fn loss_row<T>(e: &mut [T], two_mse: T, mae: T) -> (T, T) {
        let (mut sq, mut ab) = ([T::zero(); LANES], [T::zero(); LANES]);
        let (chunks, rest) = e.as_chunks_mut::<LANES>();
        for chunk in chunks {
            for l in 0..LANES {
                let v = chunk[l];
                sq[l] = sq[l] + v * v;
                ab[l] = ab[l] + v.abs();
                chunk[l] = two_mse * v + mae * sign(v);
            }
        }
        let (mut sq, mut ab) = (reduce(sq), reduce(ab));
        for v in rest {
            sq = sq + *v * *v;
            ab = ab + v.abs();
            *v = two_mse * *v + mae * sign(*v);
        }
        (sq, ab)
    }
}

/// -1, 0 or 1 (`signum` gives 1 at zero, where the absolute value's derivative is taken as 0).
#[inline(always)]
fn sign<T: HostFloat>(v: T) -> T {
    if v > T::zero() {
        T::one()
    } else if v < T::zero() {
        -T::one()
    } else {
        T::zero()
    }
}

/// The phase after `phase` in a cycle of `period` rows.
#[inline]
fn next_phase(phase: usize, period: usize) -> usize {
    if phase + 1 == period {
        0
    } else {
        phase + 1
    }
}

/// The loss, and (with `keep`) what [`backward`] needs.
///
/// The scored rows are taken in blocks of 128: each block's `[hidden | inputs]`
/// is gathered, multiplied, turned into its loss and the loss's derivative, and (with `keep`)
/// into its share of every gradient, while the block is in the core's cache. The gradients are
/// those of the loss itself; [`backward`] multiplies them by the incoming gradient. Taken
/// whole-matrix at a time, the same work wrote and read the `[rows, width]` gather and the
/// `[rows, H]` forecasts and derivative to and from memory four more times.
pub fn forward<T: HostFloat>(p: &ReadoutPlan<T>, keep: bool) -> (f64, Option<ReadoutSaved<T>>) {
    check(p);
    let d = p.dims;
    let (m, h, k, dm) = (d.rows(), d.horizon, d.width(), d.d_model);
    let mut w = p.head_w.to_vec();
    if let Some((_, dw)) = p.direct {
        w.extend_from_slice(dw);
    }
    let count = (m * h) as f64;
    let (two_mse, mae) = (T::from(2.0 * p.loss.mse / count).expect("finite"), T::from(p.loss.mae / count).expect("finite"));
    // The stack's output's gradient, a row per scored row, each written by its block.
    let mut hidden = if keep { vec![T::zero(); m * dm] } else { Vec::new() };
    let hidden_at = hidden.as_mut_ptr() as usize;
    let q_len = p.cycle.map_or(0, |c| c.q.len());
    // Each series' cycle twice over, so that any rotation of it is one slice.
    let twice: Vec<T> =
        p.cycle.map_or(Vec::new(), |c| c.q.chunks(c.period).flat_map(|series| series.iter().chain(series)).copied().collect());
    let block = |mut acc: Block<T>, task: usize| {
        let (first, rows) = (task * ROWS_PER_TASK, ROWS_PER_TASK.min(m - task * ROWS_PER_TASK));
        let at = |r: usize| (r / d.n_pos) * d.len + d.position(r % d.n_pos);
        acc.x.clear();
        for r in first..first + rows {
            acc.x.extend_from_slice(&p.hidden[r * dm..(r + 1) * dm]);
            if let Some((inputs, _)) = p.direct {
                acc.x.extend_from_slice(&inputs[at(r) * d.n_feat..(at(r) + 1) * d.n_feat]);
            }
        }
        acc.y.resize(rows * h, T::zero());
        matmul_serial(&mut acc.y, rows, h, k, Mat::rows(&acc.x, k), Mat::rows(&w, h), false);
        for (i, row) in acc.y.chunks_mut(h).enumerate() {
            let r = first + i;
            let (truth, level) = p.truth.window(r, h);
            let scale = p.scale.map(|s| &s[r * h..(r + 1) * h]);
            // Step `s` adds the cycle's value `s + 1` phases after now: the series' period
            // rotated to start there, repeated along the row.
            let (rot, q_now) = p.cycle.map_or((&[][..], T::zero()), |c| {
                let now = c.now[r] as usize;
                let ahead = next_phase(now % c.period, c.period);
                (&twice[2 * (now / c.period) * c.period + ahead..][..c.period], c.q[now])
            });
            errors_row(row, scale, rot, q_now, truth, level);
            // The row becomes the loss's derivative with respect to each forecast.
            let (row_sq, row_ab) = loss_row(row, two_mse, mae);
            acc.sq += row_sq.to_f64().expect("a float");
            acc.ab += row_ab.to_f64().expect("a float");
            if !keep {
                continue;
            }
            if let Some(c) = p.cycle {
                fold_cycle(&mut acc.q, &mut acc.fold, row, c.now[r] as usize, c.period);
            }
            // Before the scale, the derivative with respect to the products.
            if let Some(scale) = scale {
                row.iter_mut().zip(scale).for_each(|(g, &s)| *g = *g * s);
            }
        }
        if keep {
            matmul_serial(&mut acc.gw, k, h, rows, Mat::transposed(&acc.x, k), Mat::rows(&acc.y, h), true);
            // SAFETY: the buffer holds `m * d_model` values and outlives the pool's tasks; rows
            // `first..first + rows` of it are this block's, written by no other task.
            let gx = unsafe { std::slice::from_raw_parts_mut((hidden_at as *mut T).add(first * dm), rows * dm) };
            matmul_serial(gx, rows, dm, h, Mat::rows(&acc.y, h), Mat::transposed(p.head_w, h), false);
        }
        acc
    };
    // A fixed number of chains of consecutive blocks, each summed in order, and the chains'
    // sums added in order: the loss and the gradients are the same to the last bit on any
    // number of threads and from run to run (a pool's own split of the work is not), so that a
    // seed gives one training run.
    let blocks = m.div_ceil(ROWS_PER_TASK);
    let per_chain = blocks.div_ceil(CHAINS).max(1);
    let total = (0..blocks.div_ceil(per_chain))
        .into_par_iter()
        .map(|chain| (chain * per_chain..blocks.min((chain + 1) * per_chain)).fold(Block::<T>::new(keep, k * h, q_len), block))
        .collect::<Vec<_>>()
        .into_iter()
        .fold(Block::<T>::new(false, 0, 0), Block::add);
    let loss = (p.loss.mse * total.sq + p.loss.mae * total.ab) / count;
    (loss, keep.then(|| ReadoutSaved { hidden: std::sync::Mutex::new(hidden), gw: total.gw, q: total.q }))
}

/// One chain of blocks' running results (the rayon `fold` state), and its scratch buffers.
struct Block<T> {
    sq: f64,
    ab: f64,
    /// `[width, H]`: the head's and the direct map's gradient, summed over the chain's blocks.
    gw: Vec<T>,
    /// The cycle's gradient.
    q: Vec<T>,
    x: Vec<T>,
    y: Vec<T>,
    fold: Vec<T>,
}

impl<T: HostFloat> Block<T> {
    fn new(keep: bool, gw: usize, q: usize) -> Self {
        let zeros = |n: usize| if keep { vec![T::zero(); n] } else { Vec::new() };
        Block { sq: 0.0, ab: 0.0, gw: zeros(gw), q: zeros(q), x: Vec::new(), y: Vec::new(), fold: Vec::new() }
    }

    fn add(mut self, other: Self) -> Self {
        self.sq += other.sq;
        self.ab += other.ab;
        for (mine, theirs) in [(&mut self.gw, other.gw), (&mut self.q, other.q)] {
            if mine.is_empty() {
                *mine = theirs;
            } else if !theirs.is_empty() {
                mine.iter_mut().zip(theirs).for_each(|(a, b)| *a = *a + b);
            }
        }
        self
    }
}

/// Adds one scored row's derivative `g` (before the scale) to the cycle's gradient `q`: the
/// forecast `s + 1` steps after phase `now` added `q[ahead]` and took away `q[now]`. Steps a
/// whole period apart land on the same phase, so the row is folded onto one period first
/// (vector additions) and scattered `period` times rather than `H` times.
fn fold_cycle<T: HostFloat>(q: &mut [T], fold: &mut Vec<T>, g: &[T], now: usize, period: usize) {
    let base = (now / period) * period;
    fold.clear();
    fold.resize(period, T::zero());
    for piece in g.chunks(period) {
        fold.iter_mut().zip(piece).for_each(|(f, &v)| *f = *f + v);
    }
    let mut ahead = next_phase(now % period, period);
    let mut total = T::zero();
    let series = &mut q[base..base + period];
    for &f in fold.iter() {
        series[ahead] = series[ahead] + f;
        ahead = next_phase(ahead, period);
        total = total + f;
    }
    q[now] = q[now] - total;
}

/// The gradients of `gloss` times the loss with respect to the stack's output, the head, the
/// direct map and the cycle: those [`forward`] kept, times `gloss`.
///
/// # Panics
/// When called twice with the same `saved`: the stack's output's gradient is moved out.
pub fn backward<T: HostFloat>(p: &ReadoutPlan<T>, saved: &ReadoutSaved<T>, gloss: T) -> ReadoutGrads<T> {
    check(p);
    let d = p.dims;
    let dm_h = d.d_model * d.horizon;
    let mut hidden = std::mem::take(&mut *saved.hidden.lock().unwrap_or_else(|e| e.into_inner()));
    assert_eq!(hidden.len(), d.rows() * d.d_model, "readout: the backward ran twice on the same forward");
    if gloss != T::one() {
        hidden.par_chunks_mut(BUILD_CHUNK).for_each(|c| c.iter_mut().for_each(|g| *g = *g * gloss));
    }
    let times = |v: &[T]| v.iter().map(|&g| g * gloss).collect::<Vec<T>>();
    ReadoutGrads { hidden, head_w: times(&saved.gw[..dm_h]), direct_w: times(&saved.gw[dm_h..]), q: times(&saved.q) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loss and every gradient equal a direct computation, in f64: the forecasts one by one,
    /// the loss summed, and each gradient by central differences of that sum.
    #[test]
    fn loss_and_gradients_equal_a_direct_computation() {
        let d = ReadoutDims { n_seq: 3, len: 7, n_pos: 3, every: 2, d_model: 4, n_feat: 5, horizon: 6 };
        let wave = |n: usize, f: f64| (0..n).map(|i| ((i as f64 + 1.0) * f).sin()).collect::<Vec<f64>>();
        let (hidden, inputs) = (wave(d.rows() * d.d_model, 0.37), wave(d.n_seq * d.len * d.n_feat, 0.71));
        let (head_w, direct_w) = (wave(d.d_model * d.horizon, 0.53), wave(d.n_feat * d.horizon, 0.29));
        let m = d.rows();
        let scale: Vec<f64> = wave(m * d.horizon, 0.11).iter().map(|v| 1.5 + v).collect();
        // Each scored row's own `H` values (as evaluation batches hold them), and levels.
        let (truth, level) = (wave(m * d.horizon, 0.43), wave(m, 0.61));
        let starts: Vec<usize> = (0..d.n_pos).map(|j| j * d.horizon).collect();
        let truth_ref = TruthRef { values: &truth, seq_stride: d.n_pos * d.horizon, starts: &starts, level: &level };
        let (period, q) = (5, wave(2 * 5, 0.9));
        let now: Vec<i64> = (0..m).map(|r| ((r % 2) * period + (r * 3) % period) as i64).collect();
        let loss = LossWeights { mse: 0.7, mae: 1.3 };
        // With and without the scale (without it, `gloss` multiplies the results instead).
        for scaled in [true, false] {
            let scale: Vec<f64> = if scaled { scale.clone() } else { vec![1.0; m * d.horizon] };
            let direct_loss = |hidden: &[f64], head_w: &[f64], direct_w: &[f64], q: &[f64]| {
                let mut total = 0.0;
                for r in 0..m {
                    let at = (r / d.n_pos) * d.len + d.position(r % d.n_pos);
                    for s in 0..d.horizon {
                        let mut f = (0..d.d_model).map(|i| hidden[r * d.d_model + i] * head_w[i * d.horizon + s]).sum::<f64>();
                        f += (0..d.n_feat).map(|i| inputs[at * d.n_feat + i] * direct_w[i * d.horizon + s]).sum::<f64>();
                        let (base, phase) = ((now[r] as usize / period) * period, now[r] as usize % period);
                        let e = f * scale[r * d.horizon + s] + q[base + (phase + s + 1) % period]
                            - q[now[r] as usize]
                            - (truth[r * d.horizon + s] - level[r]);
                        total += loss.mse * e * e + loss.mae * e.abs();
                    }
                }
                total / (m * d.horizon) as f64
            };
            let plan = ReadoutPlan {
                dims: d,
                hidden: &hidden,
                head_w: &head_w,
                direct: Some((&inputs, &direct_w)),
                scale: scaled.then_some(&scale[..]),
                cycle: Some(CycleRef { q: &q, now: &now, period }),
                truth: truth_ref,
                loss,
            };
            let (value, saved) = forward(&plan, true);
            let want = direct_loss(&hidden, &head_w, &direct_w, &q);
            assert!((value - want).abs() <= 1e-14 * want, "loss {value} vs {want}");
            let g = backward(&plan, &saved.unwrap(), 2.0);
            let eps = 1e-6;
            let numeric = |which: usize, i: usize| {
                let mut args = [hidden.clone(), head_w.clone(), direct_w.clone(), q.clone()];
                args[which][i] += eps;
                let up = direct_loss(&args[0], &args[1], &args[2], &args[3]);
                args[which][i] -= 2.0 * eps;
                let down = direct_loss(&args[0], &args[1], &args[2], &args[3]);
                2.0 * (up - down) / (2.0 * eps)
            };
            for (which, got) in [&g.hidden, &g.head_w, &g.direct_w, &g.q].into_iter().enumerate() {
                for (i, &v) in got.iter().enumerate() {
                    let n = numeric(which, i);
                    assert!((v - n).abs() <= 1e-7 * (1.0 + n.abs()), "input {which}, element {i}: {v} vs {n}");
                }
            }
        }
    }

    /// The loss and every gradient are the same to the last bit on one thread and on three (f32,
    /// 20 blocks of rows): a seed gives one training run whatever the machine's cores.
    #[test]
    fn the_sums_do_not_depend_on_the_threads() {
        let d = ReadoutDims { n_seq: 40, len: 64, n_pos: 64, every: 1, d_model: 8, n_feat: 5, horizon: 12 };
        let wave = |n: usize, f: f32| (0..n).map(|i| ((i as f32 + 1.0) * f).sin()).collect::<Vec<f32>>();
        let (hidden, inputs) = (wave(d.rows() * d.d_model, 0.37), wave(d.n_seq * d.len * d.n_feat, 0.71));
        let (head_w, direct_w) = (wave(d.d_model * d.horizon, 0.53), wave(d.n_feat * d.horizon, 0.29));
        let values: Vec<f64> = (0..d.n_seq * (d.len + d.horizon - 1)).map(|i| (i as f64 * 0.43).sin()).collect();
        let level: Vec<f64> = (0..d.rows()).map(|r| (r as f64 * 0.61).cos()).collect();
        let starts: Vec<usize> = (0..d.n_pos).map(|j| d.position(j)).collect();
        let now: Vec<i64> = (0..d.rows()).map(|r| (r % 24) as i64).collect();
        let q = wave(24, 0.9);
        let plan = ReadoutPlan {
            dims: d,
            hidden: &hidden,
            head_w: &head_w,
            direct: Some((&inputs, &direct_w)),
            scale: None,
            cycle: Some(CycleRef { q: &q, now: &now, period: 24 }),
            truth: TruthRef { values: &values, seq_stride: d.len + d.horizon - 1, starts: &starts, level: &level },
            loss: LossWeights { mse: 1.0, mae: 0.5 },
        };
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
            pool.install(|| {
                let (loss, saved) = forward(&plan, true);
                (loss, backward(&plan, &saved.expect("kept"), 1.0))
            })
        };
        let (one, three) = (on(1), on(3));
        assert_eq!(one.0.to_bits(), three.0.to_bits(), "loss {} vs {}", one.0, three.0);
        assert_eq!(one.1, three.1, "the gradients differ");
    }

    /// Without a direct map, scale or cycle the readout is the head alone.
    #[test]
    fn the_head_alone() {
        let d = ReadoutDims { n_seq: 2, len: 3, n_pos: 1, every: 1, d_model: 2, n_feat: 0, horizon: 2 };
        // The stack's output at each sequence's scored row (its last).
        let hidden = [3.0, -1.0, 2.0, 1.0];
        let head_w = [1.0, 0.0, 0.0, 1.0];
        // Each sequence's values after its first row, shared by the positions (here one per
        // sequence, at row 2, reading values 2 and 3), and the levels taken from them.
        let values = [0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 5.0, 6.0];
        let truth = TruthRef { values: &values, seq_stride: 4, starts: &[2], level: &[1.0, 3.0] };
        let plan = ReadoutPlan {
            dims: d,
            hidden: &hidden,
            head_w: &head_w,
            direct: None,
            scale: None,
            cycle: None,
            truth,
            loss: LossWeights { mse: 1.0, mae: 0.0 },
        };
        // Forecasts [3, -1] (exact) and [2, 1] (2 short of 3 at the second step): 4 over 4 values.
        let (value, saved) = forward(&plan, true);
        assert_eq!(value, 1.0);
        let g = backward(&plan, &saved.unwrap(), 1.0);
        assert_eq!(g.hidden, [0.0, 0.0, 0.0, -1.0]);
        assert!(g.direct_w.is_empty() && g.q.is_empty());
        // The stack's output's gradient was moved out: a second backward is refused, not wrong.
        let again = std::panic::catch_unwind(|| backward(&plan, &saved_again(&plan), 1.0));
        assert!(again.is_err());
        fn saved_again(plan: &ReadoutPlan<f64>) -> ReadoutSaved<f64> {
            let (_, saved) = forward(plan, true);
            let saved = saved.unwrap();
            let _ = backward(plan, &saved, 1.0);
            saved
        }
    }
}
