"""Rewards: success (the shared grader), ORM and PRM with Clip/Delta refinements, placed on tokens."""
