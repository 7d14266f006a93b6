"""common/cli.py: one error line, close matches, sweeps expanded into the jobs Hydra will run."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from common.cli import ArgumentParser, did_you_mean, dotted_keys, positive, sweep_jobs


def test_did_you_mean_names_at_most_the_two_closest():
    assert did_you_mean("ppo.clip_esp", ["ppo.clip_eps", "ppo.gamma"]) == " (did you mean ppo.clip_eps?)"
    assert did_you_mean("zzz", ["ppo.clip_eps"]) == ""


def test_dotted_keys_include_nested_ones():
    assert dotted_keys(OmegaConf.create({"a": {"b": 1}, "c": 2})) == ["a", "a.b", "c"]


def test_sweep_jobs_are_every_combination_with_other_overrides_as_typed():
    jobs = sweep_jobs(["run.seed=0,1", "+reward=success,prm", "run.name=x"])
    assert jobs == [
        ["run.seed=0", "+reward=success", "run.name=x"],
        ["run.seed=0", "+reward=prm", "run.name=x"],
        ["run.seed=1", "+reward=success", "run.name=x"],
        ["run.seed=1", "+reward=prm", "run.name=x"],
    ]


def test_positive_numbers():
    assert positive(int)("3") == 3 and positive(float)("0.5") == 0.5
    for bad in ("0", "-4", "x"):
        with pytest.raises(Exception, match="must be > 0|not an integer"):
            positive(int)(bad)


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="prog", renamed={"--gpu": "--hardware"})
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--num-nodes", type=positive(int), required=True)
    return parser


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--gpu", "h100", "--num-nodes", "1"], "error: unknown option --gpu (now --hardware) (see prog --help)"),
        (["--num-node", "1"], None),  # argparse's abbreviation of --num-nodes: accepted
        (["--hardwre", "x"], "error: unknown option --hardwre (did you mean --hardware?) (see prog --help)"),
        (["--num-nodes", "0"], "error: argument --num-nodes: 0 must be > 0 (see prog --help)"),
        ([], "error: the following arguments are required: --num-nodes (see prog --help)"),
    ],
)
def test_argument_errors_are_one_line_and_exit_status_1(argv, line, capsys):
    if line is None:
        assert _parser().parse_args(argv).num_nodes == 1
        return
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(argv)
    assert info.value.code == 1 and capsys.readouterr().err == line + "\n"
