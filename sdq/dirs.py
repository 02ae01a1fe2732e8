"""The cache folder for files sdq makes or fetches and can always make again.

`$SDQ_CACHE_DIR` if set, else `~/.cache/sdq`. It holds `vocab/` (the Qwen2 tokenizer file,
see `sdq.synth.vocab`) and `models/` (synthetic GGUF models, see `sdq.synth.build`). Deleting
it is always safe. (The other caches have other names: the OS page cache is `cache_mode`, the
expert cache is `sdq.paging.cache`, Numba keeps compiled kernels in `__pycache__`.)
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SDQ_CACHE_DIR"


def cache_root() -> Path:
    """The cache folder (not created here)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "sdq"


def cache_subdir(name: str) -> Path:
    """`<cache>/<name>/`, created if missing."""
    path = cache_root() / name
    path.mkdir(parents=True, exist_ok=True)
    return path
