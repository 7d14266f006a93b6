"""The reward-hacking study: does a policy trained on raw PRM rewards pad its answers with steps, and do Clip
and Delta stop it? ``round2`` summarizes round 2's committed runs (docs/hacking_study.md); ``round3`` holds round
3's pre-registered definitions, its pilot's decision and its summary (docs/hacking_study/round3/)."""
