"""The optimizer step is priced as the executor's own step op was timed (an overhead and a rate fitted
over the calibrated models), and ranks keep freed memory so a step pays no page faults."""

import subprocess
import sys
import textwrap

import pytest

import simpar.calibrate as calibrate
from simpar.calibrate.profile import HardwareProfile
from simpar.plan import Compute
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan
from simpar.validate import case_scenario


def _profile(**extra) -> HardwareProfile:
    return HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                           compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                           slowdown={"1": 1.0, "2": 1.0}, ring={"2": [50e-6, 2e9]},
                           optimizer_params_per_s={"adam": 1e8, "sgd": 4e8}, copy_bytes_per_s=1e10, **extra)


def _rows(overhead: float, rate: float) -> list[dict]:
    """compute_worker's rows: three unit kinds per model and batch, each carrying the model's step."""
    return [{"model": name, "batch": b, "unit": kind, "fwd_flops": f * b, "bwd_flops": 2 * f * b,
             "fwd_s": 10e-6 + f * b / 1e10, "bwd_s": 20e-6 + 2 * f * b / 1e10, "between_ops_s": 30e-6,
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
    assert calibrate.fit_optimizer_step(_rows(0.5e-3, 2.3e8)) == pytest.approx([0.5e-3, 2.3e8])
    assert calibrate.fit_optimizer_step([{k: v for k, v in row.items() if k != "step_s"}
                                         for row in _rows(0.5e-3, 2.3e8)]) == []  # rows from before
    one_model = [row for row in _rows(0.5e-3, 2.3e8) if row["model"] == "tiny"]
    assert calibrate.fit_optimizer_step(one_model) == []  # one size: no line


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero3", "pp"])
def test_the_simulator_prices_a_ranks_step_as_the_overhead_plus_its_parameters_at_the_rate(strategy):
    fitted = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]})
    seconds, params = _step_seconds(fitted, strategy)
    assert seconds == pytest.approx(0.5e-3 + params / 2.3e8)
    before = _profile()  # a profile from before the step op was timed: Adam's bare-tensor rate alone
    assert _step_seconds(before, strategy)[0] == pytest.approx(params / 1e8)


PER_TENSOR, PER_ELEMENT = 0.7e-6, 0.3e-9  # the gradients' concatenation inside the step op


def _rows_with_concat(overhead: float, rate: float) -> list[dict]:
    """``_rows`` whose step op begins with the gradients' concatenation, timed apart (``concat_s``)."""
    tensors = {"tiny": 36, "small": 68}
    return [{**row, "tensors": tensors[row["model"]],
             "concat_s": PER_TENSOR * tensors[row["model"]] + PER_ELEMENT * row["params"],
             "step_s": row["step_s"] + PER_TENSOR * tensors[row["model"]] + PER_ELEMENT * row["params"]}
            for row in _rows(overhead, rate)]


def test_the_step_fit_leaves_out_the_concatenation_timed_apart_and_fits_it_per_tensor_and_element():
    rows = _rows_with_concat(0.5e-3, 2.3e8)
    assert calibrate.fit_optimizer_step(rows) == pytest.approx([0.5e-3, 2.3e8])
    assert calibrate.fit_tensor_work(rows, "concat_s") == pytest.approx([PER_TENSOR, PER_ELEMENT])
    with_it = calibrate.fit_optimizer_step([{k: v for k, v in row.items() if k != "concat_s"} for row in rows])
    assert with_it[0] > 0.5e-3 and with_it[1] < 2.3e8  # not timed apart: the line holds it
    fresh = calibrate.retimed(_profile(optimizer_step={"fp32": [1e-3, 1e8]}), [rows], "fp32")
    assert fresh.optimizer_step["fp32"] == pytest.approx([0.5e-3, 2.3e8])
    assert fresh.step_concat["fp32"] == pytest.approx([PER_TENSOR, PER_ELEMENT])


@pytest.mark.parametrize("strategy, concatenates", [("ddp", True), ("dp", True), ("zero1", True), ("pp", True),
                                                    ("tp", True), ("zero2", False), ("zero3", False)])
