"""The evaluation harness: ``evaluate()`` over any generate function, metrics (pass@k, maj@k), reports,
run comparison, best-of-N and the ``python -m eval`` CLI. May import ``mathtask`` and ``common``.
"""
