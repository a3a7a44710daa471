"""Strategy search: every valid layout of a model on a cluster, simulated, the fastest that fit first.

A candidate is (strategy, dp, pp, tp, micro-batch, recomputation, pipeline schedule) at a fixed
global batch, so step times compare like for like (same tokens per step). Data parallelism alone
tries ddp, ZeRO-1/2/3, ZeRO-Offload and (across machines) hybrid sharding; any pipeline or tensor split is
Megatron 3D (ZeRO-1 across data-parallel ranks), tensor parallelism kept inside a machine. An MoE model's
layouts also split its experts over every expert-parallel degree that divides both its experts and dp. Each candidate's Plan is walked for
its memory first (cheap); only those under the memory cap are priced, on the fast path
(sim/fast.py: each network op priced once, alone; ``exact`` simulates in full), and long
accumulations extrapolated from two short ones (Search.evaluate).
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from simpar import topologies
from simpar.sim.extrapolate import extrapolate, extrapolation_points
from simpar.errors import SimparError
from simpar.models import ModelSpec
from simpar.scenario import make_scenario
from simpar.sim import fast
from simpar.sim.runner import Simulator
from simpar.sim.memory_check import check_host
from simpar.sim.tracker import walk
from simpar.strategies import build_plan
from simpar.strategies.layout import EXPERT_PARALLEL

DATA_PARALLEL = ("ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "hsdp")
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Candidate:
    strategy: str
    dp: int
    pp: int
    tp: int
    micro_batch: int
    recompute: str
    schedule: str = "1f1b"
    virtual_stages: int = 1
    ep: int = 1
    cp: int = 1
    cp_algo: str = "ring"

    def describe(self) -> str:
        layout = f"dp {self.dp} x pp {self.pp} x tp {self.tp}" + (f", ep {self.ep}" if self.ep > 1 else "") + \
            (f", cp {self.cp} {self.cp_algo}" if self.cp > 1 else "")
        schedule = "" if self.pp == 1 else f", {self.schedule}" + (f" v={self.virtual_stages}"
                                                                    if self.virtual_stages > 1 else "")
        return f"{self.strategy} ({layout}{schedule}), micro-batch {self.micro_batch}, recompute {self.recompute}"


@dataclass
class Outcome:
    candidate: Candidate
    status: str  # "fits" (simulated), "oom" (over the cap), "invalid" (the layout does not apply)
    step_time_s: float | None = None
    peak_bytes: int | None = None
    reason: str = ""
    extrapolated: bool = False  # step time from two shorter steps (see Search.evaluate)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(model: ModelSpec, gpus: int, global_batch: int, gpus_per_machine: int,
               strategies: tuple[str, ...] = DATA_PARALLEL + ("3d",)) -> list[Candidate]:
    """Every layout whose degrees divide the GPUs, layers, heads and batch; tp within a machine (MoE: tp 1, and
    each expert-parallel degree of the experts dividing dp); hsdp only where there are several machines."""
    out = []
    if gpus <= gpus_per_machine:
        strategies = tuple(s for s in strategies if s != "hsdp")
    for tp in _divisors(gpus):
        if tp > gpus_per_machine or model.heads % tp or model.n_kv_heads % tp or model.ffn % tp:
            continue
        if model.experts and tp > 1:
            continue
        for pp in _divisors(gpus // tp):
            if model.layers % pp:
                continue
            dp = gpus // (tp * pp)
            for mb, recompute in itertools.product(MICRO_BATCHES, RECOMPUTE):
                if global_batch % (mb * dp):
                    continue
                m = global_batch // (mb * dp)
                if pp == tp == 1:
                    out += [Candidate(s, dp, 1, 1, mb, recompute) for s in strategies if s != "3d"]
                elif "3d" in strategies:
                    if pp > 1 and m < pp:
                        continue  # fewer micro-batches than stages: the pipeline never fills
                    out.append(Candidate("3d", dp, pp, tp, mb, recompute))
                    if pp > 1 and m % pp == 0 and model.layers % (2 * pp) == 0:
                        out.append(Candidate("3d", dp, pp, tp, mb, recompute, "interleaved", 2))
                    if pp > 1 and not model.experts:  # zero-bubble: B and W apart (strategies/pipeline.py)
                        out.append(Candidate("3d", dp, pp, tp, mb, recompute, "zb-h1"))
                        if model.layers % (2 * pp) == 0:
                            out.append(Candidate("3d", dp, pp, tp, mb, recompute, "zb-v"))
    expert_parallel = [dataclasses.replace(c, ep=ep) for c in out if c.strategy in EXPERT_PARALLEL
                       for ep in _divisors(c.dp) if ep > 1 and model.experts % ep == 0] if model.experts else []
    return out + expert_parallel + _context_parallel(model, out)


# Context parallelism only pays where attention's s^2 dominates and activations overflow: Megatron-Core
# advises it from 8K tokens a sequence on
CONTEXT_PARALLEL_FROM = 8192


def _context_parallel(model: ModelSpec, out: list[Candidate]) -> list[Candidate]:
    """Each 3d layout with its dp ranks carved into cp ranks that split a sequence (ring; Ulysses where the
    heads divide), for long sequences."""
    if model.seq < CONTEXT_PARALLEL_FROM or model.experts:
        return []
    found = []
    for c in out:
        if c.strategy != "3d" or c.schedule not in ("1f1b", "interleaved"):
            continue
        for cp in _divisors(c.dp)[1:]:
            for algo in ("ring", "ulysses"):
                heads_divide = model.heads % (c.tp * cp) == 0 and model.n_kv_heads % (c.tp * cp) == 0
                if (algo == "ring" and model.seq % (2 * cp) == 0) or (algo == "ulysses" and heads_divide):
                    found.append(dataclasses.replace(c, dp=c.dp // cp, cp=cp, cp_algo=algo))
    return found


class Search:
    """Evaluates candidates of one model on one cluster (the topology is built once)."""

    def __init__(self, model: ModelSpec, gpus: int, topology: str, global_batch: int, precision: str = "bf16-mixed",
                 optimizer: str = "adam", memory_cap: float | None = None, exact: bool = False,
                 device: str | None = None):
        self.model, self.gpus, self.topology_name, self.device = model, gpus, topology, device
        self.exact = exact  # every step simulated in full; else the fast path (sim/fast.py)
        self._network_times: dict = {}  # the fast path's network op times, shared by every candidate
        self.global_batch, self.precision, self.optimizer = global_batch, precision, optimizer
        self.topology = topologies.build(topology, gpus, device=device)
        self.gpu = self.topology.graph.nodes[self.topology.gpus[0]]["spec"]
        self.memory_cap = memory_cap if memory_cap is not None else self.gpu.memory_bytes
        if self.memory_cap <= 0:
            raise SimparError(f"--memory-cap: must be positive, got {memory_cap}")
        machines = {self.topology.machine(g) for g in self.topology.gpus[:gpus]}
        self.gpus_per_machine = max(1, gpus // len(machines))

    def candidates(self, strategies=DATA_PARALLEL + ("3d",)) -> list[Candidate]:
        return candidates(self.model, self.gpus, self.global_batch, self.gpus_per_machine, strategies)

    def scenario(self, c: Candidate, microbatches: int | None = None):
        """The candidate's Scenario, at its global batch or with ``microbatches`` per step instead."""
        batch = self.global_batch if microbatches is None else c.micro_batch * c.dp * microbatches
        return make_scenario(self.model, c.strategy, self.gpus, topology=self.topology_name, device=self.device,
                             micro_batch=c.micro_batch, global_batch=batch, precision=self.precision,
                             optimizer=self.optimizer, dp=c.dp, pp=c.pp, tp=c.tp, recompute=c.recompute,
                             schedule=c.schedule, virtual_stages=c.virtual_stages, ep=c.ep, cp=c.cp,
                             cp_algo=c.cp_algo)

    def evaluate(self, c: Candidate) -> Outcome:
        """Memory first, then the step time. Many micro-batches: a step is affine in their number
        (each more adds one forward and backward on the slowest stage once the pipeline is full, and
        warm-up, drain and the final reduction do not change), so it is simulated at p and p + 1
        micro-batches (p and 2p interleaved, whose period is p; 1 and 2 without a pipeline; ZB-V, list-scheduled,
        whole) and extrapolated; peak memory is the same from
        there on (1F1B and interleaved hold at most a pipeline's worth). tests/test_search.py checks
        both against full simulations."""
        try:
            scenario = self.scenario(c)
        except SimparError as exc:
            return Outcome(c, "invalid", reason=str(exc))
        m, base = scenario.microbatches, c.pp
        points = [m] if c.schedule == "zb-v" else extrapolation_points(m, base, base if c.schedule == "interleaved" else 1)
        times, peak = [], 0
        for microbatches in points:
            short = scenario if microbatches == m else self.scenario(c, microbatches)
            plan = build_plan(short)
            if times and c.pp > 1 and c.schedule == "1f1b":  # a full 1F1B pipeline holds its most at p
                times.append(self._step_time(plan, short))  # micro-batches (stage s keeps p - s in flight):
                continue  # the same peak one more on
            trackers = [walk(p) for p in plan.programs]
            peak = max(t.peak["gpu"] for t in trackers)
            if peak > self.memory_cap:
                return Outcome(c, "oom", peak_bytes=peak)
            try:
                check_host(plan, trackers, self.topology)  # offloaded states must fit the machines' memory
            except SimparError as exc:
                return Outcome(c, "oom", peak_bytes=peak, reason=str(exc).split(";")[0])
            times.append(self._step_time(plan, short))
        return Outcome(c, "fits", extrapolate(times, points, m), peak, extrapolated=len(times) > 1)

    def _step_time(self, plan, scenario) -> float:
        if self.exact:
            return Simulator(plan, scenario, self.topology).run()
        return fast.step_time(plan, scenario, self.topology, self._network_times)


