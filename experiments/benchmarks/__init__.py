"""Benchmarks of the ops against the memory-read floor measured in the same run (``python -m experiments.benchmarks.ops``)."""
