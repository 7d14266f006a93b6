"""Shared code with no project knowledge: atomic file writes, config helpers, progress lines, dtypes,
the worker environment defaults and learning-rate schedules.

Imports no other project package (the bottom of the layer line in the README).
"""