def ranked(outcomes: list[Outcome]) -> list[Outcome]:
    """Those that fit, fastest first (ties: less memory first)."""
    return sorted((o for o in outcomes if o.status == "fits"), key=lambda o: (o.step_time_s, o.peak_bytes))


_worker_search: Search | None = None


def _start_worker(arguments: tuple) -> None:
    global _worker_search
    _worker_search = Search(*arguments)


def _evaluate_in_worker(candidate: Candidate) -> Outcome:
    return _worker_search.evaluate(candidate)


def run_search(search_args: tuple, todo: list[Candidate], jobs: int = 1, progress=None) -> list[Outcome]:
    """Evaluate ``todo`` with ``jobs`` processes (each builds its own Search from ``search_args``);
    ``progress(n)`` is told how many are done after each."""
    tell = progress or (lambda done: None)
    if jobs <= 1:
        search = Search(*search_args)
        outcomes = []
        for candidate in todo:
            outcomes.append(search.evaluate(candidate))
            tell(len(outcomes))
        return outcomes
    # workers forked from a clean server process, not from this one: a fork inherits whatever lock another
    # thread held at that moment (one CI run hung for 600 s in `simpar search`); and an executor, unlike
    # multiprocessing.Pool, raises when a worker dies instead of waiting for it forever
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(["simpar.search"])
    outcomes = []
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_start_worker, initargs=(search_args,)) as pool:
        for outcome in pool.map(_evaluate_in_worker, todo, chunksize=4):
            outcomes.append(outcome)
            tell(len(outcomes))
    return outcomes
