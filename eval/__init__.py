"""Evaluation: answer grading, datasets, generation-agnostic evaluate(), reports.

Import rule: nothing here imports `trainer` or `reallocation`; generation comes in as a function.
"""
