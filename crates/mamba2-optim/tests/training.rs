//! The seed system's three failures, tested on the real model and optimizer, in f64 and f32:
//! gradients reach every parameter, one step changes every parameter, and training on a
//! learnable task makes the loss fall. Plus: saving and resuming is bit-exact.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use mamba2_model::{named_params, Mamba2Config, Mamba2TimeSeries, TimeSeriesConfig};
use mamba2_optim::{loss_value, AdamW, AdamWConfig, LrSchedule};
use mamba2_tensor::compare::to_f64_vec;
use mamba2_tensor::graph;

type F64 = Autodiff<NdArray<f64>>;
type F32 = Autodiff<Flex>;

const LOOKBACK: usize = 32;
const BATCH: usize = 16;

fn model_config() -> TimeSeriesConfig {
    TimeSeriesConfig::new(Mamba2Config::new(16, 2).with_d_state(8).with_headdim(8).with_chunk_size(16), 1, 1)
}

/// A smooth random input `u` and the target `y_t = 0.6 u_{t-2} + 0.3 u_{t-3} - 0.4 u_{t-5}`: a
/// delayed, filtered copy of the input, to be predicted at the last position of each window.
struct Task {
    u: Vec<f64>,
    y: Vec<f64>,
}

impl Task {
    fn new(len: usize) -> Self {
        let mut state = 0x1234_5678u64;
        let mut noise = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let mut u = vec![0.0; len];
        for t in 1..len {
            u[t] = 0.7 * u[t - 1] + noise();
        }
        let at = |t: isize| if t >= 0 { u[t as usize] } else { 0.0 };
        let y = (0..len as isize).map(|t| 0.6 * at(t - 2) + 0.3 * at(t - 3) - 0.4 * at(t - 5)).collect();
        Self { u, y }
    }

    /// Batch `k`: windows starting at deterministic offsets.
    fn batch<B: Backend>(&self, k: usize, device: &B::Device) -> (Tensor<B, 3>, Tensor<B, 2>) {
        let span = self.u.len() - LOOKBACK;
        let starts: Vec<usize> = (0..BATCH).map(|i| (k * 7919 + i * 104_729) % span).collect();
        let x: Vec<f64> = starts.iter().flat_map(|&s| self.u[s..s + LOOKBACK].to_vec()).collect();
        let y: Vec<f64> = starts.iter().map(|&s| self.y[s + LOOKBACK - 1]).collect();
        (
            Tensor::from_data(TensorData::new(x, [BATCH, LOOKBACK, 1]).convert::<B::FloatElem>(), device),
            Tensor::from_data(TensorData::new(y, [BATCH, 1]).convert::<B::FloatElem>(), device),
        )
    }
}

/// The loss of the last position, its graph built inside a recording: the tests of this file run
/// on several threads at once (see `mamba2_tensor::graph`), so every backward goes through
/// [`graph::backward`].
fn loss<B: AutodiffBackend>(model: &Mamba2TimeSeries<B>, x: Tensor<B, 3>, y: Tensor<B, 2>) -> Tensor<B, 1> {
    let _building = graph::recording();
    let (out, _) = model.forward(x, None).unwrap();
    let last = out.narrow(1, LOOKBACK - 1, 1).reshape([BATCH, 1]);
    (last - y).powi_scalar(2).mean()
}

fn params_of<B: AutodiffBackend>(model: &Mamba2TimeSeries<B>) -> Vec<(String, Vec<f64>)> {
    let inner = model.valid();
    let values = ValueVisitor::collect(&inner);
    named_params(&inner).into_iter().map(|p| p.path).zip(values).collect()
}

struct ValueVisitor(Vec<Vec<f64>>);

impl ValueVisitor {
    fn collect<B: Backend, M: burn::module::Module<B>>(m: &M) -> Vec<Vec<f64>> {
        let mut v = ValueVisitor(Vec::new());
        m.visit(&mut v);
        v.0
    }
}

impl<B: Backend> burn::module::ModuleVisitor<B> for ValueVisitor {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
        self.0.push(to_f64_vec(param.val()));
    }
}

