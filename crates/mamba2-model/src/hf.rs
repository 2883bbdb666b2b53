//! Loading HF-format Mamba-2 checkpoints (`config.json` + `model.safetensors`).

use std::collections::BTreeSet;
use std::path::Path;

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use mamba2_tensor::from_f64_vec;
use safetensors::{Dtype, SafeTensors};

use crate::block::Mamba2Block;
use crate::mixer::{DepthwiseConv, Mamba2Mixer};
use crate::norm::RmsNorm;
use crate::{HfExtras, Mamba2Config, Mamba2LM, Mamba2Stack, ModelError};

/// The tensors of a safetensors file, taken by name with their shapes checked; remembers which
/// names were used so that extra tensors are reported too.
struct TensorSource<'a> {
    st: SafeTensors<'a>,
    used: BTreeSet<String>,
}

impl<'a> TensorSource<'a> {
    fn new(bytes: &'a [u8], path: &str) -> Result<Self, ModelError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| ModelError::Safetensors { path: path.to_string(), why: e.to_string() })?;
        Ok(Self { st, used: BTreeSet::new() })
    }

    fn has(&self, name: &str) -> bool {
        self.st.names().contains(&name)
    }

    /// The values of `name` as f64, checked against `shape`.
    fn values(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f64>, ModelError> {
        let view = self.st.tensor(name).map_err(|_| ModelError::MissingTensor { name: name.to_string() })?;
        if view.shape() != shape {
            return Err(ModelError::TensorShape { name: name.to_string(), expected: shape.to_vec(), got: view.shape().to_vec() });
        }
        let data = view.data();
        let values: Vec<f64> = match view.dtype() {
            Dtype::F64 => data.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect(),
            Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).collect(),
            // bf16 is the top half of an f32.
            Dtype::BF16 => data.chunks_exact(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16) as f64).collect(),
            Dtype::F16 => data.chunks_exact(2).map(|b| f16_to_f64(u16::from_le_bytes([b[0], b[1]]))).collect(),
            other => return Err(ModelError::TensorDtype { name: name.to_string(), dtype: format!("{other:?}") }),
        };
        self.used.insert(name.to_string());
        Ok(values)
    }

    fn tensor<B: Backend, const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        device: &B::Device,
    ) -> Result<Tensor<B, D>, ModelError> {
        let values = self.values(name, &shape)?;
        Ok(from_f64_vec(values, shape, device))
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
        self.st.names().into_iter().find(|n| !self.used.contains(*n)).map(|n| n.to_string())
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

/// Builds a language model from an HF config text and safetensors bytes (`path` only names the
/// file in errors).
///
/// Accepts HF's `backbone.embeddings.weight` and mamba_ssm's `backbone.embedding.weight`; a
/// tied `lm_head.weight`, when present, must equal the embedding. A missing, extra or
/// wrong-shaped tensor is an error naming it.
pub fn lm_from_hf_bytes<B: Backend>(
    config_json: &str,
    weights: &[u8],
    path: &str,
    device: &B::Device,
) -> Result<(Mamba2LM<B>, HfExtras), ModelError> {
    let (config, extras) = Mamba2Config::from_hf_json(config_json)?;
    if !extras.tie_word_embeddings {
        return Err(ModelError::HfConfig { why: "untied LM heads (tie_word_embeddings = false) are not supported".into() });
    }
    let mut src = TensorSource::new(weights, path)?;
    let emb_name = if src.has("backbone.embedding.weight") { "backbone.embedding.weight" } else { "backbone.embeddings.weight" };
    let shape = [extras.vocab_size, config.d_model];
    let emb_values = src.values(emb_name, &shape)?;
    if src.has("lm_head.weight") {
        let head = src.values("lm_head.weight", &shape)?;
        if head != emb_values {
            return Err(ModelError::HfConfig { why: "lm_head.weight differs from the embedding but the config ties them".into() });
        }
    }
    let weight = from_f64_vec(emb_values, shape, device);
    let backbone = stack_from(&mut src, "backbone.", &config, device)?;
    if let Some(name) = src.unused() {
        return Err(ModelError::UnexpectedTensor { name });
    }
    Ok((Mamba2LM { embeddings: Embedding { weight: Param::from_tensor(weight) }, backbone }, extras))
}

/// Loads an HF-format directory: `config.json` and `model.safetensors`.
pub fn load_hf_lm<B: Backend>(dir: &Path, device: &B::Device) -> Result<(Mamba2LM<B>, HfExtras), ModelError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| ModelError::Io { path: path.display().to_string(), cause: source })
    };
    let config = read("config.json")?;
    let config = String::from_utf8(config).map_err(|e| ModelError::HfConfig { why: format!("config.json is not UTF-8: {e}") })?;
    let weights = read("model.safetensors")?;
    lm_from_hf_bytes(&config, &weights, &dir.join("model.safetensors").display().to_string(), device)
}
