"""Chunked gated delta rule vs the token loop, side by side in one run: accuracy on the inputs
that broke the explicit-inverse version, and speed of a block commit and of a training pass.

    .venv/bin/python benchmarks/gated_delta_rule.py [--threads N] [--repeats 20]

Prints, per chunk size 16 / 32 / 64: max |S_chunk - S_loop| with near-identical keys
(a repeated token), g = 0, beta = 0.95 (the true |S| is about 1), and the time ratio
token loop / chunked for committing one block (1 sequence, 4 value heads of 48, keys of 24:
clover-tiny's GDN layer) and for `chunk_states` forward + backward over 8 x 512 tokens
(a training batch) against autograd through the loop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clover_engine.threads import add_threads_argument, configure_threads  # noqa: E402
from clover_kernels.gated_delta_rule import chunk, naive  # noqa: E402


def _median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _repeated_keys(T: int, H: int = 1, K: int = 24, V: int = 48, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(K, generator=gen) + 1e-3 * torch.randn(1, T, H, K, generator=gen)
    q = torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, H, V, generator=gen)
    return q, k, v, torch.zeros(1, T, H), torch.full((1, T, H), 0.95)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    add_threads_argument(ap)
    args = ap.parse_args(argv)
    threads = configure_threads(args.threads)
    print(f"threads={threads}")
    print(f"{'chunk':>6} {'max|dS| repeated keys':>22} {'commit: loop/chunk':>19} {'train fwd+bwd: loop/chunk':>26}")
    for C in (16, 32, 64):
        q, k, v, g, beta = _repeated_keys(C * 2)
        _, s_ref = naive.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        _, s_chk = chunk.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, chunk_size=C)
        err = float((s_chk - s_ref).abs().max())

        gen = torch.Generator().manual_seed(1)
        kc, vc = torch.randn(1, C, 4, 24, generator=gen), torch.randn(1, C, 4, 48, generator=gen)
        gc, bc = -torch.rand(1, C, 4, generator=gen), torch.rand(1, C, 4, generator=gen)
        s0 = torch.randn(1, 4, 24, 48, generator=gen)
        t_loop = _median_s(lambda: naive.gated_delta_rule(kc, kc, vc, gc, bc, s0, True, True), args.repeats)
        t_chunk = _median_s(lambda: chunk.gated_delta_rule(kc, kc, vc, gc, bc, s0, True, True, chunk_size=C),
                            args.repeats)

        kt = torch.randn(8, 512, 4, 24, generator=gen).requires_grad_(True)
        vt = torch.randn(8, 512, 4, 48, generator=gen).requires_grad_(True)
        gt, bt = -torch.rand(8, 512, 4, generator=gen) * 0.5, torch.rand(8, 512, 4, generator=gen)

        def train_chunk():
            before, final = chunk.chunk_states(kt, vt, gt, bt, None, C)
            (before.sum() + final.sum()).backward()

        def train_loop():
            S, acc = None, 0.0
            for c0 in range(0, 512, C):
                sl = slice(c0, c0 + C)
                _, S = naive.gated_delta_rule(kt[:, sl], kt[:, sl], vt[:, sl], gt[:, sl], bt[:, sl], S, True, True)
                acc = acc + S.sum()
            acc.backward()

        r = max(1, args.repeats // 10)
        t_tr_chunk, t_tr_loop = _median_s(train_chunk, r), _median_s(train_loop, r)
        print(f"{C:>6} {err:>22.2e} {t_loop / t_chunk:>18.2f}x {t_tr_loop / t_tr_chunk:>25.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