/// Seed tests 1 and 2: every parameter has a gradient after backward, and differs after one step.
fn every_parameter_gets_a_gradient_and_moves<B: AutodiffBackend>() {
    let device = Default::default();
    let task = Task::new(2000);
    let model: Mamba2TimeSeries<B> = model_config().init(&device).unwrap();
    let (x, y) = task.batch::<B>(0, &device);
    let grads = GradientsParams::from_grads(graph::backward(loss(&model, x, y)), &model);
    let params = named_params(&model);
    let missing: Vec<&str> = params
        .iter()
        .filter(|p| {
            p.dims.len() == 1 && grads.get::<B::InnerBackend, 1>(p.id).is_none()
                || p.dims.len() == 2 && grads.get::<B::InnerBackend, 2>(p.id).is_none()
                || p.dims.len() == 3 && grads.get::<B::InnerBackend, 3>(p.id).is_none()
        })
        .map(|p| p.path.as_str())
        .collect();
    assert!(missing.is_empty(), "parameters without a gradient: {missing:?}");
    assert_eq!(grads.len(), params.len(), "one gradient per parameter");

    let before = params_of(&model);
    let mut optim = AdamW::new(AdamWConfig::default(), &model).unwrap();
    let (model, report) = optim.step(1e-3, model, grads).unwrap();
    assert_eq!(report.updated, params.len());
    let after = params_of(&model);
    let unchanged: Vec<&str> = before.iter().zip(&after).filter(|(b, a)| b.1 == a.1).map(|(b, _)| b.0.as_str()).collect();
    assert!(unchanged.is_empty(), "parameters unchanged by an optimizer step: {unchanged:?}");
}

/// Seed test 3: the loss falls by at least 90 % within 200 steps.
fn loss_falls_on_a_learnable_task<B: AutodiffBackend>(name: &str) {
    loss_falls_within::<B>(name, 200, 0.1);
}

/// `steps` optimizer steps on the learnable task under a warm-up and cosine schedule of that
/// length: the mean loss of the last twentieth must be at most `ratio` times that of the first 5.
fn loss_falls_within<B: AutodiffBackend>(name: &str, steps: usize, ratio: f64) {
    let device = Default::default();
    B::seed(&device, 3);
    let task = Task::new(4000);
    let mut model: Mamba2TimeSeries<B> = model_config().init(&device).unwrap();
    let mut optim = AdamW::new(AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() }, &model).unwrap();
    let schedule = LrSchedule::WarmupCosine { peak: 1e-2, floor: 1e-3, warmup: steps / 20, total: steps };
    let mut losses = Vec::new();
    for step in 0..steps {
        let (x, y) = task.batch::<B>(step, &device);
        let l = loss(&model, x, y);
        losses.push(loss_value(&l));
        let grads = GradientsParams::from_grads(graph::backward(l), &model);
        model = optim.step(schedule.lr_at(step), model, grads).unwrap().0;
    }
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let tail = &losses[steps - steps / 20..];
    let last: f64 = tail.iter().sum::<f64>() / tail.len() as f64;
    println!(
        "{name}: mean loss of the first 5 steps {first:.4e}, of the last {} {last:.4e} ({:.1} % lower)",
        tail.len(),
        100.0 * (1.0 - last / first)
    );
    assert!(last <= ratio * first, "{name}: loss fell only from {first:e} to {last:e} in {steps} steps");
}

#[test]
fn every_parameter_gets_a_gradient_and_moves_f64() {
    every_parameter_gets_a_gradient_and_moves::<F64>();
}

#[test]
fn every_parameter_gets_a_gradient_and_moves_f32() {
    every_parameter_gets_a_gradient_and_moves::<F32>();
}

#[test]
fn loss_falls_90_percent_in_200_steps_f64() {
    loss_falls_on_a_learnable_task::<F64>("f64");
}

#[test]
fn loss_falls_90_percent_in_200_steps_f32() {
    loss_falls_on_a_learnable_task::<F32>("f32");
}

