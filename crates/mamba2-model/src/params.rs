//! Parameters by path (`backbone.layers.0.mixer.a_log`), for optimizer groups, gradient checks
//! and checkpoint names.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

/// One float parameter: its dotted path in the module tree, id and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedParam {
    /// Field names from the root, joined by dots; vector entries are their index.
    pub path: String,
    /// Burn's id of the parameter (stable across optimizer steps).
    pub id: ParamId,
    /// The shape.
    pub dims: Vec<usize>,
}

#[derive(Default)]
struct PathVisitor {
    stack: Vec<String>,
    out: Vec<NamedParam>,
}

impl PathVisitor {
    fn leaf(&self) -> String {
        self.stack.join(".")
    }
}

impl<B: Backend> ModuleVisitor<B> for PathVisitor {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let path = self.leaf();
        self.out.push(NamedParam { path, id: param.id, dims: param.val().dims().to_vec() });
    }
}

/// Every float parameter of `module`, in visiting order.
pub fn named_params<B: Backend, M: Module<B>>(module: &M) -> Vec<NamedParam> {
    let mut v = PathVisitor::default();
    module.visit(&mut v);
    v.out
}

struct GradVisitor<'a, B: AutodiffBackend> {
    stack: Vec<String>,
    grads: &'a B::Gradients,
    out: Vec<(String, Option<Tensor<B::InnerBackend, 1>>)>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradVisitor<'_, B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let grad = param.val().grad(self.grads).map(|g| {
            let n = g.dims().iter().product::<usize>();
            g.reshape([n])
        });
        self.out.push((self.stack.join("."), grad));
    }
}

/// The gradient of every float parameter of `module` (flattened), by path; `None` where no
/// gradient reached the parameter.
pub fn named_grads<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> Vec<(String, Option<Tensor<B::InnerBackend, 1>>)> {
    let mut v = GradVisitor { stack: Vec::new(), grads, out: Vec::new() };
    module.visit(&mut v);
    v.out
}

/// The HF checkpoint name of a [`Mamba2LM`](crate::Mamba2LM) parameter path, and whether the
/// checkpoint stores it transposed (PyTorch Linear weights are `[out, in]`).
pub fn hf_name(path: &str) -> (String, bool) {
    let name = if path.starts_with("embeddings.") { format!("backbone.{path}") } else { path.to_string() };
    let name = match name.rsplit_once('.') {
        Some((parent, "a_log")) if parent.ends_with("mixer") => format!("{parent}.A_log"),
        Some((parent, "d")) if parent.ends_with("mixer") => format!("{parent}.D"),
        _ => name,
    };
    let transposed = name.ends_with("in_proj.weight") || name.ends_with("out_proj.weight") || name == "lm_head.weight";
    (name, transposed)
}
