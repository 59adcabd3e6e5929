"""A small CPU training loop (a NumPy MLP on synthetic data) to try radt without a GPU.

    radt -e demo examples/train.py --batch-size 256 --epochs 5
    python examples/train.py --epochs 2      # the same script, untracked

It logs loss and accuracy per epoch through `radt.run()`, which is a no-op without radt.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import radt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--samples", type=int, default=40_000)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, 64)).astype(np.float32)
    y = (x[:, :8].sum(axis=1) > 0).astype(np.int64)
    w1 = rng.standard_normal((64, args.hidden)).astype(np.float32) * 0.1
    w2 = rng.standard_normal((args.hidden, 2)).astype(np.float32) * 0.1

    with radt.run() as run:
        for epoch in range(args.epochs):
            started = time.perf_counter()
            order = rng.permutation(args.samples)
            losses = []
            for start in range(0, args.samples, args.batch_size):
                idx = order[start : start + args.batch_size]
                xb, yb = x[idx], y[idx]
                h = np.maximum(xb @ w1, 0)
                logits = h @ w2
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                losses.append(-np.log(p[np.arange(len(yb)), yb] + 1e-9).mean())
                grad = p
                grad[np.arange(len(yb)), yb] -= 1
                grad /= len(yb)
                gw2 = h.T @ grad
                gh = grad @ w2.T
                gh[h <= 0] = 0
                w1 -= args.lr * (xb.T @ gh)
                w2 -= args.lr * gw2
            accuracy = float(((np.maximum(x @ w1, 0) @ w2).argmax(axis=1) == y).mean())
            loss = float(np.mean(losses))
            elapsed = time.perf_counter() - started
            print(f"epoch {epoch}: loss {loss:.4f} accuracy {accuracy:.3f} ({elapsed:.2f} s)", flush=True)
            run.log_metrics({"loss": loss, "accuracy": accuracy, "epoch_seconds": elapsed}, step=epoch)


if __name__ == "__main__":
    main()
