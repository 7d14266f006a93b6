"""common.progress: tqdm's format as whole lines where there is no terminal."""

from __future__ import annotations

from common.progress import Progress, progress_line


def test_progress_line_worked_examples():
    assert progress_line(3, 10, 42.0, "[iter]", "iter", postfix="success 0.5") == (
        "[iter] 3/10 (30%) [00:42<01:38, 14.00s/iter, success 0.5]"
    )
    # Resumed at 3: 2 problems in 10 s is 5 s each, 5 left -> ETA 25 s.
    assert (
        progress_line(5, 10, 10.0, "[eval]", "problem", initial=3) == "[eval] 5/10 (50%) [00:10<00:25,  5.00s/problem]"
    )


def test_lines_every_n_units_and_the_last():
    lines: list[str] = []
    with Progress(25, "[sft]", unit="step", every=10, log=lines.append) as progress:
        for _ in range(25):
            progress.update(1, "loss 1.0")
    assert [line.split(" (")[0] for line in lines] == ["[sft] 10/25", "[sft] 20/25", "[sft] 25/25"]
    assert all(line.endswith(", loss 1.0]") for line in lines)


def test_no_terminal_means_lines_on_stderr_not_a_bar(capsys):
    progress = Progress(2, "[eval]", unit="problem")  # pytest's stderr is not a terminal
    progress.update(2)
    progress.close()
    err = capsys.readouterr().err
    assert err.startswith("[eval] 2/2 (100%) [") and "\r" not in err and err.count("\n") == 1
