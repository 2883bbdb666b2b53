//! Loading a large checkpoint needs little more memory than its weights: a 1 GB-class f32
//! checkpoint (random weights, written here piece by piece) loads with a peak resident size under
//! 1.5 times the file's size. The load runs in a child process (this test binary, running only
//! [`child_loads_the_checkpoint`]), since the other tests of the binary share this process's
//! memory.

use std::io::Write;
use std::path::Path;

use crate::common::FlexF32;
use mamba2_model::load_hf_lm;
use mamba2_tensor::rng::SplitMix64;

const DIR_VAR: &str = "MAMBA2_LOAD_MEMORY_DIR";

/// d_model 1024, 34 layers, vocabulary 32768: 254 M weights, 1.02 GB in f32.
const CONFIG: &str = r#"{"hidden_size": 1024, "num_heads": 32, "head_dim": 64, "expand": 2, "state_size": 64, "n_groups": 1,
    "conv_kernel": 4, "chunk_size": 256, "num_hidden_layers": 34, "vocab_size": 32768, "tie_word_embeddings": true}"#;

/// The checkpoint's tensors, in file order.
fn tensors() -> Vec<(String, Vec<usize>)> {
    let (d, di, h, n, v) = (1024, 2048, 32, 64, 32768);
    let conv = di + 2 * n;
    let mut t = vec![("backbone.embeddings.weight".to_string(), vec![v, d])];
    for i in 0..34 {
        let p = format!("backbone.layers.{i}");
        t.push((format!("{p}.norm.weight"), vec![d]));
        t.push((format!("{p}.mixer.in_proj.weight"), vec![2 * di + 2 * n + h, d]));
        t.push((format!("{p}.mixer.conv1d.weight"), vec![conv, 1, 4]));
        t.push((format!("{p}.mixer.conv1d.bias"), vec![conv]));
        for name in ["dt_bias", "A_log", "D"] {
            t.push((format!("{p}.mixer.{name}"), vec![h]));
        }
        t.push((format!("{p}.mixer.norm.weight"), vec![di]));
        t.push((format!("{p}.mixer.out_proj.weight"), vec![d, di]));
    }
    t.push(("backbone.norm_f.weight".to_string(), vec![d]));
    t
}

/// Writes `config.json` and an f32 `model.safetensors` of [`tensors`] into `dir` without
/// holding the weights: each tensor is a repeated block of random values, the block's first
/// value at every tensor's start. Returns the file's size and that first value.
fn write_checkpoint(dir: &Path) -> (u64, f32) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let mut rng = SplitMix64::new(7);
    let block: Vec<u8> = (0..1 << 18).flat_map(|_| (rng.uniform(-0.02, 0.02) as f32).to_le_bytes()).collect();
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    for (name, shape) in tensors() {
        let bytes = 4 * shape.iter().product::<usize>();
        header.insert(name, serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + bytes]}));
        at += bytes;
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("model.safetensors")).unwrap());
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&header).unwrap();
    for (_, shape) in tensors() {
        let mut left = 4 * shape.iter().product::<usize>();
        while left > 0 {
            let n = left.min(block.len());
            f.write_all(&block[..n]).unwrap();
            left -= n;
        }
    }
    f.flush().unwrap();
    let len = std::fs::metadata(dir.join("model.safetensors")).unwrap().len();
    (len, f32::from_le_bytes(block[..4].try_into().unwrap()))
}

/// The process's peak resident size in bytes (Linux: `VmHWM` of /proc/self/status).
fn peak_resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
#[cfg(target_os = "linux")]
fn a_1gb_checkpoint_loads_in_under_1_5x_its_size() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("load-memory-{}", std::process::id()));
    let (size, first) = write_checkpoint(&dir);
    assert!(size > 1_000_000_000, "the checkpoint is 1 GB-class: {size} bytes");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "load_memory::child_loads_the_checkpoint", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(DIR_VAR, &dir)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let field = |key: &str| -> f64 {
        let at = stdout.find(key).unwrap_or_else(|| panic!("no {key} in the child's output:\n{stdout}"));
        stdout[at + key.len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    let (peak, loaded_first) = (field("peak_bytes="), field("first_bits="));
    println!("file {size} bytes, peak resident {peak} bytes ({:.2}x)", peak / size as f64);
    assert_eq!(f32::from_bits(loaded_first as u32), first, "the first weight is read back");
    assert!(peak < 1.5 * size as f64, "loading peaked at {peak} bytes, {:.2}x the file's {size}", peak / size as f64);
}

/// Run only by [`a_1gb_checkpoint_loads_in_under_1_5x_its_size`], in a process of its own.
#[test]
#[ignore = "run in a child process by a_1gb_checkpoint_loads_in_under_1_5x_its_size"]
fn child_loads_the_checkpoint() {
    let dir = std::env::var(DIR_VAR).expect("set by the parent test");
    let (model, _) = load_hf_lm::<FlexF32>(Path::new(&dir), &Default::default()).unwrap();
    // Read before the weight is copied out below: the peak is the load's.
    let peak = peak_resident();
    let first = model.embeddings.weight.val().slice([0..1, 0..1]).into_data().to_vec::<f32>().unwrap()[0];
    println!("peak_bytes={peak} first_bits={}", first.to_bits());
}
