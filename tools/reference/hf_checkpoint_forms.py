"""Writes fixtures of the forms HF Mamba-2 checkpoints come in, under tests/fixtures/<case>/:

- hf_untied: `tie_word_embeddings = False` with its own `lm_head.weight`, and the key then
  removed from config.json, so that the loader must take HF's default (untied) to match;
- hf_sharded: `save_pretrained` split into 3 safetensors shards with
  `model.safetensors.index.json`;
- hf_bf16: weights saved in bfloat16;
- mamba_ssm_cfg: the original mamba_ssm `config.json` form (`d_model`, `n_layer`, `ssm_cfg`,
  `tie_embeddings`, a vocabulary padded to a multiple of 8) with mamba_ssm's tensor names
  (`backbone.embedding.weight`, no `lm_head.weight`).

Each case is a small random-init `Mamba2ForCausalLM` (HF's torch path, float32, CPU, parameters
moved away from their init), and `io.safetensors` holds `input_ids` [batch, L] (int64),
`last_hidden_state` and `logits`, computed by HF from the files as written: the checkpoint is
loaded back with `from_pretrained` (or, for mamba_ssm's form, from the equivalent HF config and
the renamed tensors), so the reference is what HF itself reads from them. For bf16 the model
runs in float32 on the bf16-rounded weights, which is what a loader into f32 computes.

Run from the repository root, in a venv with torch, transformers and safetensors:
    python tools/reference/hf_checkpoint_forms.py
CI never runs this; it reads the committed fixtures.
"""

import json
import pathlib
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Mamba2Config, Mamba2ForCausalLM

from hf_fixtures import perturbed

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"

SIZES = dict(hidden_size=32, expand=2, head_dim=16, num_heads=4, state_size=8, n_groups=1, conv_kernel=4,
             chunk_size=8, num_hidden_layers=2, use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5,
             residual_in_fp32=True)


def write_io(d, model, vocab, batch=2, seq_len=13, extra=None):
    ids = torch.randint(0, vocab, (batch, seq_len))
    with torch.no_grad():
        hidden = model.backbone(input_ids=ids).last_hidden_state
        logits = model.lm_head(hidden)
    save_file({"input_ids": ids.contiguous(), "last_hidden_state": hidden.contiguous(), "logits": logits.contiguous()},
              d / "io.safetensors")
    meta = {"generator": "tools/reference/hf_checkpoint_forms.py", "torch": torch.__version__,
            "transformers": transformers.__version__, "batch": batch, "seq_len": seq_len}
    meta.update(extra or {})
    (d / "io.json").write_text(json.dumps(meta, indent=2) + "\n")


def fresh(name):
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def untied():
    d = fresh("hf_untied")
    model = perturbed(Mamba2Config(**SIZES, vocab_size=37, tie_word_embeddings=False))
    model.save_pretrained(d, safe_serialization=True)
    config = json.loads((d / "config.json").read_text())
    config.pop("tie_word_embeddings", None)
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    loaded = Mamba2ForCausalLM.from_pretrained(d).float().eval()
    assert not loaded.config.tie_word_embeddings, "HF's default is untied"
    assert not torch.equal(loaded.lm_head.weight, loaded.backbone.embeddings.weight)
    assert "lm_head.weight" in load_file(d / "model.safetensors")
    write_io(d, loaded, 37, extra={"case": "untied head, tie_word_embeddings absent from config.json"})


def sharded():
    d = fresh("hf_sharded")
    model = perturbed(Mamba2Config(**SIZES, vocab_size=37, tie_word_embeddings=True))
    total = sum(p.numel() * 4 for p in model.parameters())
    # The smallest shard size that still gives 3 files.
    for size in range(total // 3, total, 256):
        tmp = d / "try"
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=size)
        shards = sorted(tmp.glob("model-*.safetensors"))
        if len(shards) == 3:
            for f in tmp.iterdir():
                f.rename(d / f.name)
            tmp.rmdir()
            break
        shutil.rmtree(tmp)
    else:
        raise SystemExit("no shard size gave 3 files")
    assert (d / "model.safetensors.index.json").exists() and not (d / "model.safetensors").exists()
    loaded = Mamba2ForCausalLM.from_pretrained(d).float().eval()
    write_io(d, loaded, 37, extra={"case": "3 shards and model.safetensors.index.json"})


def bf16():
    d = fresh("hf_bf16")
    model = perturbed(Mamba2Config(**SIZES, vocab_size=37, tie_word_embeddings=True))
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    assert all(t.dtype == torch.bfloat16 for t in load_file(d / "model.safetensors").values())
    loaded = Mamba2ForCausalLM.from_pretrained(d, dtype=torch.bfloat16).float().eval()
    write_io(d, loaded, 37, extra={"case": "bfloat16 weights; reference in float32 on the bf16 values"})


def mamba_ssm_form():
    d = fresh("mamba_ssm_cfg")
    vocab, padded = 45, 48
    hf = Mamba2Config(**SIZES, vocab_size=padded, tie_word_embeddings=True, time_step_limit=(0.0, float("inf")))
    model = perturbed(hf)
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        tensors[name.replace("backbone.embeddings.", "backbone.embedding.")] = t.contiguous()
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    config = {
        "d_model": SIZES["hidden_size"],
        "d_intermediate": 0,
        "n_layer": SIZES["num_hidden_layers"],
        "vocab_size": vocab,
        "ssm_cfg": {"layer": "Mamba2", "d_state": SIZES["state_size"], "d_conv": SIZES["conv_kernel"],
                    "expand": SIZES["expand"], "headdim": SIZES["head_dim"], "ngroups": SIZES["n_groups"],
                    "chunk_size": SIZES["chunk_size"]},
        "attn_layer_idx": [],
        "attn_cfg": {},
        "rms_norm": True,
        "residual_in_fp32": True,
        "fused_add_norm": True,
        "pad_vocab_size_multiple": 8,
        "tie_embeddings": True,
    }
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # The reference reads the renamed file back into the equivalent HF model.
    back = {k.replace("backbone.embedding.", "backbone.embeddings."): v for k, v in load_file(d / "model.safetensors").items()}
    ref = Mamba2ForCausalLM(hf).float().eval()
    missing, unexpected = ref.load_state_dict(back, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    ref.tie_weights()
    assert torch.equal(ref.lm_head.weight, back["backbone.embeddings.weight"])
    write_io(d, ref, vocab, extra={"case": "mamba_ssm config.json form, vocabulary 45 padded to 48"})


def main():
    torch.manual_seed(4321)
    untied()
    sharded()
    bf16()
    mamba_ssm_form()
    for case in ["hf_untied", "hf_sharded", "hf_bf16", "mamba_ssm_cfg"]:
        print(case, sorted(p.name for p in (OUT / case).iterdir()))


if __name__ == "__main__":
    main()
