//! One AdamW trajectory with a decayed and a no-decay group and global-norm clipping, against
//! `torch.optim.AdamW` + `clip_grad_norm_` (f64 fixture from tools/reference/adamw_fixtures.py).

use std::path::PathBuf;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use mamba2_optim::{AdamW, AdamWConfig};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};
use safetensors::SafeTensors;

type B = Autodiff<NdArray<f64>>;

#[derive(Module, Debug)]
struct Layer<B: Backend> {
    weight: Param<Tensor<B, 2>>,
    bias: Param<Tensor<B, 1>>,
}

#[derive(Module, Debug)]
struct Mixer<B: Backend> {
    a_log: Param<Tensor<B, 1>>,
    d: Param<Tensor<B, 1>>,
}

#[derive(Module, Debug)]
struct Toy<B: Backend> {
    layer: Layer<B>,
    mixer: Mixer<B>,
}

fn read(st: &SafeTensors, key: &str) -> (Vec<f64>, Vec<usize>) {
    let v = st.tensor(key).unwrap_or_else(|_| panic!("fixture lacks {key}"));
    (v.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect(), v.shape().to_vec())
}

fn tensor<const D: usize>(st: &SafeTensors, key: &str) -> Tensor<B, D> {
    let (v, s) = read(st, key);
    Tensor::from_data(TensorData::new(v, s), &Default::default())
}

