"""Choosing an execution plan: the plan format (``execution_plan``), the cost model (``estimator``),
candidates, plan builders (realm's defaults and the ReaL-paper baselines), the search and its CLI, and
the profiler that calibrates the cost model. Pure apart from the profiler's measurements.
May import ``models``, ``reallocation`` and ``common``.
"""
