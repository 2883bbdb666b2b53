"""HF transformers' Mamba2Model on its PyTorch path, timed at the configs of issue 6.

Prints one JSON object per measurement on stdout:
  {"side": "torch", "what": "train"|"forward"|"step", "config": ..., "dtype": ..., "tokens_per_s": ..., "s_per_iter": ...}

Run with 2 threads (the CI machine's cores). The CUDA kernels (mamba_ssm, causal_conv1d) are not
installed, and the script refuses to run if they are, so HF takes `torch_forward`.
"""
import argparse, json, sys, time

import torch
from transformers import Mamba2Config, Mamba2Model

CONFIGS = {
    "small": dict(d_model=64, d_state=16, headdim=16, expand=2, n_layer=2, batch=8, seq=256),
    "medium": dict(d_model=256, d_state=64, headdim=32, expand=2, n_layer=4, batch=8, seq=512),
    "streaming": dict(d_model=256, d_state=64, headdim=64, expand=2, n_layer=1, batch=1, seq=1),
    # The 130m checkpoint's width and depth, for a GPU (tools/gpu/check.sh).
    "wide": dict(d_model=768, d_state=128, headdim=64, expand=2, n_layer=24, batch=8, seq=512),
}

DEVICE = "cpu"


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def hf_model(c, chunk, dtype):
    d_inner = c["expand"] * c["d_model"]
    cfg = Mamba2Config(
        vocab_size=16, hidden_size=c["d_model"], state_size=c["d_state"], expand=c["expand"],
        head_dim=c["headdim"], num_heads=d_inner // c["headdim"], n_groups=1, conv_kernel=4,
        num_hidden_layers=c["n_layer"], chunk_size=chunk, use_bias=False, use_conv_bias=True,
        residual_in_fp32=False, rms_norm=True, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Mamba2Model(cfg).to(dtype).to(DEVICE)


def timeit(fn, min_time, min_iters=3):
    fn()  # warm-up
    sync()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        sync()
        n += 1
        el = time.perf_counter() - t0
        if n >= min_iters and el >= min_time:
            return el / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="small,medium,streaming")
    ap.add_argument("--dtypes", default="f32,f64")
    ap.add_argument("--chunks", default="64,256", help="HF chunk sizes to try; the fastest is reported")
    ap.add_argument("--lengths", default="", help="forward-only sweep over L (medium width, batch 1)")
    ap.add_argument("--min-time", type=float, default=3.0)
    ap.add_argument("--train-only", action="store_true", help="time the train step only (the paired rounds)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: HF's CUDA path (with mamba_ssm's kernels where they are installed)")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    if a.device == "cpu":
        try:
            import mamba_ssm  # noqa: F401
            sys.exit("mamba_ssm is installed: HF would not take its torch path")
        except ImportError:
            pass
    torch.set_num_threads(a.threads)
    dtypes = {"f32": torch.float32, "f64": torch.float64}

    def emit(**kw):
        print(json.dumps(dict(side="torch", device=a.device, threads=a.threads, **kw)), flush=True)

    if a.lengths:
        c = CONFIGS["medium"]
        for dn in a.dtypes.split(","):
            for L in [int(s) for s in a.lengths.split(",")]:
                best = None
                for chunk in [int(s) for s in a.chunks.split(",")]:
                    m = hf_model(c, chunk, dtypes[dn]).eval()
                    x = torch.randn(1, L, c["d_model"], dtype=dtypes[dn], device=DEVICE)
                    with torch.no_grad():
                        s = timeit(lambda: m(inputs_embeds=x), a.min_time, 2)
                    if best is None or s < best[0]:
                        best = (s, chunk)
                emit(what="forward_len", config="medium_b1", dtype=dn, seq=L, chunk=best[1],
                     s_per_iter=best[0], tokens_per_s=L / best[0])
        return

    for name in a.configs.split(","):
        c = CONFIGS[name]
        for dn in a.dtypes.split(","):
            dt = dtypes[dn]
            if name == "streaming":
                m = hf_model(c, 256, dt).eval()
                x0 = torch.randn(1, 8, c["d_model"], dtype=dt, device=DEVICE)
                with torch.no_grad():
                    out = m(inputs_embeds=x0, use_cache=True)
                    cache = getattr(out, "cache", None) or getattr(out, "cache_params")
                    xt = torch.randn(1, 1, c["d_model"], dtype=dt, device=DEVICE)

                    def step():
                        # One row with a cache: HF's single-step recurrent path (seq_len == 1).
                        m(inputs_embeds=xt, cache=cache, use_cache=True)
                    s = timeit(step, a.min_time, 50)
                emit(what="step", config=name, dtype=dn, s_per_iter=s, tokens_per_s=1 / s)
                continue
            tokens = c["batch"] * c["seq"]
            best_f, best_t = None, None
            for chunk in [int(s) for s in a.chunks.split(",")]:
                m = hf_model(c, chunk, dt)
                x = torch.randn(c["batch"], c["seq"], c["d_model"], dtype=dt, device=DEVICE)
                opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.1)

                def train():
                    opt.zero_grad(set_to_none=True)
                    h = m(inputs_embeds=x).last_hidden_state
                    loss = (h * h).mean()
                    loss.backward()
                    opt.step()

                def fwd():
                    with torch.no_grad():
                        m(inputs_embeds=x)
                st = timeit(train, a.min_time)
                sf = float("inf") if a.train_only else timeit(fwd, a.min_time)
                if best_t is None or st < best_t[0]:
                    best_t = (st, chunk)
                if best_f is None or sf < best_f[0]:
                    best_f = (sf, chunk)
            emit(what="train", config=name, dtype=dn, chunk=best_t[1], s_per_iter=best_t[0],
                 tokens_per_s=tokens / best_t[0])
            if not a.train_only:
                emit(what="forward", config=name, dtype=dn, chunk=best_f[1], s_per_iter=best_f[0],
                     tokens_per_s=tokens / best_f[0])


if __name__ == "__main__":
    main()
