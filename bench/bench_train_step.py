"""Benchmark the sharded, jitted training step of workloads/train.py on 1..N local devices.

Prints a table (not a test): step time, global tokens/s, speed-up against one device, model TFLOP/s per
device and, on an accelerator with ``--peak-tflops-per-device``, MFU. The model, optimizer, data-parallel
mesh and train step are train.py's own (imported from its path; nothing is copied).

Each device count runs in a fresh subprocess because the device count must be fixed before JAX is
imported: on CPU the parent sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N``. Those N "devices"
share the same cores. XLA:CPU runs each device on its own thread while one device's small ops use the
cores poorly, so a CPU "speed-up" only says that; it is not multi-chip scaling. On a GPU/TPU host the first
N real devices are used, and counts above what exists are skipped.

FLOPs per step = train.flops_per_token(cfg) * global tokens (6 N + 12 L T d per token; see train.py).
MFU = achieved model TFLOP/s per device / peak. Known peak dense bf16 TFLOP/s per device, for
``--peak-tflops-per-device``:
    NVIDIA H100 SXM 989, H200 SXM 989 (same GH100 compute), TPU v6e 918, TPU v5p 459, TPU v5e 197.

Examples:
    python -m bench.bench_train_step                          # CPU: 1, 2, 4 forced host devices
    python -m bench.bench_train_step --devices 1 --d-model 1024 --layers 8 --heads 16 --seq-len 1024 \\
        --batch-size 32 --peak-tflops-per-device 989          # one H200, bf16 (--dtype auto)
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_train():
    # Imported only in a child, after its XLA_FLAGS has fixed the device count.
    from workloads import train

    return train


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--devices", default="1,2,4", help="comma-separated device counts")
    p.add_argument("--steps", type=int, default=10, help="timed steps per device count")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (the first one compiles)")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (same for every N)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="matmul dtype; auto: bfloat16 on gpu/tpu, float32 on cpu")
    p.add_argument("--peak-tflops-per-device", type=float, default=None)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return p


def run_child(args) -> dict:
    """Time train.py's step on the first ``args.child`` devices; returns one row of the table."""
    import jax
    train = load_train()
    devices = jax.devices()
    platform = devices[0].platform
    n = args.child
    if n > len(devices):
        return {"devices": n, "skipped": f"only {len(devices)} {platform} devices"}
    if args.batch_size % n:
        return {"devices": n, "skipped": f"batch {args.batch_size} not divisible by {n}"}
    dtype = args.dtype if args.dtype != "auto" else ("float32" if platform == "cpu" else "bfloat16")
    cfg = train.ModelConfig(vocab=args.vocab, seq_len=args.seq_len, d_model=args.d_model,
                            layers=args.layers, heads=args.heads, dtype=dtype)
    mesh = train.make_mesh(devices[:n])
    optimizer = train.make_optimizer(1e-3, 10)
    state = train.create_state(cfg, optimizer, 0, mesh)
    step = train.make_train_step(cfg, optimizer, mesh)
    # Data generation stays out of the timing: a few batches are built and placed beforehand.
    batches = [train.shard_batch(train.synthetic_batch(0, s, 0, args.batch_size, cfg.seq_len, cfg.vocab), mesh)
               for s in range(4)]

    t_compile = time.perf_counter()
    for s in range(args.warmup):
        state, loss = step(state, batches[s % len(batches)])
    jax.block_until_ready(loss)
    t0 = time.perf_counter()
    for s in range(args.steps):
        state, loss = step(state, batches[s % len(batches)])
    jax.block_until_ready((state, loss))
    dt = (time.perf_counter() - t0) / args.steps

    tokens = args.batch_size * cfg.seq_len
    tflops = train.flops_per_token(cfg) * tokens / dt / n / 1e12
    row = {"devices": n, "platform": platform, "dtype": dtype, "step_ms": dt * 1e3,
           "tokens_per_s": tokens / dt, "tflops_per_device": tflops, "warmup_s": t0 - t_compile,
           "params": train.num_params(cfg), "loss": float(loss)}
    if args.peak_tflops_per_device and platform != "cpu":
        row["mfu"] = tflops / args.peak_tflops_per_device
    return row


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(args)), flush=True)
        return None

    rows = []
    for n in (int(x) for x in args.devices.split(",")):
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                                         + f" --xla_force_host_platform_device_count={n}").strip())
        out = subprocess.run([sys.executable, "-m", "bench.bench_train_step", *(argv if argv is not None else sys.argv[1:]),
                              "--child", str(n)], cwd=REPO, env=env, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))

    base = next((r for r in rows if r["devices"] == 1 and "skipped" not in r), None)
    print(f"model: d_model={args.d_model} layers={args.layers} heads={args.heads} vocab={args.vocab} "
          f"seq_len={args.seq_len}, global batch {args.batch_size}, {args.steps} timed steps")
    header = f"{'devices':>7} {'platform':>8} {'dtype':>8} {'step ms':>9} {'tokens/s':>11} {'vs 1 dev':>8} " \
             f"{'TFLOP/s/dev':>11} {'MFU':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        if "skipped" in r:
            print(f"{r['devices']:>7}  skipped: {r['skipped']}")
            continue
        speedup = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        print(f"{r['devices']:>7} {r['platform']:>8} {r['dtype']:>8} {r['step_ms']:>9.2f} "
              f"{r['tokens_per_s']:>11.0f} {speedup:>8} {r['tflops_per_device']:>11.4f} {mfu:>7}")
    return rows


if __name__ == "__main__":
    main()
