"""Benchmarks: scripts that print speed ratios against a baseline measured in the same run (see README)."""
