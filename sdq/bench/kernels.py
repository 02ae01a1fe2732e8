"""`python -m sdq.bench.kernels`: matrix-vector speed of the quantized kernels.

For each case (the decode-time shapes of the seed-shaped mini model) it times
``matvec_q`` (activations already quantized, as the engine does for gate and up) and
``matvec`` (quantizing x inside), median of repeats, and prints the weight bytes streamed
per second, weights per second, and the ratio to NumPy's float32 BLAS matrix-vector product
on the same weights dequantized (which streams 4 bytes per weight).

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


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(args) -> int:
    import numba
    import numpy as np
    from gguf import GGMLQuantizationType as QT
    from gguf.constants import GGML_QUANT_SIZES

    from sdq.kernels import dequantize, matvec, matvec_q, quantize_activation

    if args.threads:
        numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(
        f"threads={numba.get_num_threads()}  repeats={args.repeats}  (median; shared machine: "
        "timings are noisy)"
    )
    header = (
        f"{'case':16} {'shape':>13} {'set':>4} {'us/call':>9} {'GB/s':>7} {'Gw/s':>6} "
        f"{'+quant us':>9} {'numpy f32 us':>12} {'speedup':>7}"
    )
    print(header)
    for name in args.cases.split(","):
        qname, rows, cols, nset = CASES[name]
        nset = args.set_size or nset
        qt = QT[qname]
        bs, ts = GGML_QUANT_SIZES[qt]
        nb = rows * cols // bs
        mats = []
        for _ in range(nset):
            raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
            offs = {QT.Q6_K: [208], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2]}.get(qt, [0])
            for o in offs:
                d = rng.uniform(-0.01, 0.01, nb).astype(np.float16)
                raw[:, o : o + 2] = d.view(np.uint8).reshape(nb, 2)
            mats.append(raw.reshape(rows, -1))
        x = rng.standard_normal(cols).astype(np.float32)
        out = np.empty(rows, np.float32)
        qx = quantize_activation(x, qt)
        state = {"i": 0}

        def call_q():
            matvec_q(mats[state["i"] % nset], qt, rows, cols, qx, out)
            state["i"] += 1

        def call_full():
            matvec(mats[state["i"] % nset], qt, rows, cols, x, out)
            state["i"] += 1

        call_q()  # compile / first touch
        t_q = _median_time(call_q, args.repeats)
        t_full = _median_time(call_full, args.repeats)
        nbytes = mats[0].nbytes
        t_np = float("nan")
        if not args.no_numpy:
            wf = [dequantize(m, qt, rows, cols) for m in mats[: min(nset, 8)]]

            def call_np():
                np.dot(wf[state["i"] % len(wf)], x, out=out)
                state["i"] += 1

            call_np()
            t_np = _median_time(call_np, args.repeats)
            del wf
        print(
            f"{name:16} {rows:>6}x{cols:<6} {nset:>4} {t_q * 1e6:>9.0f} {nbytes / t_q / 1e9:>7.2f} "
            f"{rows * cols / t_q / 1e9:>6.2f} {t_full * 1e6:>9.0f} {t_np * 1e6:>12.0f} "
            f"{t_np / t_q:>7.2f}"
        )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sdq.bench.kernels", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
