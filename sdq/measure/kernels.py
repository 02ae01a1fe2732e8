"""`python -m sdq.measure.kernels`: matrix-vector speed of the quantized kernels.

For each case (the decode-time shapes of the seed-shaped mini model) it times
``matvec_q`` (activations already quantized, as the engine does for gate and up) and
``matvec`` (quantizing x inside), median of repeats, and prints the weight bytes streamed
per second, weights per second, and the ratio to NumPy's float32 BLAS matrix-vector product
on the same weights dequantized (which streams 4 bytes per weight). ``-T N`` times products
with N activation rows instead (prefill; weights per second then count every token). The
``cpu us`` column is the process CPU time per call: on a busy machine the wall time also
counts time spent descheduled.

Weights are random blocks with sane scales, resident in RAM. The expert cases cycle through
``--set`` different matrices (64 by default, like one layer's experts) so each call reads a
matrix not touched since the previous round; note that a 64-expert set (38 MB for Q4_K) still
fits a large L3, so these are cache-to-core numbers, not DRAM numbers. The output-head case
(151936 x 2048) is larger than most L3s.
"""

from __future__ import annotations

import argparse
import statistics
import time

CASES = {
    # name: (qtype, rows, cols, matrices in the rotating set)
    "expert-gate-q4k": ("Q4_K", 512, 2048, 64),
    "expert-down-q6k": ("Q6_K", 2048, 512, 64),
    "expert-down-q5k": ("Q5_K", 2048, 512, 64),
    "expert-q8_0": ("Q8_0", 512, 2048, 64),
    "attn-q-q4k": ("Q4_K", 4096, 2048, 4),
    "head-q6k": ("Q6_K", 151936, 2048, 1),
    "head-q4k": ("Q4_K", 151936, 2048, 1),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--threads", type=int, default=None, help="Numba threads (default all)")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per case (median)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    p.add_argument("--set", dest="set_size", type=int, default=None, help="matrices per set")
    p.add_argument("--no-numpy", action="store_true", help="skip the float32 BLAS reference")
    p.add_argument(
        "-T",
        "--tokens-per-call",
        type=int,
        default=1,
        help="activation rows per product (1 = decode matvec; e.g. 6 or 50 for prefill)",
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="instead: one decode token of the mini model's kernel calls (no engine), tok/s",
    )
    p.add_argument("--tokens", type=int, default=10, help="--decode: tokens timed (median)")


def _median_time(fn, repeats: int) -> float:
    return _times(fn, repeats)[0]


def _times(fn, repeats: int) -> tuple[float, float]:
    """(median wall seconds, mean process CPU seconds) per call. On a busy machine the wall
    time includes time spent descheduled; the CPU time does not."""
    times = []
    c0 = time.process_time()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), (time.process_time() - c0) / repeats


def _random_matrix(rng, qt, rows, cols):
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    from sdq.format.quants import block_facts

    bs, ts = block_facts(qt)
    nb = rows * cols // bs
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for o in {QT.Q6_K: [208], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2]}.get(qt, [0]):
        d = rng.uniform(-0.01, 0.01, nb).astype(np.float16)
        raw[:, o : o + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, -1)


