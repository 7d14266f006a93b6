"""Reward functions a user might write, right and wrong, for tests/rewards/test_user_fn.py (imported by path, as
realm imports a user's file)."""

from __future__ import annotations

import time


def length_bonus(prompt, response, answer, metadata):
    return len(response) / 100.0


def first_step_only(prompt, response, answer, metadata):
    return [1.0] + [0.0] * (len(metadata["steps"]) - 1)


def echo_metadata(prompt, response, answer, metadata):
    return float(len(metadata["steps"]) * 10 + metadata["truncated"])


def raises(prompt, response, answer, metadata):
    return {"a": 1}["b"]


def sleeps(prompt, response, answer, metadata):
    time.sleep(30)
    return 0.0


def not_a_number(prompt, response, answer, metadata):
    return float("nan")


def one_value_too_many(prompt, response, answer, metadata):
    return [0.5] * (len(metadata["steps"]) + 1)


def a_string(prompt, response, answer, metadata):
    return "good"


def two_arguments(prompt, response):
    return 0.0


def batched_lengths(prompts, responses, answers, metadatas):
    return [float(len(r)) for r in responses]


def batched_short(prompts, responses, answers, metadatas):
    return [0.0]
