"""The optimizer step is priced as the executor's own step op was timed (an overhead and a rate fitted
over the calibrated models), and ranks keep freed memory so a step pays no page faults."""

import subprocess
import sys
import textwrap

import pytest

from simpar.calibrate.fits import fit_optimizer_step
from simpar.calibrate.profile import HardwareProfile
from simpar.plan import Compute
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan
from simpar.validate import case_scenario


def _profile(**extra) -> HardwareProfile:
    return HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                           compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                           ring={"2": [50e-6, 2e9]},
                           optimizer_params_per_s={"adam": 1e8, "sgd": 4e8}, copy_bytes_per_s=1e10, **extra)


def _rows(overhead: float, rate: float) -> list[dict]:
    """compute_worker's rows: three unit kinds per model and batch, each carrying the model's step."""
    return [{"model": name, "batch": b, "unit": kind, "fwd_flops": f * b, "bwd_flops": 2 * f * b,
             "fwd_s": 10e-6 + f * b / 1e10, "bwd_s": 20e-6 + 2 * f * b / 1e10,
             "params": params, "step_s": overhead + params / rate}
            for name, params in (("tiny", 118_528), ("small", 932_608)) for b in (1, 2, 4)
            for kind, f in (("embedding", 1e5), ("layer", 4e6), ("head", 2e6))]


def _step_seconds(profile: HardwareProfile, strategy: str) -> tuple[float, int]:
    scenario = case_scenario(strategy, 2, "fp32")
    plan = build_plan(scenario)
    costs = OpCosts(plan, scenario, profile.topology(2, "fp32"))
    program = plan.program_of(0)
    (step,) = [op for op in program.ops if isinstance(op, Compute) and op.phase == "step"]
    return costs.compute_time(program, step), step.params


def test_the_step_op_fit_recovers_the_line_through_the_models():
    assert fit_optimizer_step(_rows(0.5e-3, 2.3e8)) == pytest.approx([0.5e-3, 2.3e8])
    assert fit_optimizer_step([{k: v for k, v in row.items() if k != "step_s"}
                                         for row in _rows(0.5e-3, 2.3e8)]) == []  # rows from before
    one_model = [row for row in _rows(0.5e-3, 2.3e8) if row["model"] == "tiny"]
    assert fit_optimizer_step(one_model) == []  # one size: no line


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero3", "pp"])
def test_the_simulator_prices_a_ranks_step_as_the_overhead_plus_its_parameters_at_the_rate(strategy):
    fitted = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]})
    seconds, params = _step_seconds(fitted, strategy)
    assert seconds == pytest.approx(0.5e-3 + params / 2.3e8)
    before = _profile()  # a profile from before the step op was timed: Adam's bare-tensor rate alone
    assert _step_seconds(before, strategy)[0] == pytest.approx(params / 1e8)


_STEPS = textwrap.dedent("""
    import ctypes, resource, sys, torch
    from simpar.real.allocator import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()

    class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2: every field a size_t
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    mallinfo2.restype = MallInfo2

    def step():  # a step's activations: 16 tensors of 0.25-2 MiB (15 MiB) made, then freed
        before, mapped_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, mallinfo2().hblkhd
        held = [torch.ones(n) for n in (64 * 2**10, 128 * 2**10, 256 * 2**10, 512 * 2**10) * 4]
        mapped = mallinfo2().hblkhd - mapped_before
        del held
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, mapped, mallinfo2().fordblks
    print(*[" ".join(map(str, step())) for _ in range(10)], sep="\\n")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_rank_that_keeps_freed_memory_takes_no_page_faults_once_its_heap_has_grown():
    """By default glibc serves each tensor of 128 KiB or more from fresh mmap pages and gives them back
    when freed (one fault per 4 KiB when written again); kept, the
    tensors come from the heap, which keeps what is freed, and a step reuses the last one's pages."""
    def steps(mode: str) -> list[tuple[int, int, int]]:
        run = subprocess.run([sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return [tuple(map(int, line.split())) for line in run.stdout.splitlines()]

    default = steps("default")
    assert default[0][1] > 2**20  # the first step's larger tensors were mmapped, each on its own pages
    assert default[0][0] > 3000  # 15 MiB of fresh pages
    kept = steps("keep")
    assert all(mapped == 0 for _, mapped, _ in kept)  # none of the step's tensors from mmap
    assert all(free >= 15 * 2**20 for _, _, free in kept)  # what a step freed stays in the heap
    assert sum(faults for faults, _, _ in kept[3:]) < 300  # and the steps after the first few reuse it
