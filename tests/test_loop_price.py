"""benchmarks/loop_price.py: each loop's call beside the simulator's price of it, computed from the topology."""

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("loop_price", Path(__file__).parents[1] / "benchmarks" / "loop_price.py")
loop_price = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(loop_price)


class _Topology:
    """What a call after ``phase`` of compute pays besides its steps: a wake and a rise of 0.1 ms per ms."""

    def collective_wake(self, phase, algo=None):
        return (3e-4 if algo == "ring" else 5e-4) + 0.1 * phase


def test_each_loop_is_priced_as_its_steps_and_the_topologys_wake():
    rows = loop_price.loop_rows(_Topology(), [1e-3, 8e-3], [2.5e-3, 4.0e-3], 2e-3, "ring")
    assert [(p, c) for p, c, _ in rows] == [(1e-3, 2.5e-3), (8e-3, 4.0e-3)]
    assert [priced for _, _, priced in rows] == pytest.approx([2e-3 + 3e-4 + 1e-4, 2e-3 + 3e-4 + 8e-4])
    ps = loop_price.loop_rows(_Topology(), [1e-3], [1e-3], 1e-3, "ps")
    assert ps[0][2] == pytest.approx(1e-3 + 5e-4 + 1e-4)


def test_a_profile_without_phase_loops_has_no_rows():
    assert loop_price.profile_rows({"ring": {"2": [1e-4, 1e9]}}, profile=None) == {}
    assert loop_price.profile_rows({"samples": {"shared": {"2": {"phases": {}}}}}, profile=None) == {}
