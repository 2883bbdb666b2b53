"""Writes the SSD parity fixtures: tests/fixtures/ssd_minimal.{safetensors,json}.

An independent reference for mamba2-ssd: the minimal chunked SSD listing of the Mamba-2 paper
(state-spaces/mamba, `ssd_minimal_discrete`: segsum and the four steps, with initial states),
written here in plain PyTorch, in float64, and checked against a naive loop over time before
anything is written. The gradients are those of the scalar loss

    loss = sum(y * w_y) + sum(final_state * w_state)

with respect to x, dt, a, b, c, d and the initial state.

Run from the repository root, in a venv with torch and safetensors:
    python tools/reference/ssd_fixtures.py
CI never runs this; it reads the committed fixtures.
"""

import json
import pathlib

import torch
from safetensors.torch import save_file

torch.set_default_dtype(torch.float64)
OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def segsum(x):
    """Stable segment sums: out[..., i, j] = x[j+1] + ... + x[i] for i >= j, -inf above."""
    t = x.size(-1)
    x = x[..., None].expand(*x.shape, t)
    strict = torch.tril(torch.ones(t, t, dtype=torch.bool), diagonal=-1)
    x = x.masked_fill(~strict, 0)
    s = torch.cumsum(x, dim=-2)
    lower = torch.tril(torch.ones(t, t, dtype=torch.bool), diagonal=0)
    return s.masked_fill(~lower, -torch.inf)


def ssd_minimal_discrete(X, A, B, C, block_len, initial_states):
    """The paper's listing. X [b, l, h, p], A [b, l, h], B and C [b, l, h, n], l = c * block_len,
    initial_states [b, 1, h, p, n]."""
    b, l, h, p = X.shape
    n = B.shape[-1]
    c = l // block_len
    X = X.reshape(b, c, block_len, h, p)
    B = B.reshape(b, c, block_len, h, n)
    C = C.reshape(b, c, block_len, h, n)
    A = A.reshape(b, c, block_len, h).permute(0, 3, 1, 2)  # b h c l
    A_cumsum = torch.cumsum(A, dim=-1)

    # 1. intra-chunk (diagonal blocks)
    L = torch.exp(segsum(A))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)
    # 2. state of each chunk
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, X)
    # 3. inter-chunk recurrence
    states = torch.cat([initial_states, states], dim=1)
    decay_chunk = torch.exp(segsum(torch.nn.functional.pad(A_cumsum[:, :, :, -1], (1, 0))))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    # 4. state -> output
    state_decay_out = torch.exp(A_cumsum)
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, state_decay_out)
    return (Y_diag + Y_off).reshape(b, l, h, p), final_state


def ssd(x, dt, a, bm, cm, d, init, chunk):
    """The full scan with groups, padding to a chunk multiple with dt = 0, and the D skip."""
    bsz, l, h, p = x.shape
    g = bm.shape[2]
    pad = (-l) % chunk
    xp = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
    dtp = torch.nn.functional.pad(dt, (0, 0, 0, pad))
    bp = torch.nn.functional.pad(bm, (0, 0, 0, 0, 0, pad)).repeat_interleave(h // g, dim=2)
    cp = torch.nn.functional.pad(cm, (0, 0, 0, 0, 0, pad)).repeat_interleave(h // g, dim=2)
    y, final = ssd_minimal_discrete(xp * dtp[..., None], dtp * a, bp, cp, chunk, init[:, None])
    y = y[:, :l]
    if d is not None:
        y = y + x * (d[:, None] if d.dim() == 1 else d)
    return y, final


def naive(x, dt, a, bm, cm, d, init):
    """The recurrence, step by step: the check that the listing above is transcribed right."""
    bsz, l, h, p = x.shape
    g = bm.shape[2]
    bh = bm.repeat_interleave(h // g, dim=2)
    ch = cm.repeat_interleave(h // g, dim=2)
    s = init.clone()
    ys = []
    for t in range(l):
        s = torch.exp(dt[:, t] * a)[:, :, None, None] * s + (dt[:, t, :, None] * x[:, t])[..., None] * bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", s, ch[:, t]))
    y = torch.stack(ys, 1)
    if d is not None:
        y = y + x * (d[:, None] if d.dim() == 1 else d)
    return y, s


CASES = [
    # name, batch, L, H, P, G, N, chunk, d ("head" | "channel" | None), initial state
    ("g1_padded_d_init", 2, 13, 4, 3, 1, 5, 4, "head", True),
    ("g2_shorter_than_chunk", 1, 7, 4, 2, 2, 3, 8, None, False),
    ("g2_exact_multiple_dchan_init", 3, 16, 2, 2, 2, 4, 4, "channel", True),
    ("g1_many_chunks", 1, 37, 2, 4, 1, 6, 5, "head", False),
]


def main():
    torch.manual_seed(20241130)
    tensors, meta = {}, []
    for name, bsz, l, h, p, g, n, chunk, dkind, has_init in CASES:
        inputs = {
            "x": torch.randn(bsz, l, h, p),
            "dt": torch.rand(bsz, l, h) * 0.5 + 0.01,
            "a": -(torch.rand(h) * 2.0 + 0.25),
            "b": torch.randn(bsz, l, g, n),
            "c": torch.randn(bsz, l, g, n),
            "initial_state": torch.randn(bsz, h, p, n) if has_init else torch.zeros(bsz, h, p, n),
        }
        if dkind == "head":
            inputs["d"] = torch.randn(h)
        elif dkind == "channel":
            inputs["d"] = torch.randn(h, p)
        for t in inputs.values():
            t.requires_grad_(True)
        d = inputs.get("d")
        y, final = ssd(inputs["x"], inputs["dt"], inputs["a"], inputs["b"], inputs["c"], d, inputs["initial_state"], chunk)
        y_ref, final_ref = naive(inputs["x"], inputs["dt"], inputs["a"], inputs["b"], inputs["c"], d, inputs["initial_state"])
        assert torch.allclose(y, y_ref, rtol=0, atol=1e-12), name
        assert torch.allclose(final, final_ref, rtol=0, atol=1e-12), name
        w_y = torch.randn(y.shape)
        w_state = torch.randn(final.shape)
        loss = (y * w_y).sum() + (final * w_state).sum()
        loss.backward()
        for k, t in inputs.items():
            tensors[f"{name}.{k}"] = t.detach().contiguous()
            tensors[f"{name}.grad.{k}"] = t.grad.detach().contiguous()
        tensors[f"{name}.y"] = y.detach().contiguous()
        tensors[f"{name}.final_state"] = final.detach().contiguous()
        tensors[f"{name}.w_y"] = w_y
        tensors[f"{name}.w_state"] = w_state
        meta.append({"name": name, "chunk_size": chunk, "d": dkind, "initial_state": has_init, "loss": loss.item()})
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(tensors, OUT / "ssd_minimal.safetensors")
    (OUT / "ssd_minimal.json").write_text(json.dumps({
        "generator": "tools/reference/ssd_fixtures.py (ssd_minimal_discrete, float64)",
        "torch": torch.__version__,
        "loss": "sum(y * w_y) + sum(final_state * w_state)",
        "cases": meta,
    }, indent=2) + "\n")
    print(f"wrote {len(meta)} cases to {OUT}")


if __name__ == "__main__":
    main()
