"""Writes tests/fixtures/adamw.{safetensors,json}: several steps of torch.optim.AdamW with a
decayed and a no-decay parameter group and torch.nn.utils.clip_grad_norm_, in float64.

Parameters (paths as in the Rust test module): layer.weight [3, 4] (decayed), layer.bias [4],
mixer.a_log [2], mixer.d [2] (no decay). Gradients are given per step (scaled so that clipping
is active on some steps and not on others); the learning rate changes per step.

Run from the repository root: python tools/reference/adamw_fixtures.py
"""

import json
import pathlib

import torch
from safetensors.torch import save_file

torch.set_default_dtype(torch.float64)
OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"

SHAPES = {"layer.weight": (3, 4), "layer.bias": (4,), "mixer.a_log": (2,), "mixer.d": (2,)}
DECAYED = ["layer.weight"]
LRS = [1e-2, 2e-2, 3e-2, 2e-2, 1e-2, 5e-3]
GRAD_SCALES = [0.2, 3.0, 0.5, 5.0, 0.05, 1.5]
BETAS, EPS, WD, MAX_NORM = (0.9, 0.95), 1e-8, 0.1, 1.0


def main():
    torch.manual_seed(77)
    params = {k: torch.nn.Parameter(torch.randn(*s)) for k, s in SHAPES.items()}
    out = {f"init.{k}": p.detach().clone() for k, p in params.items()}
    opt = torch.optim.AdamW(
        [
            {"params": [params[k] for k in DECAYED], "weight_decay": WD},
            {"params": [p for k, p in params.items() if k not in DECAYED], "weight_decay": 0.0},
        ],
        lr=LRS[0], betas=BETAS, eps=EPS,
    )
    norms = []
    for step, (lr, scale) in enumerate(zip(LRS, GRAD_SCALES)):
        for k, p in params.items():
            g = torch.randn(*SHAPES[k]) * scale
            out[f"step{step}.grad.{k}"] = g.clone()
            p.grad = g
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), MAX_NORM)))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        for k, p in params.items():
            out[f"step{step}.param.{k}"] = p.detach().clone()
    OUT.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, OUT / "adamw.safetensors")
    (OUT / "adamw.json").write_text(json.dumps({
        "generator": "tools/reference/adamw_fixtures.py (torch.optim.AdamW + clip_grad_norm_, float64)",
        "torch": torch.__version__,
        "steps": len(LRS), "lrs": LRS, "betas": BETAS, "eps": EPS, "weight_decay": WD,
        "max_grad_norm": MAX_NORM, "decayed": DECAYED, "grad_norms_before_clip": norms,
    }, indent=2) + "\n")
    print("grad norms before clipping:", norms)


if __name__ == "__main__":
    main()
