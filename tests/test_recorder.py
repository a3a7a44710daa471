"""What a run reports of its ops: each op's mean over the steps after the first, as its step time is the
mean of those steps; a long run's losses on one line."""

from types import SimpleNamespace

import pytest
import torch

from simpar.real.instrument import Recorder


def _recorder_with_clock(monkeypatch) -> tuple[Recorder, list[float]]:
    recorder, now = Recorder(torch.device("cpu")), [0.0]
    monkeypatch.setattr(recorder, "clock", lambda: now[0])
    return recorder, now


def test_each_op_is_reported_by_its_mean_over_the_steps_after_the_first(monkeypatch):
    """Three steps: the first (warm-up) takes 10 s an op and is left out; the op means are of steps 2 and 3,
    and the timeline stays the last step's."""
    recorder, now = _recorder_with_clock(monkeypatch)
    ops = [SimpleNamespace(id=4, stream="compute", kind="fwd", phase="fwd"),
           SimpleNamespace(id=7, stream="compute", kind="bwd", phase="bwd")]
    monkeypatch.setattr("simpar.real.instrument.op_class", lambda op: "forward" if op.id == 4 else "backward")
    for seconds in ((10.0, 10.0), (1.0, 2.0), (3.0, 6.0)):
        recorder.start_step()
        for op, length in zip(ops, seconds):
            started = now[0]
            now[0] += length
            recorder.time_op(op, started)
        recorder.end_step()
    assert recorder.op_means() == {4: pytest.approx(2.0), 7: pytest.approx(4.0)}
    assert [(e["op"], e["end"] - e["start"]) for e in recorder.timeline] == [(4, 3.0), (7, 6.0)]


def test_a_one_step_run_reports_its_only_step(monkeypatch):
    recorder, now = _recorder_with_clock(monkeypatch)
    monkeypatch.setattr("simpar.real.instrument.op_class", lambda op: "forward")
    recorder.start_step()
    now[0] = 1.5
    recorder.time_op(SimpleNamespace(id=3, stream="compute"), 0.5)
    recorder.end_step()
    assert recorder.op_means() == {3: pytest.approx(1.0)}


def test_a_long_runs_losses_are_shown_first_and_last():
    from simpar.cli.common import loss_summary

    assert loss_summary([5.5, 5.4]) == "5.5000, 5.4000"
    assert loss_summary([float(i) for i in range(150)]) == "0.0000, 1.0000, 2.0000, ..., 147.0000, 148.0000, 149.0000"
