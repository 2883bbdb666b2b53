//! Buffers the parallel passes fill: cache-line-aligned state rows ([`Lines`]), a buffer written
//! in disjoint pieces by several tasks ([`Pieces`]), and buffers built by the rayon pool block by
//! block ([`build_rows`]) so that no thread zero-fills a large buffer alone.

use rayon::prelude::*;

use crate::float::HostFloat;

/// Rows per parallel task in the row-wise passes (convolution, norm).
pub(crate) const ROWS_PER_TASK: usize = 64;

/// A zeroed buffer whose first value starts a cache line. The scans load and store the state
/// as 64-byte vectors at every step: in a buffer that starts mid-line each of those touches two
/// lines and a store can no longer hand its value straight to the next step's load, which made
/// the forward scan about 1.4x slower (the allocator only promises 16 bytes).
#[derive(Debug)]
pub(crate) struct Lines<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: HostFloat> Lines<T> {
    /// `len` zeros.
    pub(crate) fn zeros(len: usize) -> Self {
        let extra = 64 / std::mem::size_of::<T>();
        let buf = vec![T::zero(); len + extra];
        // `align_offset` may decline (usize::MAX); the buffer is then merely unaligned.
        let start = buf.as_ptr().align_offset(64).min(extra);
        Self { buf, start, len }
    }
}

impl<T> std::ops::Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> std::ops::DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// A vector of `len` values built by the rayon pool, `chunk` values per task: [`build_rows`]
/// with one buffer of one value per row, so each task zeroes its chunk (in cache, just before
/// use) and hands it to `fill` with the chunk's offset. A single thread's `memset` of the large
/// buffers of a step would leave the other cores idle for as long as it takes.
pub(crate) fn build<T: HostFloat>(len: usize, chunk: usize, fill: impl Fn(usize, &mut [T]) + Sync + Send) -> Vec<T> {
    let ([v], _) = build_rows(len, chunk, [1], |at, [c]| fill(at, c));
    v
}

/// A buffer that parallel tasks fill in disjoint pieces (a scan task its head's columns of
/// every row, a row task its block of rows in [`build_rows`]), so that no task writes a buffer
/// of its own to be gathered after.
pub(crate) struct Pieces<'a, T> {
    at: *mut T,
    len: usize,
    _buf: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: `put`'s callers write disjoint ranges; the buffer outlives the borrow.
unsafe impl<T: Send> Sync for Pieces<'_, T> {}

impl<'a, T: Copy> Pieces<'a, T> {
    /// Over values already initialised.
    pub(crate) fn new(buf: &'a mut [T]) -> Self {
        Self { at: buf.as_mut_ptr(), len: buf.len(), _buf: std::marker::PhantomData }
    }

    /// Over a vector's spare capacity, which the pieces are to initialise.
    pub(crate) fn uninit(buf: &'a mut [std::mem::MaybeUninit<T>]) -> Self {
        Self { at: buf.as_mut_ptr().cast(), len: buf.len(), _buf: std::marker::PhantomData }
    }

    /// Writes `v` at `at..at + v.len()`.
    ///
    /// # Safety
    /// No other task reads or writes that range while the pieces live.
    pub(crate) unsafe fn put(&self, at: usize, v: &[T]) {
        assert!(at + v.len() <= self.len, "piece {at}+{} outside a buffer of {}", v.len(), self.len);
        // SAFETY: inside the buffer (checked), and the caller owns the range.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.at.add(at), v.len()) }
    }
}

impl<T: HostFloat> Pieces<'_, T> {
    /// Zeroes `len` values from `at` and hands them to the calling task to fill.
    ///
    /// # Safety
    /// As [`Pieces::put`]: no other task reads or writes that range while the block lives.
    // The block is part of the buffer the pieces borrow mutably, handed to one task each.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn zeroed(&self, at: usize, len: usize) -> &mut [T] {
        assert!(at + len <= self.len, "block {at}+{len} outside a buffer of {}", self.len);
        // SAFETY: inside the buffer (checked), and the caller owns the range; `T` is `f32` or
        // `f64`, for which zero bytes are a valid value.
        unsafe {
            let p = self.at.add(at);
            std::ptr::write_bytes(p, 0, len);
            std::slice::from_raw_parts_mut(p, len)
        }
    }
}

/// `N` buffers of `rows` rows each (`widths[k]` values per row of buffer `k`) built by the rayon
/// pool in blocks of `per_task` rows: each task zeroes its block of every buffer and hands the
/// blocks, with the block's first row, to `fill`, which writes them while the zeroed lines are
/// still in cache. (Zeroed by [`zeros`] in a pass of its own, the buffers went to memory and
/// came back: each byte written twice to memory, 5 % of a medium train step.) Returns the
/// buffers and what `fill` returned per block, in row order.
pub(crate) fn build_rows<T: HostFloat, R: Send, const N: usize>(
    rows: usize,
    per_task: usize,
    widths: [usize; N],
    fill: impl Fn(usize, [&mut [T]; N]) -> R + Sync + Send,
) -> ([Vec<T>; N], Vec<R>) {
    let per_task = per_task.max(1);
    let mut bufs: [Vec<T>; N] = std::array::from_fn(|k| Vec::with_capacity(rows * widths[k]));
    let parts = {
        let pieces = bufs.each_mut().map(|b| Pieces::uninit(b.spare_capacity_mut()));
        (0..rows.div_ceil(per_task))
            .into_par_iter()
            .map(|task| {
                let (first, count) = (task * per_task, per_task.min(rows - task * per_task));
                // SAFETY: rows `first..first + count` of each buffer are this task's alone.
                let blocks: [&mut [T]; N] = std::array::from_fn(|k| unsafe { pieces[k].zeroed(first * widths[k], count * widths[k]) });
                fill(first, blocks)
            })
            .collect()
    };
    for (buf, &width) in bufs.iter_mut().zip(&widths) {
        // SAFETY: the blocks cover every row, and each task initialised its own (a panic in a
        // task propagates before this line).
        unsafe { buf.set_len(rows * width) };
    }
    (bufs, parts)
}

/// Values per task in [`build`]'s plain uses: large enough to amortise a task, small enough to
/// stay in the second-level cache.
pub(crate) const BUILD_CHUNK: usize = 1 << 14;

/// A vector of `len` zeros, written by the rayon pool (see [`build`]).
pub(crate) fn zeros<T: HostFloat>(len: usize) -> Vec<T> {
    build(len, BUILD_CHUNK, |_, _| {})
}

/// A copy of `src`, written by the rayon pool (see [`build`]).
pub(crate) fn filled<T: HostFloat>(src: &[T]) -> Vec<T> {
    build(src.len(), BUILD_CHUNK, |at, c| c.copy_from_slice(&src[at..at + c.len()]))
}

pub(crate) fn sum_partials<T: HostFloat>(parts: Vec<Vec<T>>, len: usize) -> Vec<T> {
    let mut total = vec![T::zero(); len];
    for part in parts {
        for (o, v) in total.iter_mut().zip(part) {
            *o = *o + v;
        }
    }
    total
}