#[test]
fn adamw_with_groups_and_clipping_matches_torch_in_f64() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let bytes = std::fs::read(dir.join("adamw.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("adamw.json")).unwrap()).unwrap();

    let mut model = Toy::<B> {
        layer: Layer {
            weight: Param::from_tensor(tensor(&st, "init.layer.weight")),
            bias: Param::from_tensor(tensor(&st, "init.layer.bias")),
        },
        mixer: Mixer { a_log: Param::from_tensor(tensor(&st, "init.mixer.a_log")), d: Param::from_tensor(tensor(&st, "init.mixer.d")) },
    };
    let config = AdamWConfig {
        beta1: meta["betas"][0].as_f64().unwrap(),
        beta2: meta["betas"][1].as_f64().unwrap(),
        eps: meta["eps"].as_f64().unwrap(),
        weight_decay: meta["weight_decay"].as_f64().unwrap(),
        max_grad_norm: meta["max_grad_norm"].as_f64(),
        ..AdamWConfig::default()
    };
    let mut optim = AdamW::new(config, &model).unwrap();
    assert_eq!(optim.no_decay_paths(), ["layer.bias", "mixer.a_log", "mixer.d"]);

    let lrs: Vec<f64> = meta["lrs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let norms: Vec<f64> = meta["grad_norms_before_clip"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let mut worst = 0.0f64;
    for (step, lr) in lrs.iter().enumerate() {
        let mut grads = GradientsParams::new();
        grads.register::<NdArray<f64>, 2>(model.layer.weight.id, tensor::<2>(&st, &format!("step{step}.grad.layer.weight")).inner());
        grads.register::<NdArray<f64>, 1>(model.layer.bias.id, tensor::<1>(&st, &format!("step{step}.grad.layer.bias")).inner());
        grads.register::<NdArray<f64>, 1>(model.mixer.a_log.id, tensor::<1>(&st, &format!("step{step}.grad.mixer.a_log")).inner());
        grads.register::<NdArray<f64>, 1>(model.mixer.d.id, tensor::<1>(&st, &format!("step{step}.grad.mixer.d")).inner());
        let (next, report) = optim.step(*lr, model, grads).unwrap();
        model = next;
        let dn = (report.grad_norm - norms[step]).abs() / norms[step];
        assert!(dn <= 1e-14, "step {step}: grad norm {} vs torch {}", report.grad_norm, norms[step]);
        assert_eq!(report.updated, 4);
        for (name, got) in [
            ("layer.weight", to_f64_vec(model.layer.weight.val())),
            ("layer.bias", to_f64_vec(model.layer.bias.val())),
            ("mixer.a_log", to_f64_vec(model.mixer.a_log.val())),
            ("mixer.d", to_f64_vec(model.mixer.d.val())),
        ] {
            let (want, _) = read(&st, &format!("step{step}.param.{name}"));
            let d = rel_diff(&got, &want);
            worst = worst.max(d);
            assert!(d <= 1e-12, "step {step}: {name} differs from torch by {d:e}");
        }
    }
    println!("worst relative difference to torch over {} steps: {worst:e}", lrs.len());
}

#[test]
fn zero_gradients_shrink_decayed_parameters_and_leave_the_rest_exactly() {
    let device = Default::default();
    let model = Toy::<B> {
        layer: Layer { weight: Param::from_tensor(Tensor::ones([3, 4], &device)), bias: Param::from_tensor(Tensor::ones([4], &device)) },
        mixer: Mixer {
            a_log: Param::from_tensor(Tensor::full([2], 0.7, &device)),
            d: Param::from_tensor(Tensor::full([2], -1.3, &device)),
        },
    };
    let config = AdamWConfig { weight_decay: 0.1, ..AdamWConfig::default() };
    let mut optim = AdamW::new(config, &model).unwrap();
    let mut grads = GradientsParams::new();
    grads.register::<NdArray<f64>, 2>(model.layer.weight.id, Tensor::zeros([3, 4], &device));
    grads.register::<NdArray<f64>, 1>(model.layer.bias.id, Tensor::zeros([4], &device));
    grads.register::<NdArray<f64>, 1>(model.mixer.a_log.id, Tensor::zeros([2], &device));
    grads.register::<NdArray<f64>, 1>(model.mixer.d.id, Tensor::zeros([2], &device));
    let lr = 0.01;
    let (model, report) = optim.step(lr, model, grads).unwrap();
    assert_eq!(report.grad_norm, 0.0);
    assert!(to_f64_vec(model.layer.weight.val()).iter().all(|&w| w == 1.0 - lr * 0.1), "decayed weights shrink by lr * wd");
    assert!(to_f64_vec(model.layer.bias.val()).iter().all(|&b| b == 1.0), "bias unchanged");
    assert!(to_f64_vec(model.mixer.a_log.val()).iter().all(|&a| a == 0.7), "A_log unchanged");
    assert!(to_f64_vec(model.mixer.d.val()).iter().all(|&d| d == -1.3), "D unchanged");
}

#[test]
fn a_non_finite_gradient_names_the_parameter() {
    let device = Default::default();
    let model = Toy::<B> {
        layer: Layer { weight: Param::from_tensor(Tensor::ones([3, 4], &device)), bias: Param::from_tensor(Tensor::ones([4], &device)) },
        mixer: Mixer { a_log: Param::from_tensor(Tensor::ones([2], &device)), d: Param::from_tensor(Tensor::ones([2], &device)) },
    };
    let mut optim = AdamW::new(AdamWConfig::default(), &model).unwrap();
    let mut grads = GradientsParams::new();
    grads.register::<NdArray<f64>, 2>(model.layer.weight.id, Tensor::zeros([3, 4], &device));
    grads.register::<NdArray<f64>, 1>(model.mixer.a_log.id, Tensor::from_data([1.0, f64::NAN], &device));
    let err = optim.step(0.1, model, grads).unwrap_err();
    assert_eq!(err.to_string(), "non-finite gradient in mixer.a_log at optimizer step 0");
    assert!(AdamW::<B>::new(
        AdamWConfig { beta2: 1.0, ..AdamWConfig::default() },
        &Toy::<B> {
            layer: Layer {
                weight: Param::from_tensor(Tensor::ones([1, 1], &device)),
                bias: Param::from_tensor(Tensor::ones([1], &device))
            },
            mixer: Mixer { a_log: Param::from_tensor(Tensor::ones([1], &device)), d: Param::from_tensor(Tensor::ones([1], &device)) },
        }
    )
    .is_err());
}