def test_a_step_that_concatenates_the_held_gradients_pays_for_each_tensor_and_element(strategy, concatenates):
    """ModelStates.step flattens every gradient the rank holds before stepping it (ZeRO-1: then its chunk);
    ZeRO-2 and 3 step the reduced shard they kept. Priced as the executor does it, exactly."""
    from simpar.strategies.work import Work

    fitted = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]}, step_concat={"fp32": [PER_TENSOR, PER_ELEMENT]})
    seconds, params = _step_seconds(fitted, strategy)
    scenario = case_scenario(strategy, 2, "fp32")
    program = build_plan(scenario).program_of(0)
    units = {op.unit for op in program.ops if isinstance(op, Compute) and op.unit >= 0}
    spec = scenario.model
    concat = (PER_TENSOR * sum(spec.unit_tensors(spec.unit_kind(u)) for u in units)
              + PER_ELEMENT * Work(scenario).params(units))
    assert seconds == pytest.approx(0.5e-3 + params / 2.3e8 + (concat if concatenates else 0.0))
    if strategy == "zero1":  # the whole model's gradients flattened, a half of them stepped
        assert Work(scenario).params(units) == 2 * params


COLD_TENSOR, COLD_ELEMENT = 2.1e-6, 0.4e-9  # the same concatenation right after the backward


@pytest.mark.parametrize("strategy, cold", [("ddp", False), ("dp", False), ("zero1", False), ("pp", True),
                                            ("tp", True)])
def test_a_step_whose_gradients_no_call_handled_pays_the_cold_concatenation(strategy, cold):
    """tp and pp have no data-parallel call of their gradients between the backward and the step, whose
    handling leaves them hot: their concatenation is priced at ``step_concat_cold``'s terms, the others' at
    ``step_concat``'s, exactly; a profile without the cold terms prices every strategy at the hot ones."""
    from simpar.strategies.work import Work

    both = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]}, step_concat={"fp32": [PER_TENSOR, PER_ELEMENT]},
                    step_concat_cold={"fp32": [COLD_TENSOR, COLD_ELEMENT]})
    hot_only = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]}, step_concat={"fp32": [PER_TENSOR, PER_ELEMENT]})
    scenario = case_scenario(strategy, 2, "fp32")
    program = build_plan(scenario).program_of(0)
    units = {op.unit for op in program.ops if isinstance(op, Compute) and op.unit >= 0}
    tensors, params = sum(scenario.model.unit_tensors(scenario.model.unit_kind(u)) for u in units), \
        Work(scenario).params(units)
    per_tensor, per_element = (COLD_TENSOR, COLD_ELEMENT) if cold else (PER_TENSOR, PER_ELEMENT)
    seconds, stepped = _step_seconds(both, strategy)
    assert seconds == pytest.approx(0.5e-3 + stepped / 2.3e8 + per_tensor * tensors + per_element * params)
    assert _step_seconds(hot_only, strategy)[0] == pytest.approx(
        0.5e-3 + stepped / 2.3e8 + PER_TENSOR * tensors + PER_ELEMENT * params)


def test_the_cold_concatenation_is_fitted_per_tensor_and_element_beside_the_hot_one():
    """``cold_concat_s`` (handling.ColdConcat, timed in the steps not timed) is fitted as ``concat_s`` is, into
    ``step_concat_cold``; passes whose rows lack it (older) keep the profile's."""
    rows = [{**row, "cold_concat_s": COLD_TENSOR * row["tensors"] + COLD_ELEMENT * row["params"]}
            for row in _rows_with_concat(0.5e-3, 2.3e8)]
    fresh = calibrate.retimed(_profile(optimizer_step={"fp32": [1e-3, 1e8]}), [rows], "fp32")
    assert fresh.step_concat["fp32"] == pytest.approx([PER_TENSOR, PER_ELEMENT])
    assert fresh.step_concat_cold["fp32"] == pytest.approx([COLD_TENSOR, COLD_ELEMENT])
    older = calibrate.retimed(fresh, [_rows_with_concat(0.5e-3, 2.3e8)], "fp32")
    assert older.step_concat_cold == fresh.step_concat_cold


def test_cold_concat_times_the_gradients_concatenation_before_the_gradients_call_only_while_armed():
    """``ColdConcat`` wraps the executor's collective: armed, before the call of the gradients (not another
    call) it concatenates each group the optimizer steps, once, and times it; the call itself runs as before."""
    from types import SimpleNamespace

    from simpar.calibrate.handling import ColdConcat

    flattened, called = [], []
    states = SimpleNamespace(optimized={(0, 1): None, (2,): None},
                             flat=lambda units, what: flattened.append((units, what)))
    executor = SimpleNamespace(states=states, _collective=lambda op: called.append(op.payload))
    cold = ColdConcat(executor)
    grads, params = SimpleNamespace(payload="grads"), SimpleNamespace(payload="params")
    executor._collective(grads)
    assert called == ["grads"] and not flattened and not cold.times  # not armed
    cold.armed = True
    executor._collective(params)
    executor._collective(grads)
    assert called == ["grads", "params", "grads"]
    assert flattened == [((0, 1), "grad"), ((2,), "grad")] and len(cold.times) == 1 and cold.times[0] >= 0


