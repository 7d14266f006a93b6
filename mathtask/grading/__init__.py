"""Internals of the answer grader; the public API is `mathtask.grade`."""
