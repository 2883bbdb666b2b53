//! Our own checkpoints: one file holding the config, free-form metadata (training step, data
//! scaling, ...) and the weights as recorded by Burn's named MessagePack recorder in double
//! precision, so that f64 models round-trip bit-exactly (Burn's "full" precision is f32).
//!
//! Layout: the 8 bytes `MAMBA2CK`, a little-endian `u64` header length, a JSON header
//! `{"format": 1, "config": ..., "meta": ..., "payload_len": n, "payload_fnv1a64": h}`, then the
//! `n` payload bytes. The checksum turns a truncated or corrupted file into an error before any
//! weight is decoded. Files are written to a temporary name beside the target and renamed, so a
//! crash never leaves a half-written checkpoint under the real name.

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::prelude::*;
use burn::record::{DoublePrecisionSettings, NamedMpkBytesRecorder, Recorder};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{named_params, ModelError};

const MAGIC: &[u8; 8] = b"MAMBA2CK";
const FORMAT: u64 = 1;

/// FNV-1a's offset basis: the hash of no bytes, where [`fnv1a64_continue`] starts.
pub const FNV1A64_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a (64 bits) of `bytes` appended to what hashed to `h`: the checksum of checkpoints and
/// state files, and a hash built up piece by piece.
pub fn fnv1a64_continue(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_continue(FNV1A64_START, bytes)
}

fn bad(path: &Path, why: impl Into<String>) -> ModelError {
    ModelError::Checkpoint { path: path.display().to_string(), why: why.into() }
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    let io = |source| ModelError::Io { path: path.display().to_string(), cause: source };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| bad(path, "not a file path"))?;
    let tmp: PathBuf = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Removes the temporary files that [`write_atomically`] leaves in `dir` when its process is
/// killed between writing and renaming (names `.<file>.tmp-<pid>`); returns how many. Call it
/// where nothing else writes into `dir` at the same time.
pub fn remove_temporaries(dir: &Path) -> usize {
    remove_temporaries_where(dir, |name| name.starts_with('.'))
}

/// Removes the temporary files that [`write_atomically`] left beside `path` alone (see
/// [`remove_temporaries`]); returns how many. Call it where nothing else writes `path`.
pub fn remove_temporaries_of(path: &Path) -> usize {
    let Some(name) = path.file_name() else { return 0 };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let own = format!(".{}.tmp-", name.to_string_lossy());
    remove_temporaries_where(dir, |name| name.starts_with(&own))
}

/// Removes the files `.<file>.tmp-<pid>` in `dir` whose name also passes `keep`.
fn remove_temporaries_where(dir: &Path, keep: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            keep(&name)
                && name.starts_with('.')
                && name.rsplit_once(".tmp-").is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Saves `module` with its `config` and `meta` to `path`, atomically.
pub fn save_checkpoint<B: Backend, M: Module<B>, C: Serialize>(
    module: &M,
    config: &C,
    meta: &serde_json::Value,
    path: &Path,
) -> Result<(), ModelError> {
    let payload = NamedMpkBytesRecorder::<DoublePrecisionSettings>::default()
        .record(module.clone().into_record(), ())
        .map_err(|e| bad(path, format!("cannot record weights: {e}")))?;
    let header = serde_json::json!({
        "format": FORMAT,
        "config": config,
        "meta": meta,
        "payload_len": payload.len(),
        "payload_fnv1a64": fnv1a64(&payload),
    });
    let header = serde_json::to_vec(&header).map_err(|e| bad(path, e.to_string()))?;
    let mut bytes = Vec::with_capacity(16 + header.len() + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&payload);
    write_atomically(path, &bytes)
}

/// `onto` with the weights of `from`, a module of the same config on any backend: the two
/// backends meet in the checkpoint's encoding (f64), so this moves a model between devices, for
/// instance one drawn on the CPU onto a GPU.
pub fn transfer_weights<A: Backend, B: Backend, M: Module<A>, N: Module<B>>(
    from: &M,
    onto: N,
    device: &B::Device,
) -> Result<N, ModelError> {
    let recorder = NamedMpkBytesRecorder::<DoublePrecisionSettings>::default();
    let bytes = Recorder::<A>::record(&recorder, from.clone().into_record(), ())
        .map_err(|e| ModelError::Transfer { why: format!("cannot record weights: {e}") })?;
    let record = Recorder::<B>::load(&recorder, bytes, device)
        .map_err(|e| ModelError::Transfer { why: format!("the weights do not fit the other module: {e}") })?;
    Ok(onto.load_record(record))
}

/// A loaded checkpoint: the module, its config and the metadata saved with it.
#[derive(Debug)]
pub struct Loaded<M, C> {
    /// The module with the saved weights.
    pub module: M,
    /// The config it was saved with.
    pub config: C,
    /// The metadata it was saved with.
    pub meta: serde_json::Value,
}

/// Reads only the config and metadata of a checkpoint (cheap: no weights are decoded).
pub fn read_checkpoint_header<C: DeserializeOwned>(path: &Path) -> Result<(C, serde_json::Value), ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.display().to_string(), cause: source })?;
    let (config, meta, _) = split(path, &bytes)?;
    Ok((config, meta))
}

