//! The little-endian encoding of a stream's state (`bank.rs` frames it in a file): integers as
//! `u64`, floats as the bits of their `f64`, so that every value comes back bit for bit.

/// FNV-1a over `bytes`, continuing from `h` (start from [`FNV_START`]): the checkpoints' hash.
pub(crate) use mamba2_model::{fnv1a64_continue as fnv1a64, FNV1A64_START as FNV_START};

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_f64(out: &mut Vec<u8>, v: f64) {
    put_u64(out, v.to_bits());
}

/// A length, then the values.
pub(crate) fn put_f64s(out: &mut Vec<u8>, values: impl ExactSizeIterator<Item = f64>) {
    put_u64(out, values.len() as u64);
    for v in values {
        put_f64(out, v);
    }
}

/// Reads what the `put_` functions wrote; every read names what was cut short.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| format!("cut short in {what}"))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    pub(crate) fn f64(&mut self, what: &str) -> Result<f64, String> {
        Ok(f64::from_bits(self.u64(what)?))
    }

    /// A length of at most `max`.
    pub(crate) fn len(&mut self, max: usize, what: &str) -> Result<usize, String> {
        let n = self.u64(what)?;
        usize::try_from(n).ok().filter(|&n| n <= max).ok_or_else(|| format!("{what} holds {n} values, at most {max} fit this model"))
    }

    /// A length of exactly `want`, then the values.
    pub(crate) fn f64s_exact(&mut self, want: usize, what: &str) -> Result<Vec<f64>, String> {
        let n = self.u64(what)?;
        if n != want as u64 {
            return Err(format!("{what} holds {n} values, this model has {want}"));
        }
        (0..want).map(|_| self.f64(what)).collect()
    }

    /// A length of at most `max`, then the values.
    pub(crate) fn f64s_up_to(&mut self, max: usize, what: &str) -> Result<Vec<f64>, String> {
        let n = self.len(max, what)?;
        (0..n).map(|_| self.f64(what)).collect()
    }
}
