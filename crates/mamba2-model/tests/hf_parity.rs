//! Parity with HF transformers (`Mamba2ForCausalLM`, torch path, f32) on random-init
//! checkpoints written by `tools/reference/hf_fixtures.py`: hidden states and logits within
//! 1e-4 absolute, every parameter gradient within 1e-3 relative.

use crate::common::*;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use mamba2_model::{hf_name, load_hf_lm, named_grads, ModelError};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};

/// One tensor of a safetensors file: name, dtype, shape and raw bytes.
type Entry = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// `[rows, cols]` row-major -> `[cols, rows]`.
fn transpose(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

fn check_case<B: AutodiffBackend>(case: &str, device: &B::Device) {
    let dir = fixture_dir(case);
    let (model, extras) = load_hf_lm::<B>(&dir, device).expect("fixture checkpoint loads");
    let io = std::fs::read(dir.join("io.safetensors")).unwrap();
    let (ids, ids_shape) = read_tensor(&io, "input_ids");
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.iter().map(|&v| v as i64).collect::<Vec<_>>(), ids_shape.clone()), device);
    let building = mamba2_tensor::graph::recording();
    let out = model.forward(ids, None).unwrap();
    drop(building);

    let (hidden_ref, _) = read_tensor(&io, "last_hidden_state");
    let (logits_ref, logits_shape) = read_tensor(&io, "logits");
    assert_eq!(logits_shape[2], extras.vocab_size);
    let dh = max_abs_diff(&to_f64_vec(out.hidden.clone()), &hidden_ref);
    let dl = max_abs_diff(&to_f64_vec(out.logits.clone()), &logits_ref);
    println!("{case}: hidden max |diff| {dh:.2e}, logits max |diff| {dl:.2e}");
    assert!(dh <= 1e-4, "{case}: hidden states differ by {dh:e}");
    assert!(dl <= 1e-4, "{case}: logits differ by {dl:e}");

    let (w, w_shape) = read_tensor(&io, "w_logits");
    let w = Tensor::<B, 3>::from_data(TensorData::new(w, w_shape).convert::<B::FloatElem>(), device);
    let loss = {
        let _building = mamba2_tensor::graph::recording();
        (out.logits * w).sum()
    };
    let grads = mamba2_tensor::graph::backward(loss);
    let mut checked = 0;
    for (path, grad) in named_grads(&model, &grads) {
        let (name, transposed) = hf_name(&path);
        let grad = to_f64_vec(grad.unwrap_or_else(|| panic!("{case}: no gradient reached {path}")));
        let (reference, shape) = read_tensor(&io, &format!("grad.{name}"));
        let reference = if transposed { transpose(&reference, shape[0], shape[1]) } else { reference };
        let diff = rel_diff(&grad, &reference);
        println!("{case}: grad {name}: relative difference {diff:.2e}");
        assert!(diff <= 1e-3, "{case}: gradient of {name} differs by {diff:e}");
        checked += 1;
    }
    let expected = std::fs::read(dir.join("io.safetensors"))
        .map(|b| safetensors::SafeTensors::deserialize(&b).unwrap().names().iter().filter(|n| n.starts_with("grad.")).count());
    assert_eq!(checked, expected.unwrap(), "{case}: every HF parameter gradient is compared");
}

#[test]
fn ngroups_1_matches_hf_transformers_in_f32() {
    check_case::<FlexF32Grad>("hf_g1", &Default::default());
}

#[test]
fn ngroups_2_with_bias_and_dt_limit_matches_hf_transformers_in_f32() {
    check_case::<FlexF32Grad>("hf_g2_bias", &Default::default());
}

#[test]
fn hf_checkpoints_also_load_in_f64() {
    // HF's scan runs in f32, so f64 agrees only to f32 rounding; the point is that the same
    // loader builds an f64 model.
    check_case::<NdF64Grad>("hf_g1", &Default::default());
}

#[cfg(feature = "cuda")]
#[test]
fn hf_parity_on_cuda() {
    check_case::<CudaF32Grad>("hf_g2_bias", &Default::default());
}

