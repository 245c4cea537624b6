"""Benchmarks (scripts, not tests): ratios against peers measured in the same run."""
