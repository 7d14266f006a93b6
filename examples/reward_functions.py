"""Two reward functions of a user's own, for ``reward.function=examples/reward_functions.py:NAME``
(docs/rewards.md, "Your own reward function"). Each takes the problem's question, the policy's response, the gold
answer and a metadata dict (``problem_id``, ``dataset``, ``prompt_text``, ``steps``, ``truncated``).

    python train.py reward.function=examples/reward_functions.py:boxed_format reward.function_weight=0.2
    python train.py +reward=prm_clip_delta reward.function=examples/reward_functions.py:step_brevity

The response is untrusted model text: these read it as a string and never evaluate it.
"""

from __future__ import annotations

import re

BOXED = re.compile(r"\\boxed\{[^{}]*\}")


def boxed_format(prompt: str, response: str, answer: str, metadata: dict) -> float:
    """An outcome (format) reward: 1 when the response has exactly one ``\\boxed{...}``, in its last paragraph,
    and was not cut off by the token cap, else 0. Worked example: "2 + 2 = 4\\n\\nSo \\boxed{4}." -> 1.0;
    "\\boxed{4}\\n\\n\\boxed{5}" -> 0.0; "\\boxed{4}\\n\\nDone." -> 0.0."""
    if metadata.get("truncated"):
        return 0.0
    last_paragraph = response.strip().split("\n\n")[-1]
    return 1.0 if len(BOXED.findall(response)) == 1 and BOXED.search(last_paragraph) else 0.0


def step_brevity(prompt: str, response: str, answer: str, metadata: dict) -> list[float]:
    """A per-step (dense) penalty: -0.01 for every character a step's content has beyond 40, one value per step
    of ``metadata["steps"]`` (as realm cuts the response). Worked example: steps "1 + 2 = 3" and 50 x "a" ->
    [0.0, -0.1]."""
    return [-0.01 * max(0, len(step) - 40) for step in metadata["steps"]]
