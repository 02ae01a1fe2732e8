"""The expert pager: routed experts move from the model file into a fixed RAM arena.

    reads.py     the C read pool's Python side (sdq._io): read tables per layer, I/O and
                 page-cache modes (`--io-mode`, `--cache-mode`: the OS page cache)
    cache.py     the expert cache (`--cache-policy`): arena slots, pins, handles, counters
    io_profile.py the I/O settings a probe recommends (`sdq probe --profile-out`)

"cache" in this folder means the expert cache (slots of the arena), never the OS page cache,
which is named `page cache` and set by `cache_mode`.

May import: sdq.format and the base modules (sdq.errors, sdq.units, sdq.files, sdq._io).
"""
