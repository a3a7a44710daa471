"""The executor's handling of a data-parallel collective's data (concatenating the units' parameter tensors,
scaling, re-pointing each tensor): counted from the model, fitted on one-rank all-reduces, priced in each call
at one rank's speed (the others wait in the ring meanwhile)."""

import pytest

import simpar.calibrate.fits as calibrate
from simpar.calibrate.profile import HardwareProfile
from simpar.models import PRESETS, model
from simpar.plan import Collective, Compute
from simpar.real.model import build_model
from simpar.scenario import make_scenario
from simpar.sim import simulate
from simpar.sim.op_costs import OpCosts
from simpar.strategies import build_plan

PER_TENSOR, PER_ELEMENT = 15e-6, 2e-9


def _profile(tensor_work: dict | None = None, sharded_work: dict | None = None, **extra) -> HardwareProfile:
    """A profile whose handling is an all-reduce's (``tensor_work``: precision -> [per tensor, per element]) and
    ZeRO's ways' (``sharded_work``: precision -> kind -> the same)."""
    handling = {precision: {"": fit} for precision, fit in (tensor_work or {}).items()}
    for precision, kinds in (sharded_work or {}).items():
        handling.setdefault(precision, {}).update(kinds)
    return HardwareProfile(machine={"host": "test", "cores": 2, "torch": "x", "cpu": "x"},
                           compute={"fp32": {"fwd": [20e-6, 100e-6, 50e-6, 50e9], "bwd": [40e-6, 200e-6, 90e-6, 40e9]}},
                           ring={"2": [50e-6, 2e9]}, optimizer_params_per_s={"adam": 1e8, "sgd": 4e8},
                           copy_bytes_per_s=1e10, handling=handling, **extra)


def _scenario(strategy: str, **kwargs):
    return make_scenario(model("tiny-deep"), strategy, 2, micro_batch=2, precision="fp32", topology="cpu-host",
                         **kwargs)


@pytest.mark.parametrize("name", [n for n in PRESETS if model(n).params < 5e6])
def test_the_spec_counts_the_parameter_tensors_the_executors_units_hold(name):
    spec = model(name)
    units = build_model(spec).units
    assert [spec.unit_tensors(spec.unit_kind(u)) for u in range(len(units))] == \
        [len(list(unit.parameters())) for unit in units]


def test_the_fit_recovers_the_cost_per_tensor_and_per_element():
    rows = [{"model": name, "batch": b, "tensors": tensors, "params": params,
             "reduce_s": PER_TENSOR * tensors + PER_ELEMENT * params}
            for name, tensors, params in (("tiny", 36, 118_528), ("small", 68, 932_608)) for b in (1, 2, 4)]
    assert calibrate.fit_tensor_work(rows) == pytest.approx([PER_TENSOR, PER_ELEMENT])
    slow_small = [dict(row, reduce_s=row["reduce_s"] * (0.2 if row["model"] == "small" else 1.0)) for row in rows]
    per_tensor, per_element = calibrate.fit_tensor_work(slow_small)  # would need a negative term: refitted
    assert per_element == 0.0 and per_tensor > 0
    assert calibrate.fit_tensor_work([{k: v for k, v in row.items() if k != "reduce_s"} for row in rows]) == []


def _handled(strategy: str, **kwargs) -> tuple[float, float]:
    """(seconds the plan's collectives of rank 0 are handled for, what the calls pay for it)."""
    scenario = _scenario(strategy, **kwargs)
    plan = build_plan(scenario)
    priced = OpCosts(plan, scenario, _profile(tensor_work={"fp32": [PER_TENSOR, PER_ELEMENT]}).topology(2, "fp32"))
    bare = OpCosts(plan, scenario, _profile().topology(2, "fp32"))
    ops = plan.programs[0].ops
    handled = sum(priced.handling(op) for op in ops if isinstance(op, Collective))
    paid = sum(priced.wake(0, op) - bare.wake(0, op) for op in ops if isinstance(op, Collective))
    assert all(priced.resume(0, op) == bare.resume(0, op) for op in ops if isinstance(op, Compute))
    return handled, paid


def test_each_data_parallel_collective_is_handled_per_tensor_and_element_and_pays_it_in_the_call():
    spec = model("tiny-deep")
    tensors = sum(spec.unit_tensors(spec.unit_kind(u)) for u in range(spec.layers + 2))
    assert tensors == 133
    handled, paid = _handled("ddp")  # one all-reduce of every unit's gradients
    assert handled == pytest.approx(PER_TENSOR * 133 + PER_ELEMENT * spec.params)
    assert paid == pytest.approx(handled)
    handled, paid = _handled("zero1")  # a reduce-scatter of the gradients, an all-gather of the parameters
    assert handled == pytest.approx(2 * (PER_TENSOR * 133 + PER_ELEMENT * spec.params)) and paid == pytest.approx(handled)
    handled, paid = _handled("zero3")  # module by module: a norm's 2 tensors, a linear layer's weight and bias
    assert paid == pytest.approx(handled)
    scenario = _scenario("zero3")
    gathers = [op for op in build_plan(scenario).programs[0].ops
               if isinstance(op, Collective) and op.op == "allgather" and op.units == (1,)]
    costs = OpCosts(build_plan(scenario), scenario,
                    _profile(tensor_work={"fp32": [PER_TENSOR, 0.0]}).topology(2, "fp32"))
    assert gathers and all(costs.handling(op) == pytest.approx(2 * PER_TENSOR) for op in gathers)  # norms, biased linears
    assert _handled("tp") == (0.0, 0.0)  # activations: one tensor already, nothing to flatten


