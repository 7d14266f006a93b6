"""Runs an execution plan, split by where the code runs: ``topology`` and ``meshes`` (pure: what a plan
means per device), ``placement`` (the only module that imports ray), ``device/`` (the device process
and the model shards it hosts) and ``driver`` (the driver's PlanRuntime). May import every package
below it in the README's layer line; ``device/`` never imports ``driver`` or ``placement``.
"""
