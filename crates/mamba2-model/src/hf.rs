//! Loading HF-format Mamba-2 checkpoints: `config.json` (HF transformers' or mamba_ssm's form)
//! with `model.safetensors`, or with shards listed in `model.safetensors.index.json`.
//!
//! Files are read tensor by tensor: each tensor's bytes are read, converted straight into the
//! backend's float type and dropped before the next, so that loading needs little more memory
//! than the weights themselves (a whole 14 GB file is never held beside its converted copy).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::Element;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};

use crate::block::Mamba2Block;
use crate::mixer::{DepthwiseConv, Mamba2Mixer};
use crate::norm::RmsNorm;
use crate::{HfExtras, Mamba2Config, Mamba2LM, Mamba2Stack, ModelError};

/// One safetensors file on disk, read tensor by tensor.
struct DiskFile {
    path: String,
    file: File,
    /// Where the tensors' data starts: after the 8-byte length and the JSON header.
    data_start: u64,
}

impl DiskFile {
    /// Opens `path` and reads its header; every tensor's range is checked against the file's
    /// length, so that a truncated shard is an error here rather than a short read later.
    fn open(path: &Path) -> Result<(Self, Vec<(String, TensorInfo)>), ModelError> {
        let name = path.display().to_string();
        let io = |cause| ModelError::Io { path: name.clone(), cause };
        let bad = |why: String| ModelError::Safetensors { path: name.clone(), why };
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n).map_err(|_| bad("shorter than its 8-byte header length".into()))?;
        let n = u64::from_le_bytes(n);
        // safetensors' own bound on a header (100 MB), checked before the header is read.
        if n > 100_000_000 || 8 + n > len {
            return Err(bad(format!("a header length of {n} bytes does not fit a file of {len} bytes")));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(io)?;
        let metadata: Metadata = serde_json::from_slice(&header).map_err(|e| bad(format!("unreadable header: {e}")))?;
        let data_len = len - 8 - n;
        let mut tensors: Vec<(String, TensorInfo)> = metadata.tensors().into_iter().map(|(k, v)| (k, v.clone())).collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        for (tensor, info) in &tensors {
            let (begin, end) = info.data_offsets;
            let want = info.shape.iter().try_fold(info.dtype.bitsize(), |acc, &d| acc.checked_mul(d)).map(|bits| bits.div_ceil(8));
            if begin > end || end as u64 > data_len || want != Some(end - begin) {
                return Err(bad(format!(
                    "tensor `{tensor}` ({:?} {:?}) claims bytes {begin}..{end} of {data_len}",
                    info.dtype, info.shape
                )));
            }
        }
        Ok((Self { path: name, file, data_start: 8 + n }, tensors))
    }

    /// Hands the bytes of a tensor to `each` in pieces of at most [`READ_PIECE`] bytes (each a
    /// whole number of values), so that a tensor as large as the file is never held twice.
    fn read_pieces(&mut self, info: &TensorInfo, mut each: impl FnMut(&[u8])) -> Result<(), ModelError> {
        let (begin, end) = info.data_offsets;
        let Self { path, file, data_start } = self;
        let io = |cause| ModelError::Io { path: path.clone(), cause };
        file.seek(SeekFrom::Start(*data_start + begin as u64)).map_err(io)?;
        let mut piece = vec![0u8; READ_PIECE.min(end - begin)];
        let mut left = end - begin;
        while left > 0 {
            let n = left.min(READ_PIECE);
            file.read_exact(&mut piece[..n]).map_err(io)?;
            each(&piece[..n]);
            left -= n;
        }
        Ok(())
    }
}

/// Bytes read from a file at a time: a multiple of every dtype's width.
const READ_PIECE: usize = 8 << 20;

/// Where the tensors come from.
enum Files<'a> {
    /// One safetensors file already in memory.
    Bytes(SafeTensors<'a>),
    /// Files on disk: each tensor's file (by position) and place in it.
    Disk { files: Vec<DiskFile>, index: BTreeMap<String, (usize, TensorInfo)> },
}

/// Where one tensor's bytes are.
enum Stored<'a> {
    Bytes(&'a [u8]),
    /// The file (by position) and the tensor's place in it.
    Disk(usize, TensorInfo),
}

/// The tensors of a checkpoint, taken by name with their shapes checked; remembers which names
/// were used so that extra tensors are reported too.
struct TensorSource<'a> {
    files: Files<'a>,
    used: BTreeSet<String>,
}

