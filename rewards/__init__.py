"""Rewards: success (the task's grader), ORM and PRM with the Clip/Delta refinements, placed on tokens;
step segmentation; reward-model loading and training. May import ``eval``, ``models``, ``mathtask``
and ``common``.
"""
