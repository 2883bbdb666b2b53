//! Text generation on the host streaming path: [`StreamingLm`] holds an LM's embedding, its
//! stack as a [`StreamingStack`] and its head as plain arrays, and turns one token into the next
//! token's logits with no tensors and no allocation per token. Decoding at batch 1 reads every
//! weight once per token, so it runs at the speed of memory, which this path reaches.
//!
//! The prompt can go through the tensor model's chunked scan first ([`Mamba2LM::forward`], much
//! faster over long prompts), its state then copied over with [`StreamingLm::state_from`].

use burn::prelude::*;
use mamba2_cpu::{Linear, StreamingState};

use crate::bridge::HostFloat;
use crate::sampling::Sampler;
use crate::stream::host;
use crate::{Mamba2LM, Mamba2State, ModelError, StreamingStack};

/// A [`Mamba2LM`]'s weights on the host, for [`StreamingLm::step`].
#[derive(Debug, Clone)]
pub struct StreamingLm<T: HostFloat> {
    stack: StreamingStack<T>,
    /// `[vocab_size, d_model]`, row-major.
    embeddings: Vec<T>,
    /// `[d_model, vocab_size]`: the embedding transposed when the head is tied.
    head: Linear<T>,
}

/// Generation's scratch space and recurrent state, for one sequence.
#[derive(Debug, Clone)]
pub struct LmState<T: HostFloat> {
    /// The stack's state.
    pub stack: StreamingState<T>,
    hidden: Vec<T>,
    /// The logits after the last token fed, `[vocab_size]`.
    pub logits: Vec<T>,
}

impl<T: HostFloat> StreamingLm<T> {
    /// Copies the model's weights to the host.
    pub fn new<B: Backend>(lm: &Mamba2LM<B>) -> Self {
        let [vocab, d] = lm.embeddings.weight.dims();
        let embeddings: Vec<T> = host(lm.embeddings.weight.val());
        let head = match &lm.lm_head {
            Some(head) => host(head.weight.val()),
            None => host(lm.embeddings.weight.val().transpose()),
        };
        Self { stack: StreamingStack::new(&lm.backbone), embeddings, head: Linear::new(head, d, vocab, None) }
    }

    /// The same model with the stack's projections and the head stored in bf16 (see
    /// [`StreamingStack::with_bf16_weights`]): about half the bytes per token.
    pub fn with_bf16_weights(self) -> Self {
        Self { stack: self.stack.with_bf16_weights(), head: self.head.into_bf16(), embeddings: self.embeddings }
    }

    /// Rows of the embedding: the token ids this model reads are `0..vocab_size`.
    pub fn vocab_size(&self) -> usize {
        self.head.d_out()
    }

    /// The stack on the host.
    pub fn stack(&self) -> &StreamingStack<T> {
        &self.stack
    }

    /// A state before any token (with the stack's helper thread where its weights call for one).
    pub fn zero_state(&self) -> LmState<T> {
        let d = self.stack.config().d_model;
        LmState { stack: self.stack.zero_state(1), hidden: vec![T::zero(); d], logits: vec![T::zero(); self.vocab_size()] }
    }

    /// The state of the tensor model after a prompt (`forward`'s, batch 1), with the logits of the
    /// prompt's last position (`[vocab_size]`).
    ///
    /// # Errors
    /// [`ModelError::State`] when the state is not one sequence of this model, or the logits not
    /// one row of its vocabulary.
    pub fn state_from<B: Backend>(&self, state: &Mamba2State<B>, last_logits: Tensor<B, 1>) -> Result<LmState<T>, ModelError> {
        if state.batch() != 1 {
            return Err(ModelError::State { why: format!("generation runs one sequence, the state holds {}", state.batch()) });
        }
        let mut out = self.zero_state();
        out.stack = self.stack.state_from(state)?.with_helper(out.stack.has_helper());
        let logits: Vec<T> = host(last_logits);
        if logits.len() != out.logits.len() {
            return Err(ModelError::State { why: format!("{} logits for a vocabulary of {}", logits.len(), out.logits.len()) });
        }
        out.logits = logits;
        Ok(out)
    }

    /// Feeds one token: advances the state and leaves the next token's logits in `state.logits`.
    ///
    /// # Errors
    /// [`ModelError::State`] when `token` is not below [`vocab_size`](Self::vocab_size).
    pub fn step(&self, state: &mut LmState<T>, token: usize) -> Result<(), ModelError> {
        let d = self.stack.config().d_model;
        if token >= self.vocab_size() {
            return Err(ModelError::State { why: format!("token id {token} is outside the vocabulary of {}", self.vocab_size()) });
        }
        let LmState { stack, hidden, logits } = state;
        self.stack.step(stack, &self.embeddings[token * d..(token + 1) * d], hidden)?;
        self.head.apply(stack, hidden, logits);
        Ok(())
    }

    /// Feeds a prompt token by token (for short prompts; a long one is faster through the tensor
    /// model and [`state_from`](Self::state_from)).
    ///
    /// # Errors
    /// What [`step`](Self::step) returns.
    pub fn prefill(&self, state: &mut LmState<T>, tokens: &[usize]) -> Result<(), ModelError> {
        tokens.iter().try_for_each(|&t| self.step(state, t))
    }

    /// Generates up to `max_new` tokens after the ones `state` has read (its `logits` are those
    /// after the last of them): each token is chosen by `sampler`, handed to `on_token`, and fed
    /// back. Stops after `max_new` tokens, after a token in `stop`, or when `on_token` returns
    /// `false`. Returns the tokens generated; the last of them has not been fed (step it to go
    /// on from there).
    ///
    /// # Errors
    /// What [`step`](Self::step) returns.
    pub fn generate(
        &self,
        state: &mut LmState<T>,
        max_new: usize,
        sampler: &mut Sampler,
        stop: &[usize],
        mut on_token: impl FnMut(usize) -> bool,
    ) -> Result<Vec<usize>, ModelError> {
        let mut out = Vec::with_capacity(max_new);
        while out.len() < max_new {
            let next = sampler.sample(&state.logits);
            out.push(next);
            let go_on = on_token(next);
            if !go_on || stop.contains(&next) || out.len() == max_new {
                break;
            }
            self.step(state, next)?;
        }
        Ok(out)
    }
}