#[cfg(feature = "wgpu")]
#[test]
fn hf_parity_on_wgpu() {
    check_case::<WgpuF32Grad>("hf_g2_bias", &Default::default());
}

#[test]
fn bad_checkpoints_name_the_tensor() {
    use mamba2_model::lm_from_hf_bytes;
    use safetensors::tensor::{serialize, TensorView};
    let dir = fixture_dir("hf_g1");
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let device = Default::default();
    // Rewrites the file with `edit` applied to the list of (name, dtype, shape, data).
    let rewrite = |edit: &dyn Fn(&mut Vec<Entry>)| -> Vec<u8> {
        let mut items: Vec<_> =
            st.tensors().into_iter().map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
        edit(&mut items);
        let views: Vec<(String, TensorView)> =
            items.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
        serialize(views, None).unwrap()
    };

    let missing = rewrite(&|items| items.retain(|(n, ..)| n != "backbone.layers.1.mixer.A_log"));
    let err = lm_from_hf_bytes::<NdF64>(&config, &missing, "m", &device).unwrap_err();
    assert!(matches!(&err, ModelError::MissingTensor { name } if name == "backbone.layers.1.mixer.A_log"), "{err}");

    let extra = rewrite(&|items| items.push(("backbone.layers.9.mixer.D".into(), safetensors::Dtype::F32, vec![4], vec![0; 16])));
    let err = lm_from_hf_bytes::<NdF64>(&config, &extra, "m", &device).unwrap_err();
    assert!(matches!(&err, ModelError::UnexpectedTensor { name } if name == "backbone.layers.9.mixer.D"), "{err}");

    let wrong = rewrite(&|items| {
        let t = items.iter_mut().find(|(n, ..)| n == "backbone.layers.0.mixer.D").unwrap();
        t.2 = vec![2, 2];
    });
    let err = lm_from_hf_bytes::<NdF64>(&config, &wrong, "m", &device).unwrap_err();
    assert_eq!(err.to_string(), "checkpoint tensor `backbone.layers.0.mixer.D` has shape [2, 2], the config needs [4]");

    let err = lm_from_hf_bytes::<NdF64>(&config, &bytes[..bytes.len() / 2], "model.safetensors", &device).unwrap_err();
    assert!(matches!(err, ModelError::Safetensors { .. }), "{err}");

    let bad_config = config.replace("\"num_heads\": 4", "\"num_heads\": 5");
    let err = lm_from_hf_bytes::<NdF64>(&bad_config, &bytes, "m", &device).unwrap_err();
    assert!(matches!(err, ModelError::HfConfig { .. }), "{err}");
}

/// Loads a checkpoint folder written by `tools/reference/hf_checkpoint_forms.py` and compares
/// the hidden states and logits with HF's, within the tolerance of the parity tests above.
fn check_logits(case: &str) -> mamba2_model::Mamba2LM<FlexF32> {
    let dir = fixture_dir(case);
    let device = Default::default();
    let (model, extras) = load_hf_lm::<FlexF32>(&dir, &device).unwrap_or_else(|e| panic!("{case}: {e}"));
    let io = std::fs::read(dir.join("io.safetensors")).unwrap();
    let (ids, shape) = read_tensor(&io, "input_ids");
    let ids = Tensor::<FlexF32, 2, Int>::from_data(TensorData::new(ids.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape), &device);
    let out = model.forward(ids, None).unwrap();
    let (hidden_ref, _) = read_tensor(&io, "last_hidden_state");
    let (logits_ref, logits_shape) = read_tensor(&io, "logits");
    assert_eq!(logits_shape[2], extras.vocab_size, "{case}: vocabulary");
    let dh = max_abs_diff(&to_f64_vec(out.hidden), &hidden_ref);
    let dl = max_abs_diff(&to_f64_vec(out.logits), &logits_ref);
    println!("{case}: hidden max |diff| {dh:.2e}, logits max |diff| {dl:.2e}");
    assert!(dh <= 1e-4 && dl <= 1e-4, "{case}: hidden states differ by {dh:e}, logits by {dl:e}");
    model
}