impl<'a> TensorSource<'a> {
    fn from_bytes(bytes: &'a [u8], path: &str) -> Result<Self, ModelError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Safetensors { path: path.to_string(), why: e.to_string() })?;
        Ok(Self { files: Files::Bytes(st), used: BTreeSet::new() })
    }

    /// The files of a checkpoint directory: the shards named by `model.safetensors.index.json`
    /// when there is one, else `model.safetensors`.
    fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let index_path = dir.join("model.safetensors.index.json");
        let shards: Vec<(String, Option<BTreeSet<String>>)> = if index_path.exists() {
            let shown = index_path.display().to_string();
            let text = std::fs::read_to_string(&index_path).map_err(|cause| ModelError::Io { path: shown.clone(), cause })?;
            let bad = |why: String| ModelError::Safetensors { path: shown.clone(), why };
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no `weight_map` object".into()))?;
            let mut by_file: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| bad(format!("the file of `{tensor}` is not a string: {file}")))?;
                // Shards live beside the index: a name that reaches elsewhere is refused.
                if file.is_empty() || file.contains(['/', '\\']) || file == ".." {
                    return Err(bad(format!("`{tensor}` names the file {file:?}, which is not in this folder")));
                }
                by_file.entry(file.to_string()).or_default().insert(tensor.clone());
            }
            by_file.into_iter().map(|(f, names)| (f, Some(names))).collect()
        } else {
            vec![("model.safetensors".to_string(), None)]
        };
        let (mut files, mut index) = (Vec::new(), BTreeMap::new());
        for (name, listed) in shards {
            let (file, tensors) = DiskFile::open(&dir.join(&name))?;
            let bad = |why: String| ModelError::Safetensors { path: file.path.clone(), why };
            if let Some(listed) = &listed {
                if let Some(missing) = listed.iter().find(|t| !tensors.iter().any(|(n, _)| n == *t)) {
                    return Err(bad(format!("the index puts `{missing}` in this file, which does not hold it")));
                }
            }
            for (tensor, info) in tensors {
                // The index and its shards must agree both ways: a tensor the index does not
                // list would otherwise be loaded or ignored by chance of the file order.
                if listed.as_ref().is_some_and(|l| !l.contains(&tensor)) {
                    return Err(bad(format!("holds `{tensor}`, which the index puts elsewhere or does not list")));
                }
                if index.insert(tensor.clone(), (files.len(), info)).is_some() {
                    return Err(bad(format!("`{tensor}` is in more than one shard")));
                }
            }
            files.push(file);
        }
        Ok(Self { files: Files::Disk { files, index }, used: BTreeSet::new() })
    }

    fn has(&self, name: &str) -> bool {
        match &self.files {
            Files::Bytes(st) => st.names().contains(&name),
            Files::Disk { index, .. } => index.contains_key(name),
        }
    }

    /// Where `name` is stored and its dtype, checked against `shape`; marks it used.
    fn locate(&mut self, name: &str, shape: &[usize]) -> Result<(Dtype, Stored<'a>), ModelError> {
        let missing = || ModelError::MissingTensor { name: name.to_string() };
        let check = |got: &[usize]| {
            if got == shape {
                Ok(())
            } else {
                Err(ModelError::TensorShape { name: name.to_string(), expected: shape.to_vec(), got: got.to_vec() })
            }
        };
        let found = match &self.files {
            Files::Bytes(st) => {
                let view = st.tensor(name).map_err(|_| missing())?;
                check(view.shape())?;
                (view.dtype(), Stored::Bytes(view.data()))
            }
            Files::Disk { index, .. } => {
                let (file, info) = index.get(name).ok_or_else(missing)?;
                check(&info.shape)?;
                (info.dtype, Stored::Disk(*file, info.clone()))
            }
        };
        self.used.insert(name.to_string());
        Ok(found)
    }

    /// Hands the stored bytes to `each`, in pieces for a file on disk.
    fn pieces(&mut self, stored: &Stored<'a>, mut each: impl FnMut(&[u8])) -> Result<(), ModelError> {
        match (stored, &mut self.files) {
            (Stored::Bytes(bytes), _) => {
                each(bytes);
                Ok(())
            }
            (Stored::Disk(file, info), Files::Disk { files, .. }) => files[*file].read_pieces(info, each),
            (Stored::Disk(..), Files::Bytes(_)) => unreachable!("a tensor on disk comes from a source of files"),
        }
    }

    /// Whether two tensors hold the same dtype, shape and bytes, compared piece by piece.
    fn same(&mut self, a: &str, b: &str, shape: &[usize]) -> Result<bool, ModelError> {
        let ((da, sa), (db, sb)) = (self.locate(a, shape)?, self.locate(b, shape)?);
        if da != db {
            return Ok(false);
        }
        let mut first = Vec::new();
        self.pieces(&sa, |p| first.extend_from_slice(p))?;
        let (mut at, mut equal) = (0, true);
        self.pieces(&sb, |p| {
            equal &= first.get(at..at + p.len()) == Some(p);
            at += p.len();
        })?;
        Ok(equal && at == first.len())
    }

    /// The values of `name` converted straight into `E`, checked against `shape`.
    fn values<E: Element>(&mut self, name: &str, shape: &[usize]) -> Result<Vec<E>, ModelError> {
        let (dtype, stored) = self.locate(name, shape)?;
        let convert: fn(&[u8], &mut Vec<E>) = match dtype {
            Dtype::F64 => |b, out| out.extend(b.chunks_exact(8).map(|b| E::from_elem(f64::from_le_bytes(b.try_into().expect("8 bytes"))))),
            Dtype::F32 => |b, out| out.extend(b.chunks_exact(4).map(|b| E::from_elem(f32::from_le_bytes(b.try_into().expect("4 bytes"))))),
            // bf16 is the top half of an f32.
            Dtype::BF16 => |b, out| {
                out.extend(b.chunks_exact(2).map(|b| E::from_elem(f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))))
            },
            Dtype::F16 => |b, out| out.extend(b.chunks_exact(2).map(|b| E::from_elem(f16_to_f64(u16::from_le_bytes([b[0], b[1]]))))),
            other => return Err(ModelError::TensorDtype { name: name.to_string(), dtype: format!("{other:?}") }),
        };
        let mut out = Vec::with_capacity(shape.iter().product());
        self.pieces(&stored, |p| convert(p, &mut out))?;
        Ok(out)
    }

    fn tensor<B: Backend, const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        device: &B::Device,
    ) -> Result<Tensor<B, D>, ModelError> {
        let values = self.values::<B::FloatElem>(name, &shape)?;
        Ok(Tensor::from_data(TensorData::new(values, shape), device))
    }

    /// A PyTorch `[out, in]` Linear weight, transposed to Burn's `[in, out]`.
    fn linear<B: Backend>(
        &mut self,
        prefix: &str,
        d_in: usize,
        d_out: usize,
        bias: bool,
        device: &B::Device,
    ) -> Result<Linear<B>, ModelError> {
        let weight = self.tensor::<B, 2>(&format!("{prefix}.weight"), [d_out, d_in], device)?.transpose();
        let bias = if bias { Some(Param::from_tensor(self.tensor::<B, 1>(&format!("{prefix}.bias"), [d_out], device)?)) } else { None };
        Ok(Linear { weight: Param::from_tensor(weight), bias })
    }

    fn norm<B: Backend>(&mut self, name: &str, d: usize, device: &B::Device) -> Result<RmsNorm<B>, ModelError> {
        Ok(RmsNorm { weight: Param::from_tensor(self.tensor::<B, 1>(name, [d], device)?) })
    }

    fn unused(&self) -> Option<String> {
        match &self.files {
            Files::Bytes(st) => st.names().into_iter().find(|n| !self.used.contains(*n)).map(|n| n.to_string()),
            Files::Disk { index, .. } => index.keys().find(|n| !self.used.contains(*n)).cloned(),
        }
    }
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f64;
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 => {
            if frac == 0.0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        }
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Builds the stack from tensors named `{prefix}layers.{i}...` and `{prefix}norm_f.weight`.
fn stack_from<B: Backend>(
    src: &mut TensorSource,
    prefix: &str,
    config: &Mamba2Config,
    device: &B::Device,
) -> Result<Mamba2Stack<B>, ModelError> {
    let (d, di, h, cd, k) = (config.d_model, config.d_inner(), config.nheads(), config.conv_dim(), config.d_conv);
    let mut layers = Vec::with_capacity(config.n_layer);
    for i in 0..config.n_layer {
        let p = format!("{prefix}layers.{i}");
        let m = format!("{p}.mixer");
        let conv1d = DepthwiseConv {
            weight: Param::from_tensor(src.tensor::<B, 3>(&format!("{m}.conv1d.weight"), [cd, 1, k], device)?),
            bias: if config.conv_bias {
                Some(Param::from_tensor(src.tensor::<B, 1>(&format!("{m}.conv1d.bias"), [cd], device)?))
            } else {
                None
            },
        };
        let d_len = if config.d_has_hdim { di } else { h };
        let mixer = Mamba2Mixer::from_parts(
            config,
            src.linear(&format!("{m}.in_proj"), d, config.d_in_proj(), config.bias, device)?,
            conv1d,
            src.tensor::<B, 1>(&format!("{m}.dt_bias"), [h], device)?,
            src.tensor::<B, 1>(&format!("{m}.A_log"), [h], device)?,
            src.tensor::<B, 1>(&format!("{m}.D"), [d_len], device)?,
            src.norm(&format!("{m}.norm.weight"), di, device)?,
            src.linear(&format!("{m}.out_proj"), di, d, config.bias, device)?,
        );
        layers.push(Mamba2Block { norm: src.norm(&format!("{p}.norm.weight"), d, device)?, mixer });
    }
    let norm_f = src.norm(&format!("{prefix}norm_f.weight"), d, device)?;
    Ok(Mamba2Stack::from_parts(config, layers, norm_f))
}

