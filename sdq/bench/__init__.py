"""Benchmarks run by `sdq bench NAME`: each module defines add_arguments(parser) and run(args)."""
