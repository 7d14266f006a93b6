"""The math task: problems, datasets (GSM8K, MATH, synthetic arithmetic), prompts and the answer grader.

The training reward (``rewards``) and the evaluation harness (``eval``) both grade with it, so they
cannot disagree. May import ``common`` only.
"""
