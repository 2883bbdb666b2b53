"""HF transformers' decoding speed at the 130m shape, beside `cargo bench -p mamba2-model --bench
model -- lm_decode` (docs/benchmarks.md).

A random-init `Mamba2ForCausalLM` (d_model 768, 24 layers, d_state 128, headdim 64, expand 2,
vocab 50,280, tied head) in float32 and in bfloat16, on the torch path (no CUDA kernels), 2
threads. After a 16-token prompt fills the cache, one token is one call with the cache
(`seq_len == 1`, HF's cached step) plus the head: the mean over at least --min-time seconds of
such calls, each feeding the previous call's argmax.

    /work/venv/bin/python tools/reference/hf_decode_speed.py [--min-time 5]
"""

import argparse
import json
import time

import torch
import transformers
from transformers import Mamba2Config, Mamba2ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-time", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = Mamba2Config(hidden_size=768, num_hidden_layers=24, state_size=128, head_dim=64, expand=2,
                          num_heads=768 * 2 // 64, n_groups=1, vocab_size=50280, tie_word_embeddings=True,
                          chunk_size=256, use_bias=False, use_conv_bias=True, residual_in_fp32=True)
    for dtype in (torch.float32, torch.bfloat16):
        model = Mamba2ForCausalLM(config).to(dtype).eval()
        ids = torch.randint(0, config.vocab_size, (1, 16))
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            cache = out.cache_params
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            pos = ids.shape[1]

            def step():
                nonlocal out, nxt, pos
                out = model(input_ids=nxt, cache_params=cache, use_cache=True,
                            cache_position=torch.tensor([pos]))
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                pos += 1

            for _ in range(3):
                step()
            n, start = 0, time.perf_counter()
            while n < 5 or time.perf_counter() - start < args.min_time:
                step()
                n += 1
            s = (time.perf_counter() - start) / n
        print(json.dumps({"side": "hf", "what": "decode_130m", "dtype": str(dtype).replace("torch.", ""),
                          "s_per_token": s, "tokens_per_s": 1.0 / s, "torch": torch.__version__,
                          "transformers": transformers.__version__, "threads": args.threads}))


if __name__ == "__main__":
    main()
