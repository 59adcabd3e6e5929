"""Training slowdown under radt: epoch times of a small CPU training run plain vs under `python -m radt`.

The training is a numpy MLP (two hidden layers, softmax cross-entropy, minibatch SGD) on
synthetic data, written to a temporary folder as train.py; it times each of its epochs with
`time.perf_counter()` and prints `epoch <n> <seconds>`. This script runs it alternately

  plain   python train.py ...
  radt    python -m radt --store sqlite:///<tmp>/bench.db -e bench train.py ...   (RADT_HOME=<tmp>)

pair after pair (plain, radt, plain, radt, ...; the order flips every pair), parses the epoch
lines from stdout, and reports the median epoch time of each side, the slowdown
(radt / plain - 1) over all epochs and as the median of the per-pair slowdowns (robust to the
machine drifting between pairs), the first epoch on its own (radt's start-up work, such as
`pip freeze` for the run's artifacts, lands there), and how much CPU radt's own process
used while the script trained (psutil, radt's pid only, the training excluded).

radt runs with its default listeners (nvml+host; NVML is unavailable without an NVIDIA
driver, so only host is sampled there) at --interval 1.

With --idle-check SECONDS it instead measures radt's own process over a script that only
sleeps, once with -l host and once with no listener (-l -): the runner's cost beside sampling.

With --gpu the training is ResNet-50 on the GPU instead (bf16, batch 128, random data, 19,200
images an epoch unless --samples says): radt then samples NVML with GPM as well (docs/GPU.md).

Run:  .venv/bin/python bench/training_overhead.py            (5 pairs x 6 epochs, ~5 min)
      python3 bench/training_overhead.py --gpu --pairs 3 --epochs 5   (on a GPU machine, ~4 min)
      .venv/bin/python bench/training_overhead.py --quick    (1 pair x 2 short epochs)
      .venv/bin/python bench/training_overhead.py --threads 1   (the training on one core)
      .venv/bin/python bench/training_overhead.py --idle-check 30
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent

TRAIN = r'''
"""A small numpy MLP on synthetic data; prints 'epoch <n> <seconds>' per epoch."""
import argparse, time
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--samples", type=int, default=60000)
p.add_argument("--features", type=int, default=256)
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--classes", type=int, default=10)
p.add_argument("--batch-size", type=int, default=128)
p.add_argument("--lr", type=float, default=0.05)
a = p.parse_args()

rng = np.random.default_rng(0)
X = rng.standard_normal((a.samples, a.features)).astype(np.float32)
true_w = rng.standard_normal((a.features, a.classes)).astype(np.float32)
y = (X @ true_w).argmax(1)
W1 = (rng.standard_normal((a.features, a.hidden)) * np.sqrt(2 / a.features)).astype(np.float32)
W2 = (rng.standard_normal((a.hidden, a.hidden)) * np.sqrt(2 / a.hidden)).astype(np.float32)
W3 = (rng.standard_normal((a.hidden, a.classes)) * np.sqrt(2 / a.hidden)).astype(np.float32)

for epoch in range(a.epochs):
    t0 = time.perf_counter()
    order = rng.permutation(a.samples)
    loss_sum = 0.0
    for start in range(0, a.samples, a.batch_size):
        idx = order[start : start + a.batch_size]
        xb, yb = X[idx], y[idx]
        h1 = np.maximum(xb @ W1, 0)
        h2 = np.maximum(h1 @ W2, 0)
        logits = h2 @ W3
        logits -= logits.max(1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(1, keepdims=True)
        loss_sum += -np.log(prob[np.arange(len(yb)), yb] + 1e-9).sum()
        g = prob
        g[np.arange(len(yb)), yb] -= 1
        g /= len(yb)
        gW3 = h2.T @ g
        g2 = (g @ W3.T) * (h2 > 0)
        gW2 = h1.T @ g2
        g1 = (g2 @ W2.T) * (h1 > 0)
        gW1 = xb.T @ g1
        W1 -= a.lr * gW1
        W2 -= a.lr * gW2
        W3 -= a.lr * gW3
    print(f"epoch {epoch} {time.perf_counter() - t0:.4f} loss {loss_sum / a.samples:.4f}", flush=True)
'''

TRAIN_GPU = r'''
"""ResNet-50 on one GPU (bf16 autocast, channels_last, SGD, random data); prints 'epoch <n> <seconds>' per epoch."""
import argparse, time
import torch
from torchvision.models import resnet50

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--samples", type=int, default=19200)
p.add_argument("--batch-size", type=int, default=128)
a = p.parse_args()
torch.backends.cudnn.benchmark = True
model = resnet50().cuda().to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(a.batch_size, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (a.batch_size,), device="cuda")


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


for _ in range(15):  # cuDNN autotuning, outside the timed epochs
    step()
torch.cuda.synchronize()
for epoch in range(a.epochs):
    t0 = time.perf_counter()
    for _ in range(a.samples // a.batch_size):
        step()
    torch.cuda.synchronize()
    print(f"epoch {epoch} {time.perf_counter() - t0:.4f}", flush=True)
'''

EPOCH = re.compile(r"^epoch (\d+) ([0-9.]+)", re.M)


def run_once(mode: str, tmp: Path, train_args: list[str], env: dict[str, str]) -> dict:
    """One training run; returns its epoch times, wall time and (radt) radt's own CPU while training."""
    script = str(tmp / "train.py")
    if mode == "plain":
        cmd = [sys.executable, script, *train_args]
    else:
        cmd = [sys.executable, "-m", "radt", "--store", f"sqlite:///{tmp / 'bench.db'}", "-e", "bench", "--interval", "1", script, *train_args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    me = psutil.Process(proc.pid)
    cpu_marks: list[tuple[float, float]] = []  # (wall, radt's own cpu) at each epoch line
    err_chunks: list[str] = []
    drain = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    drain.start()
    epochs: list[float] = []
    out_lines = []
    for line in proc.stdout:
        out_lines.append(line)
        m = EPOCH.match(line)
        if m:
            epochs.append(float(m.group(2)))
            if mode == "radt":
                try:
                    t = me.cpu_times()
                    cpu_marks.append((time.perf_counter(), t.user + t.system))
                except psutil.Error:
                    pass
    rc = proc.wait()
    drain.join(5)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{mode} run failed (rc {rc}):\n{''.join(out_lines)[-2000:]}\n{''.join(err_chunks)[-2000:]}")
    result = {"epochs": epochs, "wall": wall}
    if len(cpu_marks) >= 2:  # radt's CPU from the end of the first epoch to the end of the last
        (w0, c0), (w1, c1) = cpu_marks[0], cpu_marks[-1]
        result["radt_core_pct"] = 100 * (c1 - c0) / (w1 - w0)
    return result


def idle_check(tmp: Path, env: dict[str, str], seconds: float) -> None:
    """radt's own process cost with nothing to train: what the runner costs beside the sampling."""
    (tmp / "idle.py").write_text(f"import time\ntime.sleep({seconds + 15})\n")
    print(f"radt's own process over {seconds:g} s of a sleeping script (after 10 s of start-up)")
    for listeners in ("host", "-"):
        cmd = [sys.executable, "-m", "radt", "--store", f"sqlite:///{tmp / 'bench.db'}", "-e", "idle", "-l", listeners, str(tmp / "idle.py")]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        me = psutil.Process(proc.pid)
        time.sleep(10)
        t0, c0, w0 = me.cpu_times(), me.num_ctx_switches(), time.monotonic()
        time.sleep(seconds)
        t1, c1, w1 = me.cpu_times(), me.num_ctx_switches(), time.monotonic()
        threads = me.num_threads()
        proc.wait()
        cpu = (t1.user - t0.user) + (t1.system - t0.system)
        wakeups = (c1.voluntary - c0.voluntary) / (w1 - w0)
        print(f"  -l {listeners:<5} {100 * cpu / (w1 - w0):.3f} % of one core, {wakeups:.0f} voluntary context switches/s, {threads} threads")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--pairs", type=int, default=5, help="plain/radt pairs (default 5)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per run (default 6)")
    parser.add_argument("--samples", type=int, default=60000, help="training samples; sets the epoch length (default 60000, ~3-5 s here)")
    parser.add_argument("--threads", type=int, default=0, help="BLAS threads for the training (default 0: the library's default, all cores)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 pair, 2 short epochs")
    parser.add_argument(
        "--idle-check",
        type=float,
        default=0,
        metavar="SECONDS",
        help="instead: radt's own CPU and wake-ups over a sleeping script, with -l host and with no listener (-l -), for SECONDS each",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (store, logs)")
    parser.add_argument("--gpu", action="store_true", help="train ResNet-50 on the GPU (PyTorch, torchvision) instead; --samples is images per epoch")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.epochs, args.samples = 1, 2, 8000

    tmp = Path(tempfile.mkdtemp(prefix="radt-bench-train-"))
    (tmp / "train.py").write_text(TRAIN_GPU if args.gpu else TRAIN)
    if args.gpu and args.samples == 60000:
        args.samples = 19200  # images: 150 steps of 128, ~4.5 s on an H200
    train_args = ["--epochs", str(args.epochs), "--samples", str(args.samples)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RADT_"))}
    env["RADT_HOME"] = str(tmp / "radt-home")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    if args.threads:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(args.threads)

    if args.idle_check:
        try:
            idle_check(tmp, env, args.idle_check)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0

    runs: dict[str, list[dict]] = {"plain": [], "radt": []}
    try:
        for pair in range(args.pairs):
            order = ("plain", "radt") if pair % 2 == 0 else ("radt", "plain")
            for mode in order:
                r = run_once(mode, tmp, train_args, env)
                runs[mode].append(r)
                extra = f", radt process {r['radt_core_pct']:.2f} % of a core" if "radt_core_pct" in r else ""
                print(f"pair {pair + 1}/{args.pairs} {mode:<5} epochs {' '.join(f'{e:.3f}' for e in r['epochs'])}  wall {r['wall']:.1f} s{extra}", flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    def all_epochs(mode: str, skip_first: bool = False) -> list[float]:
        return [e for r in runs[mode] for e in (r["epochs"][1:] if skip_first else r["epochs"])]

    print()
    print(f"training overhead: {args.pairs} pairs x {args.epochs} epochs, {args.samples} samples; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'':<8} {'epochs':>6} {'median s':>9} {'mean s':>8} {'min s':>7} {'max s':>7} {'1st epoch':>10} {'wall/run':>9}")
    print("-" * 72)
    med = {}
    for mode in ("plain", "radt"):
        eps = all_epochs(mode)
        med[mode] = statistics.median(eps)
        first = statistics.median(r["epochs"][0] for r in runs[mode])
        wall = statistics.median(r["wall"] for r in runs[mode])
        print(f"{mode:<8} {len(eps):>6} {med[mode]:>9.4f} {statistics.mean(eps):>8.4f} {min(eps):>7.4f} {max(eps):>7.4f} {first:>10.4f} {wall:>9.2f}")
    slowdown = 100 * (med["radt"] / med["plain"] - 1)
    pair_slowdowns = [100 * (statistics.median(b["epochs"]) / statistics.median(a["epochs"]) - 1) for a, b in zip(runs["plain"], runs["radt"])]
    later = 100 * (statistics.median(all_epochs("radt", True)) / statistics.median(all_epochs("plain", True)) - 1) if args.epochs > 1 else float("nan")
    firsts = 100 * (statistics.median(r["epochs"][0] for r in runs["radt"]) / statistics.median(r["epochs"][0] for r in runs["plain"]) - 1)
    radt_cpu = [r["radt_core_pct"] for r in runs["radt"] if "radt_core_pct" in r]
    print()
    print(f"RATIO radt / plain median epoch = {med['radt'] / med['plain']:.4f} (slowdown {slowdown:+.2f} %)")
    print(f"per-pair slowdowns: {' '.join(f'{s:+.2f}%' for s in pair_slowdowns)}; median {statistics.median(pair_slowdowns):+.2f} %")
    print(f"slowdown without the first epoch {later:+.2f} %; first epoch alone {firsts:+.2f} %")
    if radt_cpu:
        print(f"radt's own process while training (epoch 1 end -> last epoch end): median {statistics.median(radt_cpu):.2f} % of one core")
    verdict = "MET" if slowdown < 0.5 else "NOT MET"
    print(
        f"target: < 0.5 % epoch-time slowdown -> {slowdown:+.2f} % ({verdict}; noise: per-pair spread {min(pair_slowdowns):+.2f} .. {max(pair_slowdowns):+.2f} %)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
