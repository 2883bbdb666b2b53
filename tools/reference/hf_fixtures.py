"""Writes HF transformers parity fixtures for mamba2-model under tests/fixtures/hf_<case>/.

Each case is a small random-init `Mamba2ForCausalLM` (HF's torch path, float32, CPU), saved with
`save_pretrained` (config.json + model.safetensors), and `io.safetensors` holding:
- input_ids [batch, L] (int64), last_hidden_state [batch, L, d_model], logits [batch, L, vocab];
- w_logits: the fixed weights of the scalar loss  loss = sum(logits * w_logits);
- grad.<checkpoint name>: the gradient of that loss for every parameter.

All parameters are perturbed away from their init (norm weights, D, biases, ...) so that no
tensor sits at a value that would hide a wrong use of it.

Run from the repository root, in a venv with torch, transformers and safetensors:
    python tools/reference/hf_fixtures.py
CI never runs this; it reads the committed fixtures.
"""

import json
import pathlib

import torch
from safetensors.torch import save_file
from transformers import Mamba2Config, Mamba2ForCausalLM

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"

CASES = {
    # ngroups 1, no bias, L 13 with chunk 8 (not a multiple)
    "hf_g1": dict(hidden_size=32, expand=2, head_dim=16, num_heads=4, state_size=8, n_groups=1,
                  conv_kernel=4, chunk_size=8, num_hidden_layers=2, vocab_size=37, use_bias=False,
                  use_conv_bias=True, seq_len=13, batch=2),
    # ngroups 2, with in/out projection biases and a finite dt limit, L 11 with chunk 4
    "hf_g2_bias": dict(hidden_size=24, expand=2, head_dim=12, num_heads=4, state_size=6, n_groups=2,
                       conv_kernel=4, chunk_size=4, num_hidden_layers=2, vocab_size=29, use_bias=True,
                       use_conv_bias=True, time_step_limit=(0.0, 0.2), seq_len=11, batch=3),
}


def perturbed(config, scale=0.05):
    """A random-init `Mamba2ForCausalLM` (float32, eval) with its parameters moved away from their
    init: A_log and dt_bias by N(0, 0.1^2), norms and D drawn around 1, the rest by N(0, scale^2),
    so that no parameter sits at a value that hides a mistake (a norm weight of 1, say). The other
    fixture scripts import it."""
    model = Mamba2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("A_log") or pname.endswith("dt_bias"):
                p.add_(0.1 * torch.randn_like(p))
            elif "norm" in pname or pname.endswith(".D"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.add_(scale * torch.randn_like(p))
    return model


def main():
    torch.manual_seed(1234)
    for name, spec in CASES.items():
        spec = dict(spec)
        seq_len, batch = spec.pop("seq_len"), spec.pop("batch")
        config = Mamba2Config(**spec, layer_norm_epsilon=1e-5, residual_in_fp32=True, tie_word_embeddings=True)
        model = perturbed(config)
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)

        ids = torch.randint(0, config.vocab_size, (batch, seq_len))
        hidden = model.backbone(input_ids=ids).last_hidden_state
        logits = model.lm_head(hidden)
        w = torch.randn(logits.shape)
        loss = (logits * w).sum()
        model.zero_grad()
        loss.backward()
        io = {
            "input_ids": ids.contiguous(),
            "last_hidden_state": hidden.detach().contiguous(),
            "logits": logits.detach().contiguous(),
            "w_logits": w.contiguous(),
        }
        for pname, p in model.named_parameters():
            io[f"grad.{pname}"] = p.grad.detach().contiguous()
        save_file(io, d / "io.safetensors")
        (d / "io.json").write_text(json.dumps({
            "generator": "tools/reference/hf_fixtures.py",
            "torch": torch.__version__,
            "loss": "sum(logits * w_logits)",
            "loss_value": loss.item(),
            "batch": batch,
            "seq_len": seq_len,
        }, indent=2) + "\n")
        print(name, "written; parameters:", [n for n, _ in model.named_parameters()][:12], "...")


if __name__ == "__main__":
    main()