/// An untied head is loaded as a weight of its own; with `tie_word_embeddings` absent from
/// config.json, HF's default (untied) is taken, as HF itself reads the file.
#[test]
fn an_untied_head_matches_hf_transformers() {
    let config = std::fs::read_to_string(fixture_dir("hf_untied").join("config.json")).unwrap();
    assert!(!config.contains("tie_word_embeddings"), "the fixture leaves the key out");
    let model = check_logits("hf_untied");
    assert!(model.lm_head.is_some(), "the head is a weight of its own");
}

/// Three shards listed in `model.safetensors.index.json` load as one checkpoint.
#[test]
fn a_sharded_checkpoint_matches_hf_transformers() {
    let dir = fixture_dir("hf_sharded");
    assert!(!dir.join("model.safetensors").exists());
    let shards =
        std::fs::read_dir(&dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("model-")).count();
    assert_eq!(shards, 3, "the fixture is split into 3 files");
    check_logits("hf_sharded");
}

/// bf16 weights are widened exactly into the backend's f32.
#[test]
fn a_bf16_checkpoint_matches_hf_transformers() {
    let bytes = std::fs::read(fixture_dir("hf_bf16").join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(st.tensors().iter().all(|(_, v)| v.dtype() == safetensors::Dtype::BF16), "the fixture is all bf16");
    check_logits("hf_bf16");
}

/// mamba_ssm's own config.json form, its tensor names and its padded vocabulary (45 -> 48).
#[test]
fn a_mamba_ssm_config_matches_hf_transformers() {
    let model = check_logits("mamba_ssm_cfg");
    assert_eq!(model.embeddings.weight.dims()[0], 48);
    assert!(model.lm_head.is_none(), "tie_embeddings is mamba_ssm's default");
}

/// A shard that the index names but that lacks a tensor, a shard outside the folder, and a
/// truncated shard are errors that name the file and the tensor.
#[test]
fn broken_shards_are_errors_naming_the_file() {
    let src = fixture_dir("hf_sharded");
    let tmp = std::env::temp_dir().join(format!("mamba2-shards-{}", std::process::id()));
    let copy = |to: &std::path::Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    let index_of = |dir: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap()
    };
    let device = Default::default();

    // The index sends a tensor to another shard than the one holding it: the holding shard
    // (read first) is named with the tensor.
    let moved = tmp.join("moved");
    copy(&moved);
    let mut index = index_of(&moved);
    let map = index["weight_map"].as_object_mut().unwrap();
    let (first_file, other_file) = {
        let mut files: Vec<String> = map.values().map(|v| v.as_str().unwrap().to_string()).collect();
        files.sort();
        files.dedup();
        (files[0].clone(), files[2].clone())
    };
    let tensor = map.iter().find(|(_, f)| f.as_str() == Some(first_file.as_str())).unwrap().0.clone();
    map.insert(tensor.clone(), other_file.clone().into());
    std::fs::write(moved.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let err = load_hf_lm::<FlexF32>(&moved, &device).unwrap_err().to_string();
    assert!(err.contains(&first_file) && err.contains(&tensor), "{err}");

    // The index lists a tensor that its shard lacks.
    let listed = tmp.join("listed");
    copy(&listed);
    let mut index = index_of(&listed);
    index["weight_map"]["backbone.layers.7.mixer.D"] = other_file.clone().into();
    std::fs::write(listed.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let err = load_hf_lm::<FlexF32>(&listed, &device).unwrap_err().to_string();
    assert!(err.contains(&other_file) && err.contains("backbone.layers.7.mixer.D"), "{err}");

    let outside = tmp.join("outside");
    copy(&outside);
    let mut index = index_of(&outside);
    index["weight_map"][&tensor] = "../elsewhere.safetensors".into();
    std::fs::write(outside.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let err = load_hf_lm::<FlexF32>(&outside, &device).unwrap_err().to_string();
    assert!(err.contains("../elsewhere.safetensors"), "{err}");

    let short = tmp.join("short");
    copy(&short);
    let path = short.join(&other_file);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
    let err = load_hf_lm::<FlexF32>(&short, &device).unwrap_err().to_string();
    assert!(err.contains(&other_file), "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}
