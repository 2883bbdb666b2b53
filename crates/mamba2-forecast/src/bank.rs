//! Many series through one model: a [`StreamBank`] keeps one [`ForecastStream`] state per series
//! id, all sharing the model's weights, and saves every state to a file that a restarted
//! process restores to continue exactly where the saved one stopped.
//!
//! The file: the 8 bytes `MAMBA2ST`, a little-endian `u64` header length, a JSON header
//! `{"format": 1, "fingerprint": "<hex>", "host_type": "f64", "series": n, "payload_len": n,
//! "payload_fnv1a64": h}`, then the payload: for each id in sorted order its length, its UTF-8
//! bytes, the length of its state and the state ([`ForecastStream::save_state`]). The checksum
//! turns a damaged file into an error before any state is read, and the fingerprint (a hash of
//! the model's spec, weights, intervals and host type) one saved by another model.
//!
//! Two series through the crate's fixture model, saved and continued in a new bank:
//!
//! ```
//! use burn::backend::NdArray;
//! use mamba2_forecast::{open_forecaster, ForecastStream, StreamBank};
//!
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
//! let opened = open_forecaster::<NdArray<f64>>(format!("{dir}/tiny.ckpt").as_ref(), &Default::default()).unwrap();
//! let mut bank = StreamBank::new(&ForecastStream::<f64>::new(&opened.model));
//! // Scaled rows (`load`, `temp`) and the calendar's clock of each, as `ForecastStream::push` takes them.
//! for hour in 0..48 {
//!     bank.push("north", &[0.1 * hour as f64, 0.2], 1_000 + hour).unwrap();
//!     bank.push("south", &[-0.3, 0.05 * hour as f64], 1_000 + hour).unwrap();
//! }
//! let path = std::env::temp_dir().join(format!("bank-doc-{}.state", std::process::id()));
//! bank.save(&path).unwrap();
//! let mut restarted = StreamBank::new(&ForecastStream::<f64>::new(&opened.model));
//! assert_eq!(restarted.restore(&path).unwrap(), 2);
//! assert_eq!(restarted.push("north", &[4.8, 0.2], 1_048).unwrap(), bank.push("north", &[4.8, 0.2], 1_048).unwrap());
//! // A row at or before a series' last clock is already in its state.
//! assert_eq!(restarted.push_new("south", &[-0.3, 2.35], 1_047).unwrap(), None);
//! std::fs::remove_file(&path).unwrap();
//! ```

use std::collections::HashMap;
use std::path::Path;

use mamba2_model::{HostFloat, ModelError};

use crate::codec::{fnv1a64, put_u64, Reader, FNV_START};
use crate::{ForecastError, ForecastStream};

const MAGIC: &[u8; 8] = b"MAMBA2ST";
const FORMAT: u64 = 1;
/// Longest id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 4096;

/// One [`ForecastStream`] state per series id over one shared model; see the module
/// documentation. A new id starts a fresh history. No state starts a helper thread, so a bank
/// of thousands of series runs on the calling thread alone.
#[derive(Debug, Clone)]
pub struct StreamBank<T: HostFloat> {
    template: ForecastStream<T>,
    streams: HashMap<String, ForecastStream<T>>,
}

fn host_type<T>() -> &'static str {
    if std::mem::size_of::<T>() == 4 {
        "f32"
    } else {
        "f64"
    }
}

impl<T: HostFloat> StreamBank<T> {
    /// An empty bank whose series follow `stream`'s model and intervals (its own rows, if any,
    /// are not kept).
    pub fn new(stream: &ForecastStream<T>) -> Self {
        Self { template: stream.fresh(false), streams: HashMap::new() }
    }

    /// Adds one row of series `id` (as [`ForecastStream::push`]) and returns its forecast.
    ///
    /// # Errors
    /// [`ModelError::State`] when `row` does not hold every input column or `id` is longer than
    /// [`MAX_ID_BYTES`].
    pub fn push(&mut self, id: &str, row: &[f64], clock: i64) -> Result<Vec<f64>, ModelError> {
        self.series(id)?.push(row, clock)
    }

    /// [`push`](Self::push), but `None`, with nothing changed, when `clock` is not after the
    /// clock of the id's last row: that row is taken to be in its state already (a feed
    /// replayed from before a saved state).
    ///
    /// # Errors
    /// As [`push`](Self::push).
    pub fn push_new(&mut self, id: &str, row: &[f64], clock: i64) -> Result<Option<Vec<f64>>, ModelError> {
        let stream = self.series(id)?;
        if stream.last_clock().is_some_and(|last| clock <= last) {
            return Ok(None);
        }
        stream.push(row, clock).map(Some)
    }