def run_decode(args) -> int:
    """The kernel calls of one decode token of the mini model (8 layers, 64 experts, top-8,
    D 2048, F 512, 32 heads / 4 KV heads of 128, vocab 151936; Q4_K_M-like types: Q4_K
    q/k/o/gate/up, Q6_K v/down/head), weights random and distinct per layer and expert so
    nothing is reused from cache between tokens; context of 64 positions."""
    import numba
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    from sdq.kernels import matmul_q, ops, quantize_activation

    if args.threads:
        numba.set_num_threads(args.threads)
    L, E, K, D, F, H, Hkv, Dh, V, C = 8, 64, 8, 2048, 512, 32, 4, 128, 151936, 64
    rng = np.random.default_rng(0)
    q4, q6 = QT.Q4_K, QT.Q6_K
    layers = []
    for _ in range(L):
        layers.append(
            {
                "q": _random_matrix(rng, q4, H * Dh, D),
                "k": _random_matrix(rng, q4, Hkv * Dh, D),
                "v": _random_matrix(rng, q6, Hkv * Dh, D),
                "o": _random_matrix(rng, q4, D, H * Dh),
                "gate": [_random_matrix(rng, q4, F, D) for _ in range(E)],
                "up": [_random_matrix(rng, q4, F, D) for _ in range(E)],
                "down": [_random_matrix(rng, q6, D, F) for _ in range(E)],
                "router": rng.standard_normal((E, D)).astype(np.float32),
                "kc": rng.standard_normal((C, Hkv * Dh)).astype(np.float32),
                "vc": rng.standard_normal((C, Hkv * Dh)).astype(np.float32),
            }
        )
    head = _random_matrix(rng, q6, V, D)
    norm_w = np.ones(D, np.float32)
    x = rng.standard_normal((1, D)).astype(np.float32)
    xn = np.empty_like(x)
    q = np.empty((1, H * Dh), np.float32)
    kv = np.empty((1, Hkv * Dh), np.float32)
    att = np.empty((1, H, Dh), np.float32)
    logits_r = np.empty((1, E), np.float32)
    ids = np.empty((1, K), np.int64)
    wts = np.empty((1, K), np.float32)
    g, u = np.empty((1, F), np.float32), np.empty((1, F), np.float32)
    dn = np.empty((1, D), np.float32)
    logits = np.empty((1, V), np.float32)
    cos, sin = ops.rope_tables(np.array([C - 1]), 1e6, Dh)
    split = {"attention": 0.0, "router": 0.0, "experts": 0.0, "head": 0.0}

    def token():
        for lw in layers:
            t0 = time.perf_counter()
            ops.rms_norm(x, norm_w, 1e-6, xn)
            a = quantize_activation(xn, q4)
            matmul_q(lw["q"], q4, H * Dh, D, a, q)
            matmul_q(lw["k"], q4, Hkv * Dh, D, a, kv)
            matmul_q(lw["v"], q6, Hkv * Dh, D, quantize_activation(xn, q6), kv)
            ops.rope_neox(q.reshape(1, H, Dh), cos, sin)
            ops.attention(q.reshape(1, H, Dh), lw["kc"], lw["vc"], C - 1, Hkv, None, att)
            matmul_q(lw["o"], q4, D, H * Dh, quantize_activation(att.reshape(1, -1), q4), xn)
            t1 = time.perf_counter()
            ops.rms_norm(x, norm_w, 1e-6, xn)
            np.dot(xn, lw["router"].T, out=logits_r)
            ops.softmax_topk(logits_r, K, True, ids, wts)
            t2 = time.perf_counter()
            a = quantize_activation(xn, q4)
            for e in rng.choice(E, K, replace=False):
                matmul_q(lw["gate"][e], q4, F, D, a, g)
                matmul_q(lw["up"][e], q4, F, D, a, u)
                ops.silu_mul(g, u)
                matmul_q(lw["down"][e], q6, D, F, quantize_activation(g, q6), dn)
            t3 = time.perf_counter()
            split["attention"] += t1 - t0
            split["router"] += t2 - t1
            split["experts"] += t3 - t2
        t4 = time.perf_counter()
        matmul_q(head, q6, V, D, quantize_activation(xn, q6), logits)
        split["head"] += time.perf_counter() - t4

    token()  # compile and first touch
    for k in split:
        split[k] = 0.0
    times = []
    for _ in range(args.tokens):
        t0 = time.perf_counter()
        token()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(
        f"threads={numba.get_num_threads()}  mini-model kernel calls per decode token "
        f"(median of {args.tokens}; shared machine: noisy)"
    )
    print(f"  {med * 1e3:.1f} ms/token = {1 / med:.1f} tok/s (kernels only, no engine)")
    for k, v in split.items():
        print(f"  {k:10} {v / args.tokens * 1e3:7.1f} ms/token (mean)")
    return 0


def _case(args, rng, name: str) -> str:
    """Time one case; returns its table row."""
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    from sdq.kernels import dequantize, matmul, matmul_q, quantize_activation

    qname, rows, cols, nset = CASES[name]
    nset = args.set_size or nset
    qt = QT[qname]
    T = args.tokens_per_call
    mats = [_random_matrix(rng, qt, rows, cols) for _ in range(nset)]
    x = rng.standard_normal((T, cols)).astype(np.float32)  # [T, cols]
    out = np.empty((T, rows), np.float32)  # [T, rows]
    qx = quantize_activation(x, qt)
    state = {"i": 0}

    def call_q():
        matmul_q(mats[state["i"] % nset], qt, rows, cols, qx, out)
        state["i"] += 1

    def call_full():
        matmul(mats[state["i"] % nset], qt, rows, cols, x, out)
        state["i"] += 1

    call_q()  # compile / first touch
    t_q, cpu_q = _times(call_q, args.repeats)
    t_full = _median_time(call_full, args.repeats)
    nbytes = mats[0].nbytes
    t_np = float("nan")
    if not args.no_numpy:
        wf = [dequantize(m, qt, rows, cols) for m in mats[: min(nset, 8)]]

        def call_np():
            np.dot(x, wf[state["i"] % len(wf)].T, out=out)
            state["i"] += 1

        call_np()
        t_np = _median_time(call_np, args.repeats)
    return (
        f"{name:16} {rows:>6}x{cols:<6} {nset:>4} {t_q * 1e6:>9.0f} {cpu_q * 1e6:>8.0f} "
        f"{nbytes / t_q / 1e9:>7.2f} {rows * cols * T / t_q / 1e9:>6.2f} {t_full * 1e6:>9.0f} "
        f"{t_np * 1e6:>12.0f} {t_np / t_q:>7.2f}"
    )


def run(args) -> int:
    if args.decode:
        return run_decode(args)
    import numba
    import numpy as np

    if args.threads:
        numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(
        f"threads={numba.get_num_threads()}  tokens per call={args.tokens_per_call}  "
        f"repeats={args.repeats}  (wall: median; cpu: mean process CPU time per call; "
        "shared machine: timings are noisy)"
    )
    print(
        f"{'case':16} {'shape':>13} {'set':>4} {'us/call':>9} {'cpu us':>8} {'GB/s':>7} "
        f"{'Gw/s':>6} {'+quant us':>9} {'numpy f32 us':>12} {'speedup':>7}"
    )
    for name in args.cases.split(","):
        print(_case(args, rng, name), flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sdq.measure.kernels", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
