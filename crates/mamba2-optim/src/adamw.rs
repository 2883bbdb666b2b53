use std::collections::{HashMap, HashSet};
use std::path::Path;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::Device;
use mamba2_model::{named_params, write_atomically, NamedParam};
use mamba2_tensor::from_f64_vec;
use safetensors::tensor::{serialize, TensorView};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use crate::OptimError;

/// Hyper-parameters of [`AdamW`], with PyTorch's defaults (`torch.optim.AdamW`) and Mamba's
/// no-weight-decay groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay for the decayed group.
    pub weight_decay: f64,
    /// Parameters whose path has one of these as a dotted component or dotted suffix take no
    /// weight decay (see [`matches_pattern`]).
    pub no_decay: Vec<String>,
    /// Clip the global L2 norm of all gradients together to this value (PyTorch's
    /// `clip_grad_norm_`); `None` for no clipping.
    pub max_grad_norm: Option<f64>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            no_decay: ["a_log", "d", "dt_bias", "norm", "norm_f", "bias"].map(String::from).to_vec(),
            max_grad_norm: Some(1.0),
        }
    }
}

/// Whether `pattern` names `path`: equal to one of its dotted components (`norm` matches
/// `layers.0.norm.weight`) or to a dotted suffix (`mixer.d` matches `layers.0.mixer.d`).
pub fn matches_pattern(path: &str, pattern: &str) -> bool {
    path == pattern || path.split('.').any(|c| c == pattern) || path.ends_with(&format!(".{pattern}"))
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The global L2 norm of the gradients before clipping, in f64.
    pub grad_norm: f64,
    /// The factor the gradients were multiplied by (1 when not clipped).
    pub clip_scale: f64,
    /// How many parameters were updated.
    pub updated: usize,
}

#[derive(Debug, Clone)]
struct Moments<B: Backend> {
    exp_avg: Tensor<B, 1>,
    exp_avg_sq: Tensor<B, 1>,
}

/// AdamW exactly as `torch.optim.AdamW` (decoupled decay, bias correction, `eps` outside the
/// root), with parameter groups and global-norm clipping, for any Burn module.
///
/// Burn's own AdamW keeps its hyper-parameters and bias corrections in f32 and clips each tensor
/// on its own; this one computes them in f64 and clips all gradients together, so that f64
/// training matches PyTorch to rounding.
///
/// The state is keyed by parameter path, so [`save`](Self::save) / [`load`](Self::load)
/// resume a run bit for bit.
#[derive(Debug)]
pub struct AdamW<B: AutodiffBackend> {
    config: AdamWConfig,
    params: Vec<NamedParam>,
    no_decay: HashSet<ParamId>,
    moments: HashMap<ParamId, Moments<B::InnerBackend>>,
    step: usize,
}

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    total: f64,
    nonfinite: Option<ParamId>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let s: f64 = mamba2_tensor::ordered_sum(g.powi_scalar(2)).into_data().convert::<f64>().to_vec::<f64>().expect("f64")[0];
            if !s.is_finite() && self.nonfinite.is_none() {
                self.nonfinite = Some(param.id);
            }
            self.total += s;
        }
    }
}

