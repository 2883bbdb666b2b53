"""Both sides of issue 6 in one go: the Rust criterion bench (`cargo bench -p mamba2-train
--bench speed`) and HF transformers' torch path (`bench_torch.py`), on the same configs, 2 threads
each. Prints tokens/s for each side and the ratio, writes `docs/bench/compare.json` and the chart
`docs/bench/forward_tokens_per_s_vs_len.png`.

    /path/to/venv/bin/python tools/reference/bench_compare.py [--skip-rust] [--min-time 3] [--rounds 7]

The Rust figures are criterion's median estimates; the torch figures are the mean over at least
`--min-time` seconds, at HF's fastest chunk size of 64 and 256.

On an AMD processor the torch side runs with `mkl_intel_cpu.c` preloaded (built here with gcc,
`--mkl-shim off` to skip it): without it oneMKL takes its AVX2 path there, half the rate of the
AVX-512 path the processor has, and HF's products would run slower than they can.

The two sides of that table run minutes apart, and this VM's speed drifts by up to 2x over
minutes, so a ratio may compare one side's slow phase with the other's fast one. The train
ratios are therefore measured a second way as well: `--rounds` paired rounds, each one Rust
round (`MAMBA2_TRAIN_ROUND`, see `benches/speed.rs`) next to one HF round (`--train-only`, at the
chunk size found fastest above), timed alike (one warm-up step, then the mean over at least
`--min-time` seconds), in alternating order; each round gives a ratio, and the median is
reported with the lowest and highest.
"""
import argparse, json, os, platform, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CRIT = ROOT / "target" / "criterion"
TOKENS = {"small": 8 * 256, "medium": 8 * 512, "streaming": 1}
SWEEP = [512, 1024, 2048, 4096, 8192, 16384]


def cpuinfo():
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def machine(info):
    """The processor's model name and the number of cores: the VM's processor changes between
    sessions, and ratios from different processors are not comparable."""
    name = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), None)
    return f"{name or platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def mkl_shim(mode, info):
    """The path of the built shim to preload into torch, or None (see the module's doc)."""
    if mode == "off" or (mode == "auto" and "AuthenticAMD" not in info):
        return None
    out = ROOT / "target" / "libmkl_intel_cpu.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(out), str(ROOT / "tools/reference/mkl_intel_cpu.c")], check=True)
    return out