/// Builds a language model from a `config.json` text and the bytes of one safetensors file
/// (`path` only names the file in errors).
///
/// Accepts HF's `backbone.embeddings.weight` and mamba_ssm's `backbone.embedding.weight`. With
/// `tie_word_embeddings` (mamba_ssm: `tie_embeddings`) a `lm_head.weight`, when present, must
/// equal the embedding; without it `lm_head.weight` is the head's own weight. A missing, extra
/// or wrong-shaped tensor is an error naming it.
pub fn lm_from_hf_bytes<B: Backend>(
    config_json: &str,
    weights: &[u8],
    path: &str,
    device: &B::Device,
) -> Result<(Mamba2LM<B>, HfExtras), ModelError> {
    let (config, extras) = Mamba2Config::from_hf_json(config_json)?;
    lm_from_source(TensorSource::from_bytes(weights, path)?, config, extras, device)
}

fn lm_from_source<B: Backend>(
    mut src: TensorSource,
    config: Mamba2Config,
    extras: HfExtras,
    device: &B::Device,
) -> Result<(Mamba2LM<B>, HfExtras), ModelError> {
    let emb_name = if src.has("backbone.embedding.weight") { "backbone.embedding.weight" } else { "backbone.embeddings.weight" };
    let shape = [extras.vocab_size, config.d_model];
    let lm_head = if extras.tie_word_embeddings {
        if src.has("lm_head.weight") {
            // Compared as stored, before either is converted.
            if !src.same("lm_head.weight", emb_name, &shape)? {
                return Err(ModelError::HfConfig { why: "lm_head.weight differs from the embedding but the config ties them".into() });
            }
        }
        None
    } else {
        Some(src.linear("lm_head", config.d_model, extras.vocab_size, false, device)?)
    };
    let weight = src.tensor::<B, 2>(emb_name, shape, device)?;
    let backbone = stack_from(&mut src, "backbone.", &config, device)?;
    if let Some(name) = src.unused() {
        return Err(ModelError::UnexpectedTensor { name });
    }
    Ok((Mamba2LM { embeddings: Embedding { weight: Param::from_tensor(weight) }, backbone, lm_head }, extras))
}