fn split<'a, C: DeserializeOwned>(path: &Path, bytes: &'a [u8]) -> Result<(C, serde_json::Value, &'a [u8]), ModelError> {
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(bad(path, "not a mamba2 checkpoint (bad magic bytes)"));
    }
    // The length is the file's to claim: checked against what is there, without overflow.
    let header_end = usize::try_from(u64::from_le_bytes(bytes[8..16].try_into().unwrap()))
        .ok()
        .and_then(|n| n.checked_add(16))
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| bad(path, "truncated checkpoint (header)"))?;
    let header = &bytes[16..header_end];
    let header: serde_json::Value = serde_json::from_slice(header).map_err(|e| bad(path, format!("corrupt checkpoint header: {e}")))?;
    if header["format"].as_u64() != Some(FORMAT) {
        return Err(bad(path, format!("unsupported checkpoint format {}", header["format"])));
    }
    let payload = &bytes[header_end..];
    if header["payload_len"].as_u64() != Some(payload.len() as u64) {
        return Err(bad(path, format!("truncated checkpoint: {} weight bytes, the header says {}", payload.len(), header["payload_len"])));
    }
    if header["payload_fnv1a64"].as_u64() != Some(fnv1a64(payload)) {
        return Err(bad(path, "corrupt checkpoint: weight checksum mismatch"));
    }
    let config = serde_json::from_value(header["config"].clone()).map_err(|e| bad(path, format!("checkpoint config unreadable: {e}")))?;
    Ok((config, header["meta"].clone(), payload))
}

/// Loads a checkpoint saved by [`save_checkpoint`]: `init` builds a fresh module from the saved
/// config, then the saved weights replace its parameters. Every parameter's shape is checked
/// against the fresh module, so a file whose weights do not match its config is an error.
pub fn load_checkpoint<B: Backend, M: Module<B>, C: DeserializeOwned>(
    path: &Path,
    device: &B::Device,
    init: impl FnOnce(&C, &B::Device) -> Result<M, ModelError>,
) -> Result<Loaded<M, C>, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.display().to_string(), cause: source })?;
    let (config, meta, payload) = split::<C>(path, &bytes)?;
    let fresh = init(&config, device)?;
    let expected: Vec<(String, Vec<usize>)> = named_params(&fresh).into_iter().map(|p| (p.path, p.dims)).collect();
    // Burn's decoder asserts on some damaged payloads (an invalid parameter id, a tensor whose
    // bytes do not fill its shape): those are errors here like any other.
    let module = crate::catch_panic(|| {
        NamedMpkBytesRecorder::<DoublePrecisionSettings>::default().load(payload.to_vec(), device).map(|record| fresh.load_record(record))
    })
    .map_err(|why| bad(path, format!("weights do not decode: {why}")))?
    .map_err(|e| bad(path, format!("weights do not decode for this config: {e}")))?;
    let got: Vec<(String, Vec<usize>)> = named_params(&module).into_iter().map(|p| (p.path, p.dims)).collect();
    if got != expected {
        let first = got.iter().zip(&expected).find(|(g, e)| g != e).map(|(g, e)| format!("{} has {:?}, config needs {:?}", g.0, g.1, e.1));
        return Err(bad(
            path,
            format!("weights do not match the saved config: {}", first.unwrap_or_else(|| "parameter count differs".into())),
        ));
    }
    Ok(Loaded { module, config, meta })
}