def rust_seconds(group, function, param):
    est = CRIT / group / function / str(param) / "new" / "estimates.json" if param else CRIT / group / function / "new" / "estimates.json"
    return json.loads(est.read_text())["median"]["point_estimate"] / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-rust", action="store_true", help="reuse the last criterion results")
    ap.add_argument("--min-time", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=7, help="paired train rounds per config (0: none)")
    ap.add_argument("--mkl-shim", choices=["auto", "on", "off"], default="auto",
                    help="preload mkl_intel_cpu.c into torch (auto: on AMD processors)")
    a = ap.parse_args()
    info = cpuinfo()
    shim = mkl_shim(a.mkl_shim, info)
    torch_env = dict(os.environ, LD_PRELOAD=str(shim)) if shim else None
    env = dict(os.environ, RAYON_NUM_THREADS="2")
    sweep_file = ROOT / "target" / "sweep_interleaved.json"
    if not a.skip_rust:
        subprocess.run(["cargo", "bench", "-p", "mamba2-train", "--bench", "speed"], cwd=ROOT, env=env, check=True)
        # The length sweep again, round-robin over the lengths: what the flatness figures use.
        subprocess.run(["cargo", "bench", "-p", "mamba2-train", "--bench", "speed"], cwd=ROOT, check=True,
                       env=dict(env, MAMBA2_SWEEP_OUT=str(sweep_file)))
    interleaved = {r["len"]: r for r in json.loads(sweep_file.read_text())}

    def torch(*args):
        out = subprocess.run([sys.executable, str(ROOT / "tools/reference/bench_torch.py"), "--threads", "2",
                              "--min-time", str(a.min_time), *args], cwd=ROOT, check=True, env=torch_env,
                             capture_output=True, text=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    t_main = torch("--configs", "small,medium,streaming", "--dtypes", "f32,f64")
    t_sweep = torch("--dtypes", "f32", "--lengths", ",".join(map(str, SWEEP)))

    rows = []
    for r in t_main:
        backend = {"f32": "speed_flex_f32", "f64": "speed_ndarray_f64"}[r["dtype"]]
        if r["what"] == "step":
            fn, param = "step_host_streaming", None
        else:
            fn, param = f"{r['what']}_kernel", r["config"]
        s = rust_seconds(backend, fn, param)
        tok = TOKENS[r["config"]]
        rows.append(dict(config=r["config"], what=r["what"], dtype=r["dtype"], rust_s=s, torch_s=r["s_per_iter"],
                         rust_tok_s=tok / s, torch_tok_s=tok / r["s_per_iter"], ratio=r["s_per_iter"] / s,
                         torch_chunk=r.get("chunk")))
    sweep = []
    for r in t_sweep:
        s = interleaved[r["seq"]]["median_s"]
        sweep.append(dict(len=r["seq"], rust_tok_s=r["seq"] / s, torch_tok_s=r["tokens_per_s"],
                          rust_us_per_token=s / r["seq"] * 1e6, torch_chunk=r["chunk"],
                          rust_min_us_per_token=interleaved[r["seq"]]["min_s"] / r["seq"] * 1e6,
                          rust_criterion_us_per_token=rust_seconds("speed_flex_f32", "forward_len", r["seq"]) / r["seq"] * 1e6))

    paired = []
    for config in ["small", "medium"]:
        chunk = next(r["torch_chunk"] for r in rows if r["config"] == config and r["what"] == "train" and r["dtype"] == "f32")
        ratios, rust_s, torch_s = [], [], []
        for i in range(a.rounds):
            def rust_round():
                out = subprocess.run(["cargo", "bench", "-q", "-p", "mamba2-train", "--bench", "speed"], cwd=ROOT, check=True,
                                     capture_output=True, text=True,
                                     env=dict(env, MAMBA2_TRAIN_ROUND=config, MAMBA2_MIN_TIME=str(a.min_time))).stdout
                return next(json.loads(l) for l in out.splitlines() if l.startswith("{"))["s_per_iter"]

            def torch_round():
                return torch("--configs", config, "--dtypes", "f32", "--chunks", str(chunk), "--train-only")[0]["s_per_iter"]
            # Alternate which side goes first, so that neither always follows the other.
            if i % 2 == 0:
                r, t = rust_round(), torch_round()
            else:
                t, r = torch_round(), rust_round()
            rust_s.append(r)
            torch_s.append(t)
            ratios.append(t / r)
            print(f"paired round {i + 1} {config}: rust {r:.4f} s, torch {t:.4f} s, ratio {t / r:.2f}x", flush=True)
        if ratios:
            s_r = sorted(ratios)
            paired.append(dict(config=config, what="train", dtype="f32", torch_chunk=chunk, rounds=len(ratios),
                               ratio_median=s_r[len(s_r) // 2], ratio_min=s_r[0], ratio_max=s_r[-1],
                               rust_s=rust_s, torch_s=torch_s, ratios=ratios))

    print(f"{'config':<10} {'what':<8} {'dtype':<5} {'rust tok/s':>12} {'torch tok/s':>12} {'ratio':>7}")
    for r in rows:
        print(f"{r['config']:<10} {r['what']:<8} {r['dtype']:<5} {r['rust_tok_s']:>12.0f} {r['torch_tok_s']:>12.0f} {r['ratio']:>6.2f}x")
        if r["what"] == "step":
            print(f"{'':<10} step time: rust {r['rust_s'] * 1e6:.1f} us, torch {r['torch_s'] * 1e6:.1f} us")
    for p in paired:
        print(f"paired train rounds, {p['config']}: median ratio {p['ratio_median']:.2f}x "
              f"(lowest {p['ratio_min']:.2f}x, highest {p['ratio_max']:.2f}x, {p['rounds']} rounds)")
    print("\nforward, medium width, batch 1 (f32; rust: median of the round-robin sweep):")
    base = sweep[0]["rust_us_per_token"]
    for r in sweep:
        print(f"  L {r['len']:>6}: rust {r['rust_tok_s']:>9.0f} tok/s ({r['rust_us_per_token']:.2f} us/token, "
              f"{(r['rust_us_per_token'] / base - 1) * 100:+.1f}% vs L 512), torch {r['torch_tok_s']:>9.0f} tok/s")

    out = ROOT / "docs" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(dict(machine=machine(info), torch_mkl_shim=bool(shim),
                                                      rows=rows, paired=paired, sweep=sweep), indent=1) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([r["len"] for r in sweep], [r["rust_tok_s"] for r in sweep], "o-", label="mamba2 (Rust, Flex f32)")
    ax.plot([r["len"] for r in sweep], [r["torch_tok_s"] for r in sweep], "s-", label="HF transformers (torch path, f32)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length L (batch 1, d_model 256, 4 layers)")
    ax.set_ylabel("forward tokens / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Forward throughput against length, 2 threads")
    fig.tight_layout()
    fig.savefig(out / "forward_tokens_per_s_vs_len.png", dpi=110)


if __name__ == "__main__":
    main()
