"""Writes tests/fixtures/hf_generate/: a tiny Mamba-2 language model with a tiny tokenizer, and
what HF transformers' greedy `generate` makes of a prompt with them.

- tokenizer.json: a byte-level BPE (GPT-2's and GPT-NeoX's kind, as Mamba checkpoints ship)
  trained by the `tokenizers` library on a few sentences, 300 tokens, `<|endoftext|>` first;
- config.json, model.safetensors: a random-init `Mamba2ForCausalLM` (tied head, float32,
  parameters moved away from their init), saved by `save_pretrained`;
- generate.json: the prompt, its ids, the ids greedy `generate` adds (`max_new_tokens` of them,
  or fewer when it produces `eos_token_id`), their text as the tokenizer decodes it, and the
  smallest gap between the best and second-best logit over those steps (so that a test knows how
  far rounding is from changing a choice).

Run from the repository root, in a venv with torch, transformers and tokenizers:
    python tools/reference/hf_generate.py
CI never runs this; it reads the committed fixture.
"""

import json
import pathlib
import shutil

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Mamba2Config, Mamba2ForCausalLM

from hf_checkpoint_forms import SIZES
from hf_fixtures import perturbed

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hf_generate"

CORPUS = [
    "The state space model reads one token at a time and keeps a small state.",
    "A recurrent state carries the history, so each new token costs the same.",
    "Mamba-2 computes the scan in chunks during training and one step at a time in decoding.",
    "The quick brown fox jumps over the lazy dog; the dog sleeps in the sun.",
    "Prices, loads and sensors arrive as time series, one row per tick.",
]
PROMPT = "The state space model"
MAX_NEW = 24
# Picked among seeds 1-3 and scales 0.3 / 1.0: the one whose greedy text does not settle on one
# token within 24 steps, with a best-to-second logit gap of at least 0.036 at every step.
SEED = 1
SCALE = 0.3


def main():
    torch.manual_seed(SEED)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(OUT / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    eos = tok.token_to_id("<|endoftext|>")

    config = Mamba2Config(**SIZES, vocab_size=vocab, tie_word_embeddings=True, eos_token_id=eos, bos_token_id=eos,
                          pad_token_id=eos)
    model = perturbed(config, SCALE)
    model.save_pretrained(OUT, safe_serialization=True)
    model = Mamba2ForCausalLM.from_pretrained(OUT).float().eval()

    ids = torch.tensor([tok.encode(PROMPT).ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, eos_token_id=eos, pad_token_id=eos)
    new = out.sequences[0, ids.shape[1]:].tolist()
    margins = []
    for s in out.scores:
        top = torch.topk(s[0], 2).values
        margins.append(float(top[0] - top[1]))
    meta = {
        "generator": "tools/reference/hf_generate.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "prompt": PROMPT,
        "prompt_ids": ids[0].tolist(),
        "max_new_tokens": MAX_NEW,
        "eos_token_id": eos,
        "new_ids": new,
        "text": tok.decode(new, skip_special_tokens=True),
        "min_logit_margin": min(margins),
    }
    (OUT / "generate.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