/// Loads a checkpoint directory: `config.json` (HF transformers' or mamba_ssm's form) and
/// `model.safetensors`, or the shards listed in `model.safetensors.index.json`. The weights are
/// read one tensor at a time and converted straight into the backend's float type (bf16, f16,
/// f32 and f64 files). A `generation_config.json` beside them, when it names an `eos_token_id`,
/// gives [`HfExtras::eos_token_ids`].
pub fn load_hf_lm<B: Backend>(dir: &Path, device: &B::Device) -> Result<(Mamba2LM<B>, HfExtras), ModelError> {
    let path = dir.join("config.json");
    let config = std::fs::read(&path).map_err(|cause| ModelError::Io { path: path.display().to_string(), cause })?;
    let config = String::from_utf8(config).map_err(|e| ModelError::HfConfig { why: format!("config.json is not UTF-8: {e}") })?;
    let (config, mut extras) = Mamba2Config::from_hf_json(&config)?;
    let generation = dir.join("generation_config.json");
    if generation.exists() {
        let text =
            std::fs::read_to_string(&generation).map_err(|cause| ModelError::Io { path: generation.display().to_string(), cause })?;
        if let Some(ids) = crate::config::generation_eos(&text)? {
            extras.eos_token_ids = ids;
        }
    }
    lm_from_source(TensorSource::from_dir(dir)?, config, extras, device)
}