@pytest.mark.parametrize("strategy", ["ddp", "dp", "zero1"])
def test_the_fast_path_prices_the_handling_as_the_full_simulation(strategy):
    topology = _profile(tensor_work={"fp32": [PER_TENSOR, PER_ELEMENT]}).topology(2, "fp32")
    topology.core_slowdown = None  # (with ranks sharing cores the fast path is the full one)
    scenario = _scenario(strategy)
    full = simulate(scenario, topology=topology).step_time_s
    assert simulate(scenario, topology=topology, fast=True).step_time_s == pytest.approx(full, rel=1e-9)
    bare = _profile().topology(2, "fp32")
    bare.core_slowdown = None
    assert full > simulate(scenario, topology=bare).step_time_s  # and it costs the step time


def test_zero_1_and_2_all_gathers_copy_the_parameters_out_and_pay_the_gather_fit_where_measured():
    """ZeRO-1/2's all-gather of parameters held whole copies the buffer into each and concatenates nothing
    (``sharded_work["gather"]``); the reduce-scatter and every other op keep the all-reduce's handling, and
    a profile without the fit prices the all-gather as before."""
    spec, gather = model("tiny-deep"), [4e-6, 0.5e-9]
    whole, copied = PER_TENSOR * 133 + PER_ELEMENT * spec.params, gather[0] * 133 + gather[1] * spec.params
    profile = _profile(tensor_work={"fp32": [PER_TENSOR, PER_ELEMENT]}, sharded_work={"fp32": {"gather": gather}})
    for strategy in ("zero1", "zero2", "ddp", "dp", "zero3"):
        scenario = _scenario(strategy)
        plan = build_plan(scenario)
        costs, before = (OpCosts(plan, scenario, p.topology(2, "fp32")) for p in
                         (profile, _profile(tensor_work={"fp32": [PER_TENSOR, PER_ELEMENT]})))
        for op in (op for op in plan.programs[0].ops if isinstance(op, Collective)):
            gathers = strategy in ("zero1", "zero2") and op.op == "allgather"
            expected = pytest.approx(copied) if gathers else pytest.approx(before.handling(op))
            assert costs.handling(op) == expected, (strategy, op.op)
            if strategy in ("zero1", "zero2", "ddp", "dp"):
                assert before.handling(op) == pytest.approx(whole)
    rows = [{"model": name, "batch": b, "tensors": tensors, "params": params, "reduce_s": 1.0,
             "gather_s": gather[0] * tensors + gather[1] * params}
            for name, tensors, params in (("tiny", 36, 118_528), ("small", 68, 932_608)) for b in (1, 2)]
    assert calibrate.fit_sharded_work(rows) == {"gather": pytest.approx(gather)}
    assert calibrate.fit_sharded_work([{k: v for k, v in r.items() if k != "gather_s"} for r in rows]) == {}


def test_the_fast_path_prices_the_gather_handling_as_the_full_simulation():
    topology = _profile(tensor_work={"fp32": [PER_TENSOR, PER_ELEMENT]},
                        sharded_work={"fp32": {"gather": [4e-6, 0.5e-9]}}).topology(2, "fp32")
    topology.core_slowdown = None
    scenario = _scenario("zero1")  # (ZeRO-2 allocates on several streams at once: no fast path)
    full = simulate(scenario, topology=topology).step_time_s
    assert simulate(scenario, topology=topology, fast=True).step_time_s == pytest.approx(full, rel=1e-9)


def test_zero_2_and_3_reduce_scatters_drop_the_gradients_and_pay_the_scatter_fit_where_measured():
    """ZeRO-2 and 3 keep only their reduced shard: around the reduce-scatter the executor concatenates the
    gradients and drops each (``sharded_work["scatter"]``), where ZeRO-1 re-points every gradient into the
    result as the all-reduce does (its handling unchanged); a profile without the fit prices it as before."""
    spec, scatter = model("tiny-deep"), [2e-6, 0.8e-9]
    dropped = scatter[0] * 133 + scatter[1] * spec.params
    profile = _profile(tensor_work={"fp32": [PER_TENSOR, PER_ELEMENT]}, sharded_work={"fp32": {"scatter": scatter}})
    plain = _profile(tensor_work={"fp32": [PER_TENSOR, PER_ELEMENT]})
    seen = set()
    for strategy in ("zero1", "zero2", "zero3", "ddp"):
        scenario = _scenario(strategy)
        plan = build_plan(scenario)
        costs, before = (OpCosts(plan, scenario, p.topology(2, "fp32")) for p in (profile, plain))
        for op in (op for op in plan.programs[0].ops if isinstance(op, Collective)):
            drops = strategy in ("zero2", "zero3") and op.op == "reducescatter"
            seen.add((strategy, drops))
            if drops and strategy == "zero2":  # one reduce-scatter of every unit's gradients
                assert costs.handling(op) == pytest.approx(dropped)
            elif drops:  # ZeRO-3: a module's gradients at a time, at the scatter's rates
                assert costs.handling(op) < before.handling(op)
            else:
                assert costs.handling(op) == pytest.approx(before.handling(op)), (strategy, op.op)
    assert {("zero2", True), ("zero3", True), ("zero1", False)} <= seen
    rows = [{"model": name, "batch": b, "tensors": tensors, "params": params, "reduce_s": 1.0,
             "scatter_s": scatter[0] * tensors + scatter[1] * params}
            for name, tensors, params in (("tiny", 36, 118_528), ("small", 68, 932_608)) for b in (1, 2)]
    assert calibrate.fit_sharded_work(rows) == {"scatter": pytest.approx(scatter)}
