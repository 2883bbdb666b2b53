//! Text generation against HF transformers' greedy `generate` (`tools/reference/hf_generate.py`:
//! a tiny random model and the prompt's ids): the host streaming path, after a prefill by the
//! chunked scan or token by token, and the tensor model's own greedy loop all produce HF's
//! tokens. HF's best logit leads the second by at least the fixture's `min_logit_margin`
//! (0.036) at every step, far above f32 rounding (1e-6 here), so equal tokens are the property
//! and not luck.

use crate::common::*;
use burn::prelude::*;
use mamba2_model::{load_hf_lm, Sampler, Sampling, StreamingLm};

struct Expected {
    prompt: Vec<usize>,
    new: Vec<usize>,
    max_new: usize,
    eos: usize,
}

fn expected() -> Expected {
    let text = std::fs::read_to_string(fixture_dir("hf_generate").join("generate.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |k: &str| v[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect::<Vec<_>>();
    assert!(v["min_logit_margin"].as_f64().unwrap() > 1e-3, "the fixture's margins leave room for rounding");
    Expected {
        prompt: ids("prompt_ids"),
        new: ids("new_ids"),
        max_new: v["max_new_tokens"].as_u64().unwrap() as usize,
        eos: v["eos_token_id"].as_u64().unwrap() as usize,
    }
}

#[test]
fn greedy_generation_matches_hf_transformers() {
    let want = expected();
    let device = Default::default();
    let (lm, extras) = load_hf_lm::<FlexF32>(&fixture_dir("hf_generate"), &device).unwrap();
    assert_eq!(extras.eos_token_ids, [want.eos], "generation_config.json's eos_token_id");
    let host = StreamingLm::<f32>::new(&lm);
    let greedy = || Sampler::new(Sampling::greedy(), 0).unwrap();

    // Prefill by the chunked scan, then host steps.
    let ids = Tensor::<FlexF32, 1, Int>::from_data(
        TensorData::new(want.prompt.iter().map(|&t| t as i64).collect::<Vec<_>>(), [want.prompt.len()]),
        &device,
    )
    .reshape([1, want.prompt.len()]);
    let out = lm.forward(ids.clone(), None).unwrap();
    let last = out.logits.narrow(1, want.prompt.len() - 1, 1).reshape([host.vocab_size()]);
    let mut state = host.state_from(&out.state, last).unwrap();
    let mut seen = Vec::new();
    let got = host
        .generate(&mut state, want.max_new, &mut greedy(), &[want.eos], |t| {
            seen.push(t);
            true
        })
        .unwrap();
    assert_eq!(got, want.new, "host path after a chunked prefill");
    assert_eq!(seen, got, "every token is handed out as it is made");

    // The prompt fed token by token.
    let mut state = host.zero_state();
    host.prefill(&mut state, &want.prompt).unwrap();
    let got = host.generate(&mut state, want.max_new, &mut greedy(), &[want.eos], |_| true).unwrap();
    assert_eq!(got, want.new, "host path with a token-by-token prefill");

    // The tensor model's loop (no stop token there: the fixture has none among its tokens).
    assert!(!want.new.contains(&want.eos));
    let got = lm.generate_greedy(ids, want.max_new).unwrap();
    assert_eq!(got[0].iter().map(|&t| t as usize).collect::<Vec<_>>(), want.new, "tensor path");

    // A stop token ends generation after it; `on_token` returning false ends it too.
    let mut state = host.zero_state();
    host.prefill(&mut state, &want.prompt).unwrap();
    let got = host.generate(&mut state, want.max_new, &mut greedy(), &[want.new[3]], |_| true).unwrap();
    assert_eq!(got, want.new[..4]);
    let mut state = host.zero_state();
    host.prefill(&mut state, &want.prompt).unwrap();
    let got = host.generate(&mut state, want.max_new, &mut greedy(), &[], |_| false).unwrap();
    assert_eq!(got, want.new[..1]);
}

/// A token outside the vocabulary is an error naming it, not a panic.
#[test]
fn a_token_outside_the_vocabulary_is_an_error() {
    let device = Default::default();
    let (lm, _) = load_hf_lm::<FlexF32>(&fixture_dir("hf_generate"), &device).unwrap();
    let host = StreamingLm::<f32>::new(&lm);
    let mut state = host.zero_state();
    let e = host.step(&mut state, 300).unwrap_err().to_string();
    assert!(e.contains("token id 300 is outside the vocabulary of 300"), "{e}");
}

/// bf16 weights on the streaming path: for a checkpoint stored in bf16 nothing is lost (the
/// logits equal the f32 copy's, 1e-6), and for an f32 one the logits move by the weights'
/// rounding only (within 5 % of their spread here) while the state still advances.
#[test]
fn bf16_weights_lose_nothing_on_a_bf16_checkpoint() {
    let device = Default::default();
    for (case, exact) in [("hf_bf16", true), ("hf_generate", false)] {
        let (lm, _) = load_hf_lm::<FlexF32>(&fixture_dir(case), &device).unwrap();
        let full = StreamingLm::<f32>::new(&lm);
        let half = full.clone().with_bf16_weights();
        let (mut a, mut b) = (full.zero_state(), half.zero_state());
        let (mut worst, mut spread) = (0.0f32, 0.0f32);
        for t in 0..12 {
            let token = (t * 7 + 3) % full.vocab_size();
            full.step(&mut a, token).unwrap();
            half.step(&mut b, token).unwrap();
            let (lo, hi) = a.logits.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            spread = spread.max(hi - lo);
            worst = a.logits.iter().zip(&b.logits).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
        }
        println!("{case}: bf16 weights move the logits by at most {worst:.2e} (spread {spread:.2})");
        if exact {
            assert!(worst <= 1e-6, "{case}: {worst:e}");
        } else {
            assert!(worst > 0.0 && worst < 0.05 * spread, "{case}: {worst:e} of {spread}");
        }
    }
}