def test_adams_cost_per_tensor_is_the_split_rows_excess_over_the_one_tensor_line():
    """host_worker's rows: Adam on one tensor at three sizes (50 us + 4 ns a parameter, the middle one 0.2 ms
    off the line) and on the middle size split into 10 tensors 0.9 ms dearer than its one-tensor row: 100 us
    for each tensor beyond the first (against the row of as many parameters, not the line; the line where no
    row has them). Never below 0; 0 without the split row (older samples)."""
    line = lambda n: 50e-6 + 4e-9 * n  # noqa: E731
    one = [{"optimizer": "adam", "params": n, "seconds": line(n) + (2e-4 if n == 2**18 else 0.0)}
           for n in (2**14, 2**18, 2**20)]
    split = {"optimizer": "adam", "params": 2**18, "tensors": 10, "seconds": line(2**18) + 2e-4 + 9e-4}
    assert calibrate.adam_per_tensor(one + [split]) == pytest.approx(100e-6)
    off_the_rows = {**split, "params": 2**19, "seconds": line(2**19) + 9e-4}
    assert calibrate.adam_per_tensor([one[0], one[2], off_the_rows]) == pytest.approx(100e-6)
    assert calibrate.adam_per_tensor(one) == 0.0
    assert calibrate.adam_per_tensor(one + [{**split, "seconds": 1e-6}]) == 0.0


@pytest.mark.parametrize("strategy, tensors", [("ddp", 1), ("zero1", 1), ("zero2", 1), ("zero3", 10), ("pp", 1),
                                               ("tp", 1)])
def test_a_step_pays_adams_cost_per_tensor_for_each_tensor_it_steps_beyond_the_first(strategy, tensors):
    """The executor steps one shard per ZeRO bucket (tiny-deep under ZeRO-3: one per unit, 10), else one flat
    tensor: the step costs ``optimizer_tensor`` for each beyond the first, exactly, on top of the rest."""
    plain = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]})
    per_tensor = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]}, optimizer_tensor=80e-6)
    assert _step_seconds(per_tensor, strategy)[0] == pytest.approx(
        _step_seconds(plain, strategy)[0] + 80e-6 * (tensors - 1))


@pytest.mark.parametrize("gpus", [1, 2])
def test_an_offloaded_step_concatenates_nothing(gpus):
    """The host steps the gradients copied to it (one rank too: nothing is kept on the device)."""
    from simpar.models import model
    from simpar.scenario import make_scenario

    fitted = _profile(optimizer_step={"fp32": [0.5e-3, 2.3e8]}, step_concat={"fp32": [PER_TENSOR, PER_ELEMENT]})
    scenario = make_scenario(model("tiny-deep"), "zero2-offload", gpus, micro_batch=2, topology="cpu-host")
    plan = build_plan(scenario)
    costs = OpCosts(plan, scenario, fitted.topology(2, "fp32"))
    concat = {"concat_tensor": PER_TENSOR, "concat_element": PER_ELEMENT}
    assert costs._step_concat(plan.program_of(0), concat) == 0.0
    ddp = make_scenario(model("tiny-deep"), "ddp", gpus, micro_batch=2, topology="cpu-host")
    plan = build_plan(ddp)
    assert OpCosts(plan, ddp, fitted.topology(2, "fp32"))._step_concat(plan.program_of(0), concat) > 0.0


def test_retimed_refits_the_step_and_keeps_it_when_the_passes_have_none():
    profile = _profile(optimizer_step={"fp32": [1e-3, 1e8]})
    fresh = calibrate.retimed(profile, [_rows(0.4e-3, 3e8), _rows(0.6e-3, 3e8)], "fp32")
    assert fresh.optimizer_step["fp32"] == pytest.approx([0.5e-3, 3e8])
    assert profile.optimizer_step["fp32"] == [1e-3, 1e8]  # the calibrated profile is left as it was
    before = [{k: v for k, v in row.items() if k != "step_s"} for row in _rows(0.4e-3, 3e8)]
    assert calibrate.retimed(profile, [before], "fp32").optimizer_step == profile.optimizer_step


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
    when freed (one fault per 4 KiB when written again, 5 us each on the development VM); kept, the
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