    /// Announces a row ahead of series `id` (as [`ForecastStream::announce`]), starting its
    /// stream if it is new.
    ///
    /// # Errors
    /// As [`ForecastStream::announce`], and for an id [`push`](Self::push) refuses.
    pub fn announce(&mut self, id: &str, row: &[f64], clock: i64) -> Result<bool, ModelError> {
        self.series(id)?.announce(row, clock)
    }

    /// The stream of `id`, started fresh if it is new.
    fn series(&mut self, id: &str) -> Result<&mut ForecastStream<T>, ModelError> {
        if !self.streams.contains_key(id) {
            if id.len() > MAX_ID_BYTES {
                return Err(ModelError::State { why: format!("an id of {} bytes, at most {MAX_ID_BYTES}", id.len()) });
            }
            let stream = self.new_stream(id)?;
            self.streams.insert(id.to_string(), stream);
        }
        Ok(self.streams.get_mut(id).expect("inserted"))
    }

    /// A fresh stream for `id`: of the model, or of the id's own series in a model trained on a
    /// panel, which knows no other ids.
    fn new_stream(&self, id: &str) -> Result<ForecastStream<T>, ModelError> {
        if !self.template.is_panel() {
            return Ok(self.template.fresh(false));
        }
        let t = self.template.series_index(id).ok_or_else(|| ModelError::State {
            why: format!(
                "id `{id}` is not one of the {} series the model was trained on (a model trained on a panel forecasts its own ids)",
                self.template.n_series()
            ),
        })?;
        self.template.of_series(t)
    }

    /// The stream of `id`, if it has had a row.
    pub fn stream(&self, id: &str) -> Option<&ForecastStream<T>> {
        self.streams.get(id)
    }

    /// The quantiles of `id`'s forecast `point` (see [`ForecastStream::quantiles`]).
    pub fn quantiles(&self, id: &str, point: &[f64]) -> Option<Vec<f64>> {
        self.streams.get(id).and_then(|s| s.quantiles(point))
    }

