"""Running a model: the memory plan, the forward pass, generation and its statistics.

    plan.py       the memory plan: every buffer counted before it is allocated -> arena slots
    workspace.py  the activation buffers one forward pass needs, sized for a ubatch
    engine.py     the forward pass (qwen3moe, qwen35moe) on Numba kernels, experts from the pager
    qwen35_reference.py  qwen35moe's forward pass in plain NumPy (float64), to check the engine
    sampler.py    greedy / temperature / top-k / top-p sampling
    generate.py   prefill in ubatches, decode, per-token timing and figures (DESIGN metrics)
    settings.py   RunSettings: what a run is set to, and the one way flags become it (from_args)
    session.py    RunSettings -> a plan, a pager, an engine and a tokenizer, ready to generate
    runtime.py    Model: a session for programs (sdq.load, sdq serve, chat -cnv): text or chat
                  messages in, completions or streamed tokens out, conversations on a kept KV cache

May import: sdq.format, sdq.kernels, sdq.paging and the base modules; never sdq.measure,
sdq.lab or sdq.commands.
"""
