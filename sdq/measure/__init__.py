"""Measuring: the storage device, the engine against its peers, memory limits, suites.

    probe.py, device.py, fio.py, probe_engine.py
                    device latency and bandwidth vs concurrency and chunking (T1), next to fio
    limits.py       memory limits on a child (RLIMIT_DATA, cgroup v1) and page-cache dropping
    llama_ref.py    llama.cpp (llama-cpp-python) opened as the reference
    layer_miss.py   one layer, every expert a miss: serial vs parallel vs split reads (T3)
    resident.py     sdq vs llama.cpp with every weight in RAM
    peers.py        sdq vs llama.cpp under the same memory cap, each run a child process (T12)
    optimum.py      a run's decode routing, its best possible cache, the token time split
    routing.py      greedy decodes over a prompt set: their routing and its locality
    ceiling.py      the I/O ceiling and bound of a capped run, and how far the run got (T12_limits)
    kernels.py      kernel speed (`python -m sdq.measure.kernels`)
    experiments/    suites of `sdq chat` runs: subprocess per configuration, repeats, medians

May import: sdq.run, sdq.paging, sdq.format, sdq.kernels, sdq.synth, sdq.analysis and the
base modules; never sdq.lab or sdq.commands.
"""
