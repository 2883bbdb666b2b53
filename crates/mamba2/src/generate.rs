//! `mamba2 generate`: text from an HF Mamba-2 checkpoint and its tokenizer, printed token by
//! token. The prompt runs through the model's chunked scan once; each new token then costs one
//! step of the host streaming path (f32, with the weights in f32 or bf16).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use burn::backend::Flex;
use burn::prelude::*;
use clap::Args;
use mamba2_model::{load_hf_lm, Sampler, Sampling, StreamingLm};
use tokenizers::Tokenizer;

#[derive(Args, Clone)]
pub(crate) struct GenerateArgs {
    /// A directory holding an HF Mamba-2 checkpoint: config.json, model.safetensors (or shards
    /// listed in model.safetensors.index.json) and tokenizer.json.
    #[arg(long)]
    model: PathBuf,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// At most this many new tokens (fewer when the model ends the text).
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 picks the most likely token each time (greedy); above 0, tokens are sampled from the
    /// logits divided by it.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Sample among the k most likely tokens only (0: all); needs --temperature above 0.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample among the most likely tokens whose probabilities reach p (1: all); needs
    /// --temperature above 0.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Seed of the sampling: the same seed, settings and prompt give the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The tokenizer file (default: tokenizer.json in --model).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// After the text, print the new tokens' ids on one line.
    #[arg(long)]
    ids: bool,
    /// Decode with the weights stored in bf16 (f32 arithmetic): about half the bytes read per
    /// token, at the cost of rounding the weights (nothing lost for a bf16 checkpoint).
    #[arg(long)]
    bf16_weights: bool,
}

/// Prints the text of the tokens so far as it grows. A token can end inside a character (byte
/// level tokenizers split UTF-8): text that ends in a replacement character is held back until
/// a later token completes it, or until the end.
struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    printed: usize,
}

impl TextStream<'_> {
    fn push(&mut self, id: usize, out: &mut impl Write, last: bool) -> Result<()> {
        self.ids.push(id as u32);
        let text = self.tokenizer.decode(&self.ids, true).map_err(|e| anyhow!("decoding token {id}: {e}"))?;
        if (last || !text.ends_with('\u{fffd}')) && text.len() > self.printed && text.is_char_boundary(self.printed) {
            out.write_all(&text.as_bytes()[self.printed..])?;
            out.flush()?;
            self.printed = text.len();
        }
        Ok(())
    }
}

pub(crate) fn cmd_generate(a: GenerateArgs) -> Result<()> {
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p };
    if a.temperature == 0.0 && (a.top_k > 0 || a.top_p < 1.0) {
        bail!("--top-k and --top-p shape sampling, which needs --temperature above 0 (0 is greedy)");
    }
    let mut sampler = Sampler::new(sampling, a.seed).map_err(|e| anyhow!("--{e}"))?;
    if !a.model.is_dir() {
        bail!("--model {}: not a directory (an HF checkpoint's directory is wanted)", a.model.display());
    }
    let tok_path = a.tokenizer.clone().unwrap_or_else(|| a.model.join("tokenizer.json"));
    if !tok_path.is_file() {
        bail!("{}: no tokenizer there (give one with --tokenizer)", tok_path.display());
    }
    let tokenizer = Tokenizer::from_file(&tok_path)
        .map_err(|e| anyhow!("{}: not a tokenizer the tokenizers library reads: {e}", tok_path.display()))?;

    let device = Default::default();
    let (lm, extras) = load_hf_lm::<Flex>(&a.model, &device).with_context(|| format!("loading the checkpoint in {}", a.model.display()))?;
    let stop = extras.eos_token_ids;
    let host = StreamingLm::<f32>::new(&lm);
    let host = if a.bf16_weights { host.with_bf16_weights() } else { host };
    let vocab = host.vocab_size();
    let prompt: Vec<usize> = tokenizer
        .encode(a.prompt.as_str(), true)
        .map_err(|e| anyhow!("encoding the prompt: {e}"))?
        .get_ids()
        .iter()
        .map(|&i| i as usize)
        .collect();
    if prompt.is_empty() {
        bail!("the prompt {:?} encodes to no tokens", a.prompt);
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t >= vocab) {
        bail!(
            "the tokenizer gives token id {bad}, outside the model's vocabulary of {vocab}: {} does not belong to this checkpoint",
            tok_path.display()
        );
    }

    let started = Instant::now();
    let ids =
        Tensor::<Flex, 1, Int>::from_data(TensorData::new(prompt.iter().map(|&t| t as i64).collect::<Vec<_>>(), [prompt.len()]), &device);
    let out = lm.forward(ids.reshape([1, prompt.len()]), None)?;
    let last = out.logits.narrow(1, prompt.len() - 1, 1).reshape([vocab]);
    let mut state = host.state_from(&out.state, last)?;
    drop(lm);
    let prefill = started.elapsed();

    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    let mut text = TextStream { tokenizer: &tokenizer, ids: Vec::new(), printed: 0 };
    let mut failed = None;
    let started = Instant::now();
    let n_max = a.max_new_tokens;
    let mut count = 0;
    let new = host.generate(&mut state, n_max, &mut sampler, &stop, |id| {
        count += 1;
        let last = count == n_max || stop.contains(&id);
        match text.push(id, &mut stdout, last) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })?;
    let decode = started.elapsed();
    if let Some(e) = failed {
        return Err(e);
    }
    writeln!(stdout)?;
    if a.ids {
        writeln!(stdout, "{}", new.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" "))?;
    }
    // The first new token comes from the prompt's pass; the decode time holds the steps that
    // made the others (with their sampling and printing), so those are what the rate counts.
    let steps = new.len().saturating_sub(1);
    let rate = if steps > 0 && decode.as_secs_f64() > 0.0 { format!("{:.1}", steps as f64 / decode.as_secs_f64()) } else { "-".into() };
    eprintln!(
        "{} new tokens in {:.2} s ({} tokens/s after the first, which comes with the prompt); prompt {} tokens in {:.2} s",
        new.len(),
        decode.as_secs_f64(),
        rate,
        prompt.len(),
        prefill.as_secs_f64()
    );
    Ok(())
}
