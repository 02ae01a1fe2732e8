"""Routing analysis: what an expert cache can and cannot win, from recorded routing.

    trace.py       RouteTrace: per sequence, per phase, [tokens, layers, K] expert ids
    readers.py     sdq route logs and the published Granite / Mixtral / DeepSeek traces
    simulate.py    cache policies over lookup groups (Numba kernel + plain-Python reference)
    optimal.py     the fewest misses with bypass allowed (min-cost flow)
    replay.py      a trace through a policy: per-layer or global scope, sweeps
    reuse.py       reuse in a token window, U(k) unions, per-layer popularity
    locality.py    a decode's locality against the seed's figures (the router's targets)
    ngram.py       prompt-lookup drafting and the expert reads of batch verification
    engine_log.py  attach token ids to sdq's own route log (`sdq chat --route-log`)
    tables.py      the tables of notebook 02 (T6-T8) as DataFrames
    coactivation.py which experts a token uses together: the order of a pack (sdq pack)

Command line: `sdq routes simulate TRACE`, `sdq routes stats TRACE`.

May import: sdq.kernels (the JIT flags), sdq.format and the base modules.
"""
