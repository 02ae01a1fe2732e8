"""The expert pager: routed experts move from the model file into a fixed RAM arena.

    reads.py     the C read pool's Python side (sdq._io): read tables per layer, I/O and
                 page-cache modes (`--io-mode`, `--cache-mode`: the OS page cache)
    arena.py     the Arena: one anonymous mapping (huge pages) cut into expert slots
    cache.py     the expert cache: acquire / release / prefetch, pins, handles, counters
    residents.py which expert is in which cache slot, recency orders, request scores
    policies.py  replacement policies (`--cache-policy`) and the slots each one needs
    prefetch.py  next-layer prefetch into streaming slots (lrfu_bypass); the prefetch width
    views.py     an expert's gate / up / down as views of its slot
    pack.py      the pack (`sdq pack`): every expert as one aligned record, one read each
    checksums.py per-expert checksums of the file's bytes (`--verify`)
    route_log.py the route log (`--route-log`): JSON lines of the router's choices
    io_profile.py the I/O settings a probe recommends (`sdq probe --profile-out`)
    device_model.py storage device models (`--device-model`): fitted from a probe or a table,
                 replayed by the read pool (emulation)

"cache" in this folder means the expert cache (slots of the arena), never the OS page cache,
which is named `page cache` and set by `cache_mode`.

May import: sdq.format and the base modules (sdq.errors, sdq.units, sdq.files, sdq._io).
"""
