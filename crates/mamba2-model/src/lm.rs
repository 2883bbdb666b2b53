use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::Distribution;

use crate::{Mamba2Config, Mamba2Stack, Mamba2State, ModelError};

/// A Mamba-2 language model.
#[derive(Config, Debug, PartialEq)]
pub struct LmConfig {
    /// The stack.
    pub backbone: Mamba2Config,
    /// Rows of the embedding.
    pub vocab_size: usize,
    /// The LM head is the embedding itself (`logits = h E^T`); else it is a weight of its own.
    #[config(default = true)]
    pub tie_word_embeddings: bool,
}

/// Embedding, stack, and an LM head, as HF's `Mamba2ForCausalLM`: tied to the embedding
/// (`logits = h E^T`) or, without `tie_word_embeddings`, a `Linear(d_model -> vocab_size)`
/// without bias of its own.
#[derive(Module, Debug)]
pub struct Mamba2LM<B: Backend> {
    /// `[vocab_size, d_model]`.
    pub embeddings: Embedding<B>,
    /// The stack.
    pub backbone: Mamba2Stack<B>,
    /// The untied head (`lm_head.weight` in a checkpoint, `[d_model, vocab_size]` here as Burn's
    /// Linear stores it); `None` when the head is the embedding.
    pub lm_head: Option<Linear<B>>,
}

impl LmConfig {
    /// A model with mamba_ssm's initialisation (embedding `N(0, 0.02^2)`).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Mamba2LM<B>, ModelError> {
        if self.vocab_size == 0 {
            return Err(crate::ConfigError::Zero { name: "vocab_size" }.into());
        }
        let d = self.backbone.d_model;
        let weight = Tensor::random([self.vocab_size, d], Distribution::Normal(0.0, 0.02), device);
        // HF initialises an untied head as every Linear: N(0, initializer_range^2) there; the
        // embedding's 0.02 here, a common choice, since training from scratch is not this
        // type's purpose.
        let lm_head = (!self.tie_word_embeddings).then(|| Linear {
            weight: Param::from_tensor(Tensor::random([d, self.vocab_size], Distribution::Normal(0.0, 0.02), device)),
            bias: None,
        });
        Ok(Mamba2LM {
            embeddings: Embedding { weight: Param::from_tensor(weight) },
            backbone: Mamba2Stack::init(&self.backbone, device)?,
            lm_head,
        })
    }
}

/// What one LM forward returns.
#[derive(Debug, Clone)]
pub struct LmOutput<B: Backend> {
    /// `[batch, L, vocab_size]`.
    pub logits: Tensor<B, 3>,
    /// The final-normed hidden states, `[batch, L, d_model]`.
    pub hidden: Tensor<B, 3>,
    /// The state after the last token.
    pub state: Mamba2State<B>,
}

impl<B: Backend> Mamba2LM<B> {
    /// The stack's config.
    pub fn config(&self) -> &Mamba2Config {
        self.backbone.config()
    }

    /// Logits from final-normed hidden states `[..., d_model]`.
    fn logits<const D: usize>(&self, h: Tensor<B, D>) -> Tensor<B, D> {
        let w = match &self.lm_head {
            Some(head) => head.weight.val(),
            None => self.embeddings.weight.val().transpose(),
        };
        let dims = h.dims();
        let d = dims[D - 1];
        let rows = dims[..D - 1].iter().product::<usize>();
        let mut out = dims;
        out[D - 1] = w.dims()[1];
        h.reshape([rows, d]).matmul(w).reshape(out)
    }

    /// Logits for every position, continuing from `state`.
    ///
    /// # Shapes
    /// - `ids`: `[batch, L]`; logits `[batch, L, vocab_size]`
    pub fn forward(&self, ids: Tensor<B, 2, Int>, state: Option<Mamba2State<B>>) -> Result<LmOutput<B>, ModelError> {
        self.forward_embeds(self.embeddings.forward(ids), state)
    }

    /// Logits for every position of input embeddings (HF's `inputs_embeds`), continuing from
    /// `state`: [`forward`](Self::forward) without the embedding lookup, for inputs that are not
    /// token ids (soft prompts, another model's vectors).
    ///
    /// # Shapes
    /// - `embeds`: `[batch, L, d_model]`; logits `[batch, L, vocab_size]`
    pub fn forward_embeds(&self, embeds: Tensor<B, 3>, state: Option<Mamba2State<B>>) -> Result<LmOutput<B>, ModelError> {
        let (hidden, state) = self.backbone.forward(embeds, state)?;
        Ok(LmOutput { logits: self.logits(hidden.clone()), hidden, state })
    }

    /// Greedy decoding: runs the prompt once, then `n_new` steps of the recurrence, each feeding
    /// back the most likely token. Returns only the new tokens, per batch row.
    ///
    /// # Shapes
    /// - `prompt`: `[batch, L]` with `L >= 1`
    pub fn generate_greedy(&self, prompt: Tensor<B, 2, Int>, n_new: usize) -> Result<Vec<Vec<i64>>, ModelError> {
        let [batch, len] = prompt.dims();
        let out = self.forward(prompt, None)?;
        let mut state = out.state;
        let mut next = out.logits.narrow(1, len - 1, 1).reshape([batch, self.embeddings.weight.dims()[0]]).argmax(1);
        let mut tokens = vec![Vec::with_capacity(n_new); batch];
        for i in 0..n_new {
            let ids: Vec<i64> = next.clone().into_data().convert::<i64>().to_vec().expect("int data");
            for (row, id) in tokens.iter_mut().zip(&ids) {
                row.push(*id);
            }
            if i + 1 == n_new {
                break;
            }
            let emb = self.embeddings.forward(next.reshape([batch, 1])).reshape([batch, self.config().d_model]);
            let (h, s) = self.backbone.step(emb, state)?;
            state = s;
            next = self.logits(h).argmax(1);
        }
        Ok(tokens)
    }
}
