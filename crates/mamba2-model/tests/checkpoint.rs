//! Our own checkpoints round-trip exactly and reject damaged files with a typed error.

use crate::common::*;
use mamba2_model::{load_checkpoint, read_checkpoint_header, save_checkpoint, Mamba2TimeSeries, ModelError, TimeSeriesConfig};
use mamba2_tensor::compare::to_f64_vec;

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mamba2-model-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn load(path: &std::path::Path) -> Result<mamba2_model::Loaded<Mamba2TimeSeries<NdF64>, TimeSeriesConfig>, ModelError> {
    load_checkpoint::<NdF64, _, TimeSeriesConfig>(path, &Default::default(), |c, d| c.init(d))
}

#[test]
fn round_trip_is_bit_exact_with_config_and_meta() {
    let device = Default::default();
    let config = tiny_ts(2);
    let model: Mamba2TimeSeries<NdF64> = config.init(&device).unwrap();
    let path = tmpdir("roundtrip").join("model.ckpt");
    let meta = serde_json::json!({"step": 42, "scaler": {"mean": [1.5, -2.0], "std": [0.5, 3.0]}});
    save_checkpoint(&model, &config, &meta, &path).unwrap();
    let loaded = load(&path).unwrap();
    assert_eq!(loaded.config, config);
    assert_eq!(loaded.meta, meta);
    let x = wave::<NdF64>(2, 7, 3, &device);
    let (a, _) = model.forward(x.clone(), None).unwrap();
    let (b, _) = loaded.module.forward(x, None).unwrap();
    assert_eq!(to_f64_vec(a), to_f64_vec(b), "outputs after a round trip are bit-identical");
    let (c, m): (TimeSeriesConfig, serde_json::Value) = read_checkpoint_header(&path).unwrap();
    assert_eq!((c, m), (config, meta));
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file is left behind");
}

#[test]
fn damaged_files_are_typed_errors() {
    let device = Default::default();
    let config = tiny_ts(1);
    let model: Mamba2TimeSeries<NdF64> = config.init(&device).unwrap();
    let dir = tmpdir("damaged");
    let path = dir.join("model.ckpt");
    save_checkpoint(&model, &config, &serde_json::json!({}), &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", bytes[..bytes.len() - 100].to_vec(), "truncated checkpoint"),
        (
            "flipped",
            {
                let mut b = bytes.clone();
                let n = b.len() - 10;
                b[n] ^= 0xff;
                b
            },
            "checksum mismatch",
        ),
        ("not ours", b"hello world, this is not a checkpoint".to_vec(), "bad magic"),
        ("empty", Vec::new(), "bad magic"),
    ];
    for (name, content, expected) in cases {
        let p = dir.join(format!("{}.ckpt", name.replace(' ', "_")));
        std::fs::write(&p, content).unwrap();
        let err = load(&p).unwrap_err();
        assert!(matches!(err, ModelError::Checkpoint { .. }), "{name}: {err}");
        assert!(err.to_string().contains(expected), "{name}: {err}");
    }
    let err = load(&dir.join("absent.ckpt")).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }), "{err}");
}