/// Saving model and optimizer at step 5 and resuming in a fresh process state gives the same
/// parameters, bit for bit, after 5 more steps as an uninterrupted run.
fn resume_is_bit_exact<B: AutodiffBackend>(tag: &str) {
    let device = Default::default();
    let task = Task::new(2000);
    let config = model_config();
    B::seed(&device, 11);
    let start: Mamba2TimeSeries<B> = config.init(&device).unwrap();
    let ocfg = AdamWConfig { weight_decay: 0.05, max_grad_norm: Some(0.5), ..AdamWConfig::default() };
    let schedule = LrSchedule::WarmupCosine { peak: 5e-3, floor: 1e-4, warmup: 3, total: 10 };
    let run = |mut model: Mamba2TimeSeries<B>, optim: &mut AdamW<B>, steps: std::ops::Range<usize>| {
        for step in steps {
            let (x, y) = task.batch::<B>(step, &device);
            let grads = GradientsParams::from_grads(graph::backward(loss(&model, x, y)), &model);
            model = optim.step(schedule.lr_at(optim.steps()), model, grads).unwrap().0;
        }
        model
    };

    let mut straight_optim = AdamW::new(ocfg.clone(), &start).unwrap();
    let straight = run(start.clone(), &mut straight_optim, 0..10);

    let dir = std::env::temp_dir().join(format!("mamba2-optim-resume-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut first_optim = AdamW::new(ocfg.clone(), &start).unwrap();
    let half = run(start.clone(), &mut first_optim, 0..5);
    mamba2_model::save_checkpoint(&half, &config, &serde_json::json!({"step": 5}), &dir.join("model.ckpt")).unwrap();
    first_optim.save(&dir.join("optim.safetensors")).unwrap();
    drop((half, first_optim));

    let loaded =
        mamba2_model::load_checkpoint::<B, Mamba2TimeSeries<B>, TimeSeriesConfig>(&dir.join("model.ckpt"), &device, |c, d| c.init(d))
            .unwrap();
    let mut resumed_optim = AdamW::new(ocfg, &loaded.module).unwrap();
    resumed_optim.load(&dir.join("optim.safetensors"), &device).unwrap();
    assert_eq!(resumed_optim.steps(), 5);
    let resumed = run(loaded.module, &mut resumed_optim, 5..10);

    let (a, b) = (params_of(&straight), params_of(&resumed));
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{tag}: {name} differs after resuming");
    }
}

#[test]
fn resume_is_bit_exact_f64() {
    resume_is_bit_exact::<F64>("f64");
}

#[test]
fn resume_is_bit_exact_f32() {
    resume_is_bit_exact::<F32>("f32");
}

#[cfg(feature = "wgpu")]
#[test]
fn every_parameter_gets_a_gradient_and_moves_on_wgpu() {
    every_parameter_gets_a_gradient_and_moves::<Autodiff<burn_wgpu::Wgpu>>();
}

/// Fewer steps than on the host: each costs about a second on a software Vulkan device.
#[cfg(feature = "wgpu")]
#[test]
fn loss_falls_by_half_in_40_steps_on_wgpu() {
    loss_falls_within::<Autodiff<burn_wgpu::Wgpu>>("Wgpu f32", 40, 0.5);
}

/// The gradients of one pass of `model` on batch `k`, by parameter path; a missing one panics.
fn gradients_of<B: AutodiffBackend>(model: &Mamba2TimeSeries<B>, task: &Task, k: usize) -> Vec<(String, Vec<f64>)> {
    let device = Default::default();
    let (x, y) = task.batch::<B>(k, &device);
    let grads = GradientsParams::from_grads(graph::backward(loss(model, x, y)), model);
    let params = named_params(model);
    let count = params.len();
    params
        .into_iter()
        .map(|p| {
            let values = match p.dims.len() {
                1 => grads.get::<B::InnerBackend, 1>(p.id).map(to_f64_vec),
                2 => grads.get::<B::InnerBackend, 2>(p.id).map(to_f64_vec),
                _ => grads.get::<B::InnerBackend, 3>(p.id).map(to_f64_vec),
            };
            let values = values.unwrap_or_else(|| panic!("{} lost its gradient ({} of {count} present)", p.path, grads.len()));
            (p.path, values)
        })
        .collect()
}

/// Training on two threads at once (the data-parallel trainer's workers are threads): while
/// another thread trains an f64 model, the same f32 pass, repeated, gives every parameter its
/// gradient and the same gradient every time. Without `graph`'s recording and exclusive backward
/// Burn 0.21 lost a gradient within the first few passes in every one of five runs here.
#[test]
fn training_on_two_threads_keeps_every_gradient() {
    let device = Default::default();
    let task = Task::new(2000);
    F32::seed(&device, 11);
    let model: Mamba2TimeSeries<F32> = model_config().init(&device).unwrap();
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Tells the other thread to end when dropped, by a panic of this one too (the scope
    /// would otherwise wait for it forever).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stopped = AtomicBool::new(false);
    std::thread::scope(|s| {
        let other = s.spawn(|| {
            while !stopped.load(Ordering::Relaxed) {
                loss_falls_within::<F64>("the other thread", 40, 10.0);
            }
        });
        let stop = Stop(&stopped);
        let mut differ = Vec::new();
        for k in 0..4 {
            let first = gradients_of(&model, &task, k);
            for _ in 0..40 {
                let again = gradients_of(&model, &task, k);
                differ.extend(first.iter().zip(&again).filter(|(a, b)| a.1 != b.1).map(|(a, _)| format!("batch {k}: {}", a.0)));
            }
        }
        drop(stop);
        other.join().unwrap();
        assert!(differ.is_empty(), "gradients that changed between identical passes: {differ:?}");
    });
}
