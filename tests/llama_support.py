"""What the tests that compare sdq with llama.cpp share: the text and token ids they feed both
engines, and llama.cpp opened with every position's logits and its KV cache in F32 (as sdq
keeps it), so that a comparison measures weights and activation paths, not an F16 cache."""

import numpy as np

from sdq.measure.llama_ref import open_llama

GGML_TYPE_F32 = 0
N_UBATCH = 64
TEXT = (
    "Mixture-of-experts models route every token to a few of many feed-forward experts. "
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～ нещо на Български "
    "The storage hierarchy has three levels: caches, main memory and the disk, 3333 33."
)


def random_tokens(n: int, seed: int) -> list[int]:
    """Ordinary (non-control) token ids of the Qwen2 vocabulary."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, 151_643, n)]


def llama(path, n_ctx: int, **kwargs):
    """kwargs go to llama_cpp.Llama (flash_attn=True...)."""
    return open_llama(
        path,
        n_ctx=n_ctx,
        n_ubatch=N_UBATCH,
        threads=2,
        logits_all=True,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        **kwargs,
    )


def llama_logits(path, tokens, **kwargs) -> np.ndarray:
    """kwargs go to llama() (flash_attn=True...)."""
    llm = llama(path, len(tokens) + 8, **kwargs)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)  # [T, V]


def llama_greedy(path, prompt: list[int], n: int) -> list[int]:
    """llama.cpp's greedy continuation: n tokens, each the argmax after the ones before."""
    llm = llama(path, len(prompt) + n)
    llm.eval(prompt)
    theirs = []
    for _ in range(n):
        theirs.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(theirs[-1:])
    return theirs


def llama_cpp_sums_as_sdq() -> bool:
    """Whether this llama.cpp build rounds as sdq's kernels do: ggml's x86 AVX512 kernels, whose
    lane orders, FMAs and vector exp sdq.kernels.ops reproduces (and whose K-quant products
    sdq.kernels.kquant_ref describes). Builds for other CPUs (AVX2
    only, ARM) sum F32 products and apply the vector exp in other lane widths; there the two
    engines agree only to float rounding."""
    import llama_cpp

    return "AVX512 = 1" in llama_cpp.llama_print_system_info().decode()


def exact_bar(rounding_bar: float) -> float:
    """The teacher-forced top-1 bar for a Q8_0 or Q4_K_M file: 99 % where llama.cpp rounds as
    sdq does (on such a build every family but deepseek2 measured 260/260 with bit-identical
    logits, in both types), else `rounding_bar`, the family's measured level when the two
    differ in the last bit."""
    return 0.99 if llama_cpp_sums_as_sdq() else rounding_bar
