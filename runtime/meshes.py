"""A call's devices as a 2-D grid, and the process groups it needs (pure; no torch.distributed).

A call with ``dp x tp`` devices (``pp`` = 1) runs on a grid
of ``dp`` rows, one per model replica (training: one FSDP shard index; inference: one replica),
each row the ``tp`` devices of one tensor-parallel group. Devices are taken in sorted order, row
after row, so that every row and every column is itself sorted: ``dist.new_group`` orders its
ranks that way, and the mesh's coordinates must agree with the groups' rank order::

    grid_of((7, 4, 5, 6), tp=2)         == ((4, 5), (6, 7))   # 2 replicas of TP 2
    grid_groups(((4, 5), (6, 7)))       == [(4, 5), (4, 5, 6, 7), (4, 6), (5, 7), (6, 7)]
    dp_index(((4, 5), (6, 7)), 7)       == 1                  # device 7 trains replica 1's rows

Data follows the rows: the tp devices of a row see the same batch rows (the same minibatch
shares for an update, the same slice for inference) and only the row's first device reports
inference outputs.

With ``pp > 1`` a call runs in pipeline stages: a training call's stages are grids of their own
(``staged_grid``), an inference call's replicas are ``pp`` stages of ``tp`` devices
(``pipelines_of``); row r of every stage sees data share r, and the last stage's first device of
each row reports. With ``pp = 1`` an inference replica is one grid row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Grid = tuple[tuple[int, ...], ...]


def grid_of(devices: Iterable[int], tp: int) -> Grid:
    """``devices`` (sorted) as rows of ``tp``: [dp][tp] device ids."""
    ordered = sorted(devices)
    if tp < 1 or len(ordered) % tp:
        raise ValueError(f"{len(ordered)} devices cannot form rows of tp={tp}")
    return tuple(tuple(ordered[i : i + tp]) for i in range(0, len(ordered), tp))


def grid_groups(grid: Grid) -> list[tuple[int, ...]]:
    """The device sets that need a process group for a model sharded over ``grid``, sorted: the
    whole grid (more than one device), and with tp > 1 every row (TP) and every column (FSDP;
    a column of one device too, since a 2-D DeviceMesh needs a group per dimension)."""
    devices = tuple(sorted(d for row in grid for d in row))
    groups = {devices} if len(devices) > 1 else set()
    if len(grid[0]) > 1:
        groups.update(grid)
        groups.update(tuple(column) for column in zip(*grid))
    return sorted(groups)


def row_of(grid: Grid, device: int) -> tuple[int, ...]:
    """The TP group (one model replica) holding ``device``."""
    return next(row for row in grid if device in row)


def column_of(grid: Grid, device: int) -> tuple[int, ...]:
    """The data-parallel group of ``device``: the devices at its TP index in every row."""
    return tuple(row[row_of(grid, device).index(device)] for row in grid)


def global_grid(grid: Grid, rank_of: Sequence[int] | dict[int, int]) -> list[list[int]]:
    """``grid`` in global ranks (``rank_of[device]``), the ``mesh`` that ``DeviceMesh.from_group`` takes."""
    return [[rank_of[d] for d in row] for row in grid]


@dataclass(frozen=True)
class Pipeline:
    """A model cut into stages: ``stages[s]`` is stage s's grid (dp rows x tp devices; an inference
    replica's stages are one row each). The device at (row, column) of one stage passes activations
    to the device at the same place in the next: those devices form a pipeline column."""

    stages: tuple[Grid, ...]

    @classmethod
    def of_rows(cls, *rows: tuple[int, ...]) -> Pipeline:
        """An inference replica: one row of tp devices per stage."""
        return cls(tuple((row,) for row in rows))

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(sorted(d for stage in self.stages for row in stage for d in row))

    @property
    def devices_in_order(self) -> tuple[int, ...]:
        """Stage by stage, row by row: a vLLM engine's rank order (stage x tp + tp rank)."""
        return tuple(d for stage in self.stages for row in stage for d in row)

    @property
    def leader(self) -> int:
        """The device that reports a replica's outputs: the last stage's first."""
        return self.stages[-1][0][0]

    def stage_of(self, device: int) -> int:
        return next(s for s, stage in enumerate(self.stages) if any(device in row for row in stage))

    def column(self, device: int) -> tuple[int, ...]:
        """The devices at ``device``'s place in every stage, first stage first."""
        stage = self.stages[self.stage_of(device)]
        r = next(i for i, row in enumerate(stage) if device in row)
        c = stage[r].index(device)
        return tuple(g[r][c] for g in self.stages)


def pipelines_of(devices: Iterable[int], pp: int, tp: int) -> list[Pipeline]:
    """An inference call's model replicas, each ``pp`` stages of ``tp`` devices, in ``Layout``'s
    row-major ``(pp, dp, tp)`` order over the sorted devices: replica r's stage s is the tp devices
    from index ``(s * dp + r) * tp``. Stages are outermost, so a call spread over nodes puts each
    stage on one node and only stage boundaries cross them (as Megatron-LM orders pp)::

        pipelines_of((0, 1, 2, 3), pp=2, tp=1) == [Pipeline.of_rows((0,), (2,)), Pipeline.of_rows((1,), (3,))]
        pipelines_of((4, 5, 6, 7), pp=1, tp=2) == [Pipeline.of_rows((4, 5)), Pipeline.of_rows((6, 7))]  # grid rows
    """
    ordered = sorted(devices)
    if pp < 1 or tp < 1 or len(ordered) % (pp * tp):
        raise ValueError(f"{len(ordered)} devices cannot form pipelines of pp={pp} x tp={tp}")
    dp = len(ordered) // (pp * tp)
    return [
        Pipeline.of_rows(*(tuple(ordered[(s * dp + r) * tp : (s * dp + r + 1) * tp]) for s in range(pp)))
        for r in range(dp)
    ]


def staged_grid(devices: Iterable[int], pp: int, tp: int) -> Pipeline:
    """A training call's ``pp x dp x tp`` devices: stage s is the grid (``grid_of``) of the sorted
    devices ``s * dp * tp`` onwards; row r of every stage trains on data-parallel share r, so the
    rows of replica r are ``pipelines_of``'s replica r::

        staged_grid(range(8), pp=2, tp=2).stages == (((0, 1), (2, 3)), ((4, 5), (6, 7)))
    """
    ordered = sorted(devices)
    if pp < 1 or tp < 1 or len(ordered) % (pp * tp):
        raise ValueError(f"{len(ordered)} devices cannot form pp={pp} stages of rows of tp={tp}")
    size = len(ordered) // pp
    return Pipeline(tuple(grid_of(ordered[s * size : (s + 1) * size], tp) for s in range(pp)))


def pipeline_groups(pipeline: Pipeline) -> list[tuple[int, ...]]:
    """The device sets a pipelined model needs a process group for, sorted: each stage's
    (``grid_groups``) and, with pp > 1, every pipeline column (activations), every column's first
    and last device (the shared embedding's gradients) and the whole model (checkpoints)."""
    groups = {g for stage in pipeline.stages for g in grid_groups(stage)}
    if len(pipeline.stages) > 1:
        groups.add(pipeline.devices)
        for column in (pipeline.column(d) for row in pipeline.stages[0] for d in row):
            groups.add(tuple(sorted(column)))
            groups.add(tuple(sorted((column[0], column[-1]))))
    return sorted(groups)
