//! Parity with an independent reference: the paper's `ssd_minimal` listing in PyTorch (f64),
//! written by `tools/reference/ssd_fixtures.py` into `tests/fixtures/ssd_minimal.*`.

use std::path::PathBuf;

use crate::common::*;
use burn::tensor::backend::AutodiffBackend;
use mamba2_ssd::{ssd_chunked, ssd_sequential, Skip, SsdInput};
use mamba2_tensor::compare::{rel_diff, to_f64_vec};
use safetensors::SafeTensors;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

struct Fixture {
    bytes: Vec<u8>,
    meta: serde_json::Value,
}

impl Fixture {
    fn load() -> Self {
        let dir = fixture_dir();
        let bytes = std::fs::read(dir.join("ssd_minimal.safetensors")).expect("fixture present");
        let meta = serde_json::from_str(&std::fs::read_to_string(dir.join("ssd_minimal.json")).unwrap()).unwrap();
        Self { bytes, meta }
    }

    fn array(&self, key: &str) -> Array {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let view = st.tensor(key).unwrap_or_else(|_| panic!("fixture lacks {key}"));
        assert_eq!(view.dtype(), safetensors::Dtype::F64, "{key} must be f64");
        let values = view.data().chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect();
        Array { values, shape: view.shape().to_vec() }
    }
}

fn check_against_fixture<B: AutodiffBackend>(device: &B::Device, tol: f64) {
    let fx = Fixture::load();
    let cases = fx.meta["cases"].as_array().expect("cases").clone();
    assert!(cases.len() >= 4);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let q = case["chunk_size"].as_u64().unwrap() as usize;
        let get = |k: &str| fx.array(&format!("{name}.{k}"));
        let d_kind = case["d"].as_str();
        let leaf4 = |k: &str| get(k).tensor::<B, 4>(device).require_grad();
        let (x, b, c, init) = (leaf4("x"), leaf4("b"), leaf4("c"), leaf4("initial_state"));
        let dt = get("dt").tensor::<B, 3>(device).require_grad();
        let a = get("a").tensor::<B, 1>(device).require_grad();
        let d = match d_kind {
            Some("head") => Some(Skip::PerHead(get("d").tensor::<B, 1>(device).require_grad())),
            Some("channel") => Some(Skip::PerChannel(get("d").tensor::<B, 2>(device).require_grad())),
            _ => None,
        };
        let input = SsdInput {
            x: x.clone(),
            dt: dt.clone(),
            a: a.clone(),
            b: b.clone(),
            c: c.clone(),
            d: d.clone(),
            initial_state: Some(init.clone()),
        };
        let w_y = get("w_y").tensor::<B, 4>(device);
        let w_state = get("w_state").tensor::<B, 4>(device);

        // Both scans are built before either backward, so the recording covers both.
        let building = mamba2_tensor::graph::recording();
        let outs = [("chunked", ssd_chunked(input.clone(), q).unwrap()), ("sequential", ssd_sequential(input.clone()).unwrap())];
        drop(building);
        for (algo, out) in outs {
            let y_diff = rel_diff(&to_f64_vec(out.y.clone()), &get("y").values);
            let s_diff = rel_diff(&to_f64_vec(out.final_state.clone()), &get("final_state").values);
            println!("{name} {algo}: y {y_diff:e}, final state {s_diff:e}");
            assert!(y_diff <= tol && s_diff <= tol, "{name} {algo}: y {y_diff:e}, state {s_diff:e} > {tol:e}");

            let loss = {
                let _building = mamba2_tensor::graph::recording();
                (out.y * w_y.clone()).sum() + (out.final_state * w_state.clone()).sum()
            };
            let grads = mamba2_tensor::graph::backward(loss);
            let mut got: Vec<(&str, Vec<f64>)> = vec![
                ("x", to_f64_vec(x.grad(&grads).unwrap())),
                ("dt", to_f64_vec(dt.grad(&grads).unwrap())),
                ("a", to_f64_vec(a.grad(&grads).unwrap())),
                ("b", to_f64_vec(b.grad(&grads).unwrap())),
                ("c", to_f64_vec(c.grad(&grads).unwrap())),
                ("initial_state", to_f64_vec(init.grad(&grads).unwrap())),
            ];
            match &d {
                Some(Skip::PerHead(t)) => got.push(("d", to_f64_vec(t.grad(&grads).unwrap()))),
                Some(Skip::PerChannel(t)) => got.push(("d", to_f64_vec(t.grad(&grads).unwrap()))),
                None => {}
            }
            for (k, g) in got {
                let diff = rel_diff(&g, &get(&format!("grad.{k}")).values);
                println!("{name} {algo}: grad {k} {diff:e}");
                assert!(diff <= tol, "{name} {algo}: gradient of {k} differs by {diff:e} > {tol:e}");
            }
        }
    }
}

#[test]
fn matches_the_ssd_minimal_reference_in_f64() {
    check_against_fixture::<NdF64Grad>(&Default::default(), 1e-10);
}

#[cfg(feature = "cuda")]
#[test]
fn matches_the_ssd_minimal_reference_on_cuda() {
    check_against_fixture::<CudaF32Grad>(&Default::default(), 1e-4);
}

#[cfg(feature = "wgpu")]
#[test]
fn matches_the_ssd_minimal_reference_on_wgpu() {
    check_against_fixture::<WgpuF32Grad>(&Default::default(), 1e-4);
}