struct Update<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    moments: &'a mut HashMap<ParamId, Moments<B::InnerBackend>>,
    no_decay: &'a HashSet<ParamId>,
    config: &'a AdamWConfig,
    lr: f64,
    scale: f64,
    step: usize,
    updated: usize,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Update<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let id = param.id;
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(id) else {
            return param;
        };
        self.updated += 1;
        let c = self.config;
        let decay = if self.no_decay.contains(&id) { 0.0 } else { c.weight_decay };
        let step = self.step as i32;
        let (lr, scale) = (self.lr, self.scale);
        let moments = &mut *self.moments;
        param.map(|tensor| {
            let require_grad = tensor.is_require_grad();
            let dims = tensor.dims();
            let n = dims.iter().product::<usize>();
            let value = tensor.inner().reshape([n]);
            let grad = grad.reshape([n]);
            let grad = if scale != 1.0 { grad.mul_scalar(scale) } else { grad };
            let value = if decay != 0.0 { value.mul_scalar(1.0 - lr * decay) } else { value };
            // torch: exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
            let m = match moments.remove(&id) {
                Some(m) => Moments {
                    exp_avg: m.exp_avg.clone() + (grad.clone() - m.exp_avg).mul_scalar(1.0 - c.beta1),
                    exp_avg_sq: m.exp_avg_sq.mul_scalar(c.beta2) + grad.clone().powi_scalar(2).mul_scalar(1.0 - c.beta2),
                },
                None => {
                    Moments { exp_avg: grad.clone().mul_scalar(1.0 - c.beta1), exp_avg_sq: grad.powi_scalar(2).mul_scalar(1.0 - c.beta2) }
                }
            };
            let bias1 = 1.0 - c.beta1.powi(step);
            let bias2_sqrt = (1.0 - c.beta2.powi(step)).sqrt();
            let denom = m.exp_avg_sq.clone().sqrt().div_scalar(bias2_sqrt).add_scalar(c.eps);
            let value = value - (m.exp_avg.clone() / denom).mul_scalar(lr / bias1);
            moments.insert(id, m);
            let out = Tensor::from_inner(value.reshape(dims));
            if require_grad {
                out.require_grad()
            } else {
                out
            }
        })
    }
}