    /// The ids with a state, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.streams.keys().map(String::as_str)
    }

    /// The number of series.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// Whether no series has had a row.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// Bytes of the series' states on the heap (the shared weights and the map's own overhead
    /// not counted).
    pub fn state_bytes(&self) -> usize {
        self.streams.iter().map(|(id, s)| id.capacity() + s.state_bytes()).sum()
    }

    /// The bank as the bytes of a state file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut ids: Vec<&String> = self.streams.keys().collect();
        ids.sort();
        let mut payload = Vec::new();
        let mut state = Vec::new();
        for id in ids {
            put_u64(&mut payload, id.len() as u64);
            payload.extend_from_slice(id.as_bytes());
            state.clear();
            self.streams[id].save_state(&mut state);
            put_u64(&mut payload, state.len() as u64);
            payload.extend_from_slice(&state);
        }
        let header = serde_json::json!({
            "format": FORMAT,
            "fingerprint": format!("{:016x}", self.template.fingerprint()),
            "host_type": host_type::<T>(),
            "series": self.streams.len(),
            "payload_len": payload.len(),
            "payload_fnv1a64": fnv1a64(FNV_START, &payload),
        });
        let header = serde_json::to_vec(&header).expect("a header serialises");
        let mut bytes = Vec::with_capacity(16 + header.len() + payload.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&payload);
        bytes
    }

    /// Writes every state to `path` through a temporary file beside it and a rename, so that a
    /// crash while saving leaves the previous file whole.
    ///
    /// # Errors
    /// [`ForecastError::Model`] when the file cannot be written.
    pub fn save(&self, path: &Path) -> Result<(), ForecastError> {
        Ok(mamba2_model::write_atomically(path, &self.to_bytes())?)
    }

    /// Replaces every state with those of a state file's `bytes` (named `path` in errors);
    /// returns the number of series. On an error the bank is unchanged.
    ///
    /// # Errors
    /// [`ForecastError::State`] when the bytes are not a state file, are damaged, or were saved
    /// by another model or host type.
    pub fn restore_bytes(&mut self, bytes: &[u8], path: &str) -> Result<usize, ForecastError> {
        let bad = |why: String| ForecastError::State { path: path.to_string(), why };
        let mut r = Reader::new(bytes);
        let magic = r.take(8, "the file's first bytes").map_err(|_| bad("too short to be a state file".into()))?;
        if magic != MAGIC {
            return Err(bad("not a state file of `mamba2 stream` (it does not start with MAMBA2ST)".into()));
        }
        let header_len = r.len(1 << 20, "the header").map_err(bad)?;
        let header: serde_json::Value = serde_json::from_slice(r.take(header_len, "the header").map_err(bad)?)
            .map_err(|e| bad(format!("its header is not JSON: {e}")))?;
        let field = |name: &str| header.get(name).ok_or_else(|| bad(format!("its header has no `{name}`")));
        if field("format")?.as_u64() != Some(FORMAT) {
            return Err(bad(format!("format {} is not {FORMAT}", field("format")?)));
        }
        let ours = format!("{:016x}", self.template.fingerprint());
        let theirs = field("fingerprint")?.as_str().unwrap_or_default().to_string();
        let (their_type, our_type) = (field("host_type")?.as_str().unwrap_or_default().to_string(), host_type::<T>());
        if their_type != our_type {
            return Err(bad(format!("saved by a stream in {their_type}, this one runs in {our_type} (pass the same --dtype)")));
        }
        if theirs != ours {
            return Err(bad(format!(
                "saved by another model (fingerprint {theirs}, this checkpoint's {ours}): a state continues only the checkpoint that wrote it"
            )));
        }
        let payload = &bytes[16 + header_len..];
        if field("payload_len")?.as_u64() != Some(payload.len() as u64) {
            return Err(bad(format!(
                "{} bytes of states where the header says {} (a cut-off copy?)",
                payload.len(),
                field("payload_len")?
            )));
        }
        if field("payload_fnv1a64")?.as_u64() != Some(fnv1a64(FNV_START, payload)) {
            return Err(bad("its checksum does not match: the file is damaged".into()));
        }
        let n = field("series")?.as_u64().ok_or_else(|| bad("`series` is not a count".into()))?;
        let mut r = Reader::new(payload);
        let mut streams = HashMap::new();
        for _ in 0..n {
            let len = r.len(MAX_ID_BYTES, "an id").map_err(bad)?;
            let id = std::str::from_utf8(r.take(len, "an id").map_err(bad)?).map_err(|_| bad("an id is not UTF-8".into()))?.to_string();
            let len = r.len(payload.len(), "a state").map_err(bad)?;
            let mut stream = self.new_stream(&id).map_err(|e| bad(e.to_string()))?;
            stream.restore_state(r.take(len, "a state").map_err(bad)?).map_err(|why| bad(format!("id `{id}`: {why}")))?;
            if streams.insert(id.clone(), stream).is_some() {
                return Err(bad(format!("id `{id}` appears twice")));
            }
        }
        if !r.at_end() {
            return Err(bad("bytes left after the last state".into()));
        }
        self.streams = streams;
        Ok(self.streams.len())
    }

    /// [`restore_bytes`](Self::restore_bytes) of the file at `path`.
    ///
    /// # Errors
    /// As there, and when the file cannot be read.
    pub fn restore(&mut self, path: &Path) -> Result<usize, ForecastError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ForecastError::State { path: name.clone(), why: e.to_string() })?;
        self.restore_bytes(&bytes, &name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{ColumnChoice, Scaler, Table};
    use crate::{open_forecaster, Forecaster};
    use burn::backend::NdArray;

    type B = NdArray<f64>;

    struct Fixture {
        model: Forecaster<B>,
        stream: ForecastStream<f64>,
        rows: Vec<Vec<f64>>,
        clocks: Vec<i64>,
    }

    /// The crate's trained fixture with its intervals, and its rows scaled as in training.
    fn fixture() -> Fixture {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let opened = open_forecaster::<B>(format!("{dir}/tiny.ckpt").as_ref(), &Default::default()).unwrap();
        let spec = opened.model.spec().clone();
        let choice = ColumnChoice { date_column: None, columns: Some(spec.features.clone()), open_end: Vec::new() };
        let table = Table::from_path(format!("{dir}/tiny.csv").as_ref(), &choice).unwrap();
        let scaler: &Scaler = &opened.scaler;
        let rows = table.rows.iter().map(|r| scaler.transform_row(r, &spec.features, "a row").unwrap()).collect();
        let cal = spec.calendar.as_ref().unwrap();
        let clocks = table.times.as_ref().unwrap().iter().map(|&t| cal.clock(t)).collect();
        let calibration = opened.calibration.expect("the fixture has intervals");
        let stream = ForecastStream::<f64>::new(&opened.model).with_intervals(calibration.model).unwrap();
        Fixture { model: opened.model, stream, rows, clocks }
    }

    /// Series `id`'s row `r`: the fixture's rows from an offset of its own, shifted by the id, on
    /// an hourly clock that runs on where the rows wrap around.
    fn row_of(f: &Fixture, id: usize, r: usize) -> (Vec<f64>, i64) {
        let i = (id * 7 + r) % f.rows.len();
        (f.rows[i].iter().map(|v| v + 0.01 * id as f64).collect(), f.clocks[0] + (id * 7 + r) as i64)
    }

    /// Every (id, row) of `ids` series with `per_id` rows each, interleaved in a scrambled order
    /// that keeps each id's rows in order.
    fn interleaved(ids: usize, per_id: usize) -> Vec<(usize, usize)> {
        let mut next = vec![0; ids];
        let mut order = Vec::with_capacity(ids * per_id);
        let mut x: u64 = 12345;
        while order.len() < ids * per_id {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let id = (x >> 33) as usize % ids;
            if next[id] < per_id {
                order.push((id, next[id]));
                next[id] += 1;
            }
        }
        order
    }

    #[test]
    fn a_thousand_interleaved_series_each_forecast_as_if_streamed_alone() {
        let f = fixture();
        let (ids, per_id) = (1000, 30);
        let mut bank = StreamBank::new(&f.stream);
        let mut got = vec![Vec::new(); ids];
        for (id, r) in interleaved(ids, per_id) {
            let (row, clock) = row_of(&f, id, r);
            let name = format!("series-{id}");
            let point = bank.push_new(&name, &row, clock).unwrap().expect("a new row");
            let q = bank.quantiles(&name, &point).unwrap();
            got[id].push((point, q));
        }
        assert_eq!(bank.len(), ids);
        for (id, got) in got.iter().enumerate() {
            let mut alone = f.stream.fresh(true);
            for (r, (point, q)) in got.iter().enumerate() {
                let (row, clock) = row_of(&f, id, r);
                let p = alone.push(&row, clock).unwrap();
                // Bit for bit: the same state and arithmetic, whatever ran in between.
                assert_eq!(&p, point, "id {id} row {r}");
                assert_eq!(&alone.quantiles(&p).unwrap(), q, "id {id} row {r}");
            }
        }
        // The rows of an id at or before its last clock are already in its state.
        let before = bank.to_bytes();
        let (row, clock) = row_of(&f, 3, per_id - 1);
        assert_eq!(bank.push_new("series-3", &row, clock).unwrap(), None);
        assert_eq!(bank.to_bytes(), before);
        let per_series = bank.state_bytes() / ids;
        assert!((1_000..100_000).contains(&per_series), "{per_series} bytes per series");
    }

    #[test]
    fn a_restored_bank_continues_bit_for_bit_and_bad_files_change_nothing() {
        let f = fixture();
        let order = interleaved(40, 50);
        let (first, rest) = order.split_at(900);
        let push_all = |bank: &mut StreamBank<f64>, part: &[(usize, usize)]| -> Vec<Vec<f64>> {
            part.iter()
                .map(|&(id, r)| {
                    let (row, clock) = row_of(&f, id, r);
                    let name = format!("{id}");
                    let mut p = bank.push(&name, &row, clock).unwrap();
                    p.extend(bank.quantiles(&name, &p).unwrap());
                    p
                })
                .collect()
        };
        let mut whole = StreamBank::new(&f.stream);
        push_all(&mut whole, first);
        let dir = std::env::temp_dir().join(format!("mamba2-bank-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.bin");
        whole.save(&path).unwrap();
        let expected = push_all(&mut whole, rest);

        let mut restored = StreamBank::new(&f.stream);
        assert_eq!(restored.restore(&path).unwrap(), 40);
        let good = restored.to_bytes();
        assert_eq!(good, std::fs::read(&path).unwrap(), "a restored bank saves the same bytes");
        let bits = |v: &[Vec<f64>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&push_all(&mut restored.clone(), rest)), bits(&expected));

        // Damaged, cut short, foreign: one sentence each, and the bank keeps its states.
        let mut flipped = good.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 1;
        let foreign_model = crate::ForecasterConfig { spec: f.model.spec().clone(), backbone: crate::default_backbone() }
            .init::<B>(&Default::default())
            .unwrap();
        let foreign = StreamBank::new(&ForecastStream::<f64>::new(&foreign_model)).to_bytes();
        let f32_file = StreamBank::new(&ForecastStream::<f32>::new(&f.model)).to_bytes();
        for (bytes, says) in [
            (flipped, "checksum does not match"),
            (good[..good.len() - 10].to_vec(), "a cut-off copy"),
            (good[..12].to_vec(), "cut short"),
            (b"date,load\n1,2\n".to_vec(), "not a state file"),
            (foreign, "saved by another model"),
            (f32_file, "saved by a stream in f32"),
        ] {
            let err = restored.restore_bytes(&bytes, "s.bin").unwrap_err().to_string();
            assert!(err.starts_with("state file s.bin: ") && err.contains(says) && !err.contains('\n'), "{err}");
            assert_eq!(restored.to_bytes(), good);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