impl<B: AutodiffBackend> AdamW<B> {
    /// An optimizer for `module`'s parameters, split into the decayed and the no-decay group by
    /// their paths.
    pub fn new<M: AutodiffModule<B>>(config: AdamWConfig, module: &M) -> Result<Self, OptimError> {
        for (name, v, ok) in [
            ("beta1", config.beta1, (0.0..1.0).contains(&config.beta1)),
            ("beta2", config.beta2, (0.0..1.0).contains(&config.beta2)),
            ("eps", config.eps, config.eps > 0.0),
            ("weight_decay", config.weight_decay, config.weight_decay >= 0.0 && config.weight_decay.is_finite()),
        ] {
            if !ok {
                return Err(OptimError::Config { name, value: v });
            }
        }
        if let Some(m) = config.max_grad_norm {
            // Written so that NaN fails too.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            if !(m > 0.0) {
                return Err(OptimError::Config { name: "max_grad_norm", value: m });
            }
        }
        let params = named_params(module);
        let no_decay = params.iter().filter(|p| config.no_decay.iter().any(|pat| matches_pattern(&p.path, pat))).map(|p| p.id).collect();
        Ok(Self { config, params, no_decay, moments: HashMap::new(), step: 0 })
    }

    /// The paths of the parameters that take no weight decay.
    pub fn no_decay_paths(&self) -> Vec<&str> {
        self.params.iter().filter(|p| self.no_decay.contains(&p.id)).map(|p| p.path.as_str()).collect()
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> usize {
        self.step
    }

    /// The global L2 norm of `grads` over `module`'s parameters, in f64, without changing
    /// anything. Errors naming the first parameter whose gradient is not finite.
    pub fn grad_norm<M: AutodiffModule<B>>(&self, module: &M, grads: &GradientsParams) -> Result<f64, OptimError> {
        let mut v = SquaredNorm { grads, total: 0.0, nonfinite: None };
        module.visit(&mut v);
        if let Some(id) = v.nonfinite {
            let path = self.params.iter().find(|p| p.id == id).map_or_else(|| format!("{id}"), |p| p.path.clone());
            return Err(OptimError::NonFinite { path, step: self.step });
        }
        Ok(v.total.sqrt())
    }

    /// One step at learning rate `lr`: clip by the global norm (when configured), decay, update.
    /// A non-finite gradient stops before anything changes, naming the parameter.
    pub fn step<M: AutodiffModule<B>>(&mut self, lr: f64, module: M, mut grads: GradientsParams) -> Result<(M, StepReport), OptimError> {
        let grad_norm = self.grad_norm(&module, &grads)?;
        // torch.nn.utils.clip_grad_norm_: coef = max / (norm + 1e-6), clamped to 1.
        let clip_scale = match self.config.max_grad_norm {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        self.step += 1;
        let mut update = Update::<B> {
            grads: &mut grads,
            moments: &mut self.moments,
            no_decay: &self.no_decay,
            config: &self.config,
            lr,
            scale: clip_scale,
            step: self.step,
            updated: 0,
        };
        let module = module.map(&mut update);
        let updated = update.updated;
        Ok((module, StepReport { grad_norm, clip_scale, updated }))
    }

    /// Writes the step count and both moments of every parameter (keyed by path, f64) to
    /// `path` as safetensors, atomically.
    pub fn save(&self, path: &Path) -> Result<(), OptimError> {
        let mut blobs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for p in &self.params {
            if let Some(m) = self.moments.get(&p.id) {
                for (kind, t) in [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)] {
                    let v: Vec<f64> = t.clone().into_data().convert::<f64>().to_vec().expect("f64");
                    blobs.push((format!("{}.{kind}", p.path), vec![v.len()], v.iter().flat_map(|x| x.to_le_bytes()).collect()));
                }
            }
        }
        let views: Vec<(String, TensorView)> =
            blobs.iter().map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F64, s.clone(), b).expect("consistent view"))).collect();
        let meta = HashMap::from([
            ("step".to_string(), self.step.to_string()),
            ("config".to_string(), serde_json::to_string(&self.config).expect("serialisable")),
        ]);
        let bytes = serialize(views, Some(meta)).map_err(|e| OptimError::State { path: path.display().to_string(), why: e.to_string() })?;
        write_atomically(path, &bytes).map_err(|e| OptimError::State { path: path.display().to_string(), why: e.to_string() })
    }

    /// Restores what [`save`](Self::save) wrote. The parameters are matched by path; a state of
    /// another model (unknown path, wrong size) is an error.
    pub fn load(&mut self, path: &Path, device: &Device<B::InnerBackend>) -> Result<(), OptimError> {
        let err = |why: String| OptimError::State { path: path.display().to_string(), why };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| err(format!("not an optimizer state: {e}")))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| err(format!("not an optimizer state: {e}")))?;
        let step = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("step"))
            .and_then(|s| s.parse::<usize>().ok())
            .ok_or_else(|| err("no step count".into()))?;
        let by_path: HashMap<&str, &NamedParam> = self.params.iter().map(|p| (p.path.as_str(), p)).collect();
        let mut moments = HashMap::new();
        let mut seen = HashSet::new();
        for name in st.names() {
            let (pname, kind) = name.rsplit_once('.').ok_or_else(|| err(format!("unexpected tensor {name}")))?;
            let p = by_path.get(pname).ok_or_else(|| err(format!("state for unknown parameter {pname}")))?;
            if !seen.insert(pname.to_string()) {
                continue;
            }
            let read = |k: &str| -> Result<Tensor<B::InnerBackend, 1>, OptimError> {
                let view = st.tensor(&format!("{pname}.{k}")).map_err(|_| err(format!("{pname}: {k} missing")))?;
                let n = p.dims.iter().product::<usize>();
                if view.dtype() != Dtype::F64 || view.shape() != [n] {
                    return Err(err(format!("{pname}.{k}: expected f64 [{n}], got {:?} {:?}", view.dtype(), view.shape())));
                }
                let v: Vec<f64> = view.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect();
                Ok(from_f64_vec(v, [n], device))
            };
            let _ = kind;
            moments.insert(p.id, Moments { exp_avg: read("exp_avg")?, exp_avg_sq: read("exp_avg_sq")? });
        }
        self.moments = moments;
        self.step = step;
        Ok(())
    }
}
