"""A calibrated hardware profile: what the micro-benchmarks measured, fitted into the numbers the
simulator prices a Plan with, saved as JSON and turned back into a topology.

The numbers (fitted in fits.py): a unit's forward or backward takes ``overhead[kind] + flops / rate``
(per phase, least squares; the overhead is the framework's per-op cost, which dominates small models on a
CPU, and depends on how many kernels the unit launches: an embedding few, a transformer layer dozens); a
collective of k ring steps moving s bytes each costs ``k (alpha + s / bandwidth)``, and the first
one after computing ``wake`` more, fitted to the executor's own ring code run as a step runs it
(a unit's compute, then one or several calls in a row; per world size: more ranks than cores slow
every message), the fifth and later calls of a longer series ``series_late`` more per step (less, as
measured: calibrate/series.py); ``wake`` is the wait for a peer still computing and the wake-up of a blocked
receive (``handoff``: the same for a pipeline send, which waits for one neighbour, not a group),
``resume`` what the first compute after a call pays more (``resume_after_recv`` after a pipeline
receive, measured where the stages take turns; docs/calibration.md); ``resume`` was measured on a
compute of ``resume_unit`` seconds alone, and a shorter one pays less, through ``resume_short`` (the rank
computes slower for a while after a call; after a pipeline receive it waits for a core, a delay paid whole), and
the computes after that first one, up to the next call, ``resume_tail`` longer (calibrate/tail.py), and a
ring call's steps after its first ``later_steps`` more after a compute (calibrate/lag.py); k ranks
computing at once take ``slowdown[k]`` times as long as the one-rank rows price (the cores are
shared); the optimizer updates ``params_per_s``; a copy moves ``copy_bytes_per_s``.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from simpar.calibrate.fits import UNIT_KINDS, ring_price
from simpar.calibrate.series import SERIES
from simpar.devices.specs import GPUSpec, HostSpec
from simpar.errors import SimparError
from simpar.real.cpu_profile import rank_processes
from simpar.sim.cores import slowdown_at
from simpar.topologies.graph import Topology

if TYPE_CHECKING:
    from simpar.calibrate.gpu_profile import GPUProfile

VERSION = 22
PHASE_SIZE = 2**18  # bytes of the all-reduce after the calibration's long computes (phase_worker)
# ... and after its short ones: a tensor-parallel activation's size (tiny-deep's at micro-batch 2), where the
# bytes cost a few microseconds and the fitted bandwidth's error cannot leak into ``wake_short`` (see there)
SHORT_SIZE = 2**14


def machine_id() -> dict:
    return {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count() or 1, "torch": torch.__version__}


@dataclass
class HardwareProfile:
    machine: dict
    compute: dict[str, dict[str, list[float]]]  # precision -> phase -> [overhead per UNIT_KINDS..., flops_per_s]
    slowdown: dict[str, float]  # ranks at once (as a string key, for JSON) -> compute time factor (burst_worker)
    ring: dict[str, list[float]]  # world -> [alpha_s, bandwidth bytes/s] of one ring step
    optimizer_params_per_s: dict[str, float]  # adam / sgd
    copy_bytes_per_s: float
    samples: dict = field(default_factory=dict)  # the raw measurements, for the record
    version: int = VERSION
    wake: dict[str, float] = field(default_factory=dict)  # world -> seconds the first call after computing pays
    resume: dict[str, float] = field(default_factory=dict)  # world -> seconds the first compute after a call pays
    handoff: dict[str, float] = field(default_factory=dict)  # world -> seconds a pipeline send after computing pays
    # world -> a pipeline send's step latency, fitted on the handoffs alone (fits.fit_collective_costs); empty in
    # older profiles: the ring step's
    handoff_step: dict[str, float] = field(default_factory=dict)
    # world -> seconds a pipeline send's isend holds its sender right after computing (pattern_worker's handoffs)
    send_issue: dict[str, float] = field(default_factory=dict)
    # world -> seconds a pipeline receive posted after its send takes beyond its bytes (late_worker: gloo moves
    # a message once both ends posted it); empty in older profiles: a receive waits for the data alone
    late_recv: dict[str, float] = field(default_factory=dict)
    # world -> ranks computing while a late receive waits (its sender and others) -> its seconds beyond its bytes
    # (busy_late_worker: one pair, the others computing or blocked); empty in older profiles: ``late_recv``,
    # read at the ranks runnable
    late_recv_busy: dict[str, dict[str, float]] = field(default_factory=dict)
    # world -> the spread of ``send_issue``, the quantiles of its samples over their mean (simpar/spread.py): the
    # simulator draws each pipeline send's hold from it; empty in older profiles: every send at its mean
    send_issue_spread: dict[str, list[float]] = field(default_factory=dict)
    # world -> [wake s, latency s per leg, bytes/s per leg] of the executor's Worker-Server all-reduce in the
    # step's pattern (pattern_worker's psreduce); empty in older profiles: its legs priced from the ring's step
    worker_server: dict[str, list[float]] = field(default_factory=dict)
    # world -> seconds a compute right after a pipeline receive pays (relay_worker: stages take turns)
    resume_after_recv: dict[str, float] = field(default_factory=dict)
    # world -> [[seconds of compute since the rank's last call...], [what the call pays beyond the wake after
    # each...]] (phase_worker's loops, the first at wake_phase: world -> the compute before the call that
    # ``wake`` was measured after); older profiles have wake_growth instead: one line, seconds per second
    wake_curve: dict[str, list[list[float]]] = field(default_factory=dict)
    # the same for the Worker-Server all-reduce (phase_worker's "ps" loops); empty in older profiles: its
    # calls grow as the ring's
    worker_server_curve: dict[str, list[list[float]]] = field(default_factory=dict)
    wake_growth: dict[str, float] = field(default_factory=dict)
    wake_phase: dict[str, float] = field(default_factory=dict)
    # world -> [[seconds of a short compute, the first call after it beyond the ring's price (negative: less)], ...]:
    # phase_worker's short loops, a point each (``SHORT_LOOPS``); empty: a call after any compute pays the whole wake
    wake_short: dict[str, list[list[float]]] = field(default_factory=dict)
    # bytes of the short loops' all-reduce (``SHORT_SIZE``); older profiles timed them at ``PHASE_SIZE``, where the
    # ring's price of the bytes, subtracted to give ``wake_short``, ran about 0.1 ms a call over what they cost
    short_size: int = PHASE_SIZE
    # world -> seconds per ring step a collective from the fifth on of a series after computing pays beyond the
    # step latency (negative: less; the executor's own ZeRO-3 gathers timed call by call: calibrate/series.py),
    # for world sizes up to the cores; elsewhere (and in older profiles) every call of a series at the step latency
    series_late: dict[str, float] = field(default_factory=dict)
    # world -> seconds per ring step the last call of such a series, before the compute after it, pays beyond its
    # fifth to last but one (``series_last``); empty (older profiles): as those
    series_last: dict[str, float] = field(default_factory=dict)
    # world -> seconds per ring step the executor's ZeRO-3 gathers of parameters pay from a series' second on beyond
    # a bare call's price (step latency, bandwidth, handling; ``series_level``), up to the cores; empty: none
    series_level: dict[str, float] = field(default_factory=dict)
    # world -> [compute before the executor's ZeRO-3 series, its first gather beyond its price] (``series_first``):
    # a ZeRO-3 gather's wake share goes through this point instead of ``wake_short``'s, where measured
    series_first: dict[str, list[float]] = field(default_factory=dict)
    # world -> seconds per ring step the executor's reduce-scatter of a layer's gradients after its backward
    # (ZeRO-3's, coalesced by module) pays beyond its price there (``scatter_level``), up to the cores; empty: none
    scatter_level: dict[str, float] = field(default_factory=dict)
    # seconds per op of the plan the executor spends between ops, outside every timed op (compute_worker;
    # 0 in profiles from before it was measured)
    between_ops: float = 0.0
    # world -> seconds alone of the compute resume was measured on: a shorter one pays its share (empty in
    # older profiles: every compute pays it whole)
    resume_unit: dict[str, float] = field(default_factory=dict)
    # world -> [seconds alone of a short compute, what it pays after a call] (the unit's forward at tensor
    # parallelism's pace: ``resume_point``), up to the cores: the resume's curve goes through it; empty: the share
    resume_short: dict[str, list[float]] = field(default_factory=dict)
    # world -> the fraction longer every compute after the first one after a call takes, up to the next call
    # (calibrate/tail.py), where the ranks fit the cores; empty: only the first pays
    resume_tail: dict[str, float] = field(default_factory=dict)
    # world -> seconds a ring call's steps after its first pay, together, beyond their price after a compute (the
    # phase loops' calls over their price: calibrate/lag.py's ``later_steps``), every world measured (profiles
    # before version 20 kept it only where the ranks fit the cores)
    later_steps: dict[str, float] = field(default_factory=dict)
    # precision -> [seconds, params/s] of the executor's optimizer (Adam) step op on one rank, timed inside
    # its step (compute_worker); empty in older profiles: the bare-tensor rate, no overhead
    optimizer_step: dict[str, list[float]] = field(default_factory=dict)
    # seconds Adam's step costs per tensor it steps beyond the first (host_worker: CPU optimizers step their
    # tensors one by one): ZeRO-3 steps one shard per unit, the others one tensor; 0 in older profiles
    optimizer_tensor: float = 0.0
    # precision -> [seconds per parameter tensor, seconds per parameter] of the gradients' concatenation inside
    # that step op (compute_worker: ``handling.concat_timer``), which ``optimizer_step`` then leaves out: ZeRO-2
    # and 3 step their reduced shard, the others flatten every gradient they hold first; empty in older profiles
    # (the step's line holds it, for every strategy)
    step_concat: dict[str, list[float]] = field(default_factory=dict)
    # ... and the same concatenation right after the backward (compute_worker: ``handling.ColdConcat``), as a
    # step meets the gradients where no data-parallel call's handling has touched them (tp, pp); empty in older
    # profiles (step_concat's, for every strategy)
    step_concat_cold: dict[str, list[float]] = field(default_factory=dict)
    # precision -> [seconds per parameter tensor, seconds per parameter] of the executor's handling of the
    # data around a data-parallel collective (compute_worker's one-rank all-reduce); empty in older profiles
    tensor_work: dict[str, list[float]] = field(default_factory=dict)
    # precision -> {"gather": [...]} the same for ZeRO-1/2's all-gather of parameters held whole (a copy into
    # each: compute_worker, calibrate/handling.py); empty in older profiles: handled as the all-reduce
    sharded_work: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # precision -> seconds per element of the embedding's table that its backward pays (the dense gradient:
    # ``fit_unit_costs``); empty in older profiles: one overhead for every table
    embedding_table: dict[str, float] = field(default_factory=dict)
    # precision -> [forward, backward] seconds per attention score of a layer (batch x heads x seq^2 on one
    # rank: ``fit_unit_costs``); empty in older profiles: a layer's cost by its FLOPs alone, whatever its heads
    attention_scores: dict[str, list[float]] = field(default_factory=dict)
    # precision -> {"tau": seconds, "fwd": {kind: seconds}, "bwd": {...}}: what an embedding or head pays for
    # the caches it finds cold, in full after a long gap since the last of its kind (calibrate/cold.py);
    # empty in older profiles: their overheads alone
    unit_cold: dict[str, dict] = field(default_factory=dict)
    # precision -> {"fwd": s, "bwd": s}: what a tensor-parallel piece of a layer costs beyond its share of the
    # layer (the executor's own pieces on one rank: calibrate/tp_bench.py); empty in older profiles
    tp_piece: dict[str, dict[str, float]] = field(default_factory=dict)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(asdict(self), handle, indent=1)

    @classmethod
    def load(cls, path: str) -> HardwareProfile | GPUProfile:
        """A CPU-rank profile, or the GPU profile (``kind: gpu``) that ``--backend nccl`` writes."""
        try:
            with open(path) as handle:
                data = json.load(handle)
            if isinstance(data, dict) and data.get("kind") == "gpu":  # simpar calibrate --backend nccl
                from simpar.calibrate.gpu_profile import GPUProfile

                return GPUProfile.from_dict(data, path)
            if data.get("version") != VERSION:
                raise SimparError(f"--hardware: {path} is a version {data.get('version')} profile; "
                                  f"recalibrate (simpar calibrate) for version {VERSION}")
            return cls(**data)
        except OSError as exc:
            raise SimparError(f"--hardware: cannot read {path!r}: {exc.strerror}") from None
        except (json.JSONDecodeError, TypeError) as exc:
            raise SimparError(f"--hardware: {path} is not a simpar hardware profile ({exc})") from None

    def awake_mismatch(self) -> str:
        """A warning when this profile's ranks ran with the cores kept awake (real/awake.py) and runs now
        would not, or the other way round (profiles from before the spinners: without); the same for gloo's
        transport threads at SCHED_BATCH (real/gloo_threads.py; profiles from before: without); else ''."""
        from simpar.real import awake, gloo_threads

        for key, now, setting, env in (("kept_awake", awake.enabled(), "the cores kept awake", awake.ENV),
                                       ("gloo_batch", gloo_threads.enabled(),
                                        "gloo's transport threads at SCHED_BATCH", gloo_threads.ENV)):
            calibrated = bool(self.machine.get(key, False))
            if calibrated != now:
                then_how, now_how = (("with " if on else "without ") + setting for on in (calibrated, now))
                return (f"this profile was calibrated {then_how}, the ranks now run {now_how} ({env}): their calls "
                        f"cost different things; recalibrate (simpar calibrate) the way the runs are taken")
        return ""

    # -- interpolation by world size ------------------------------------------------------------
    @staticmethod
    def _nearest(table: dict[str, object], world: int):
        """The entry for ``world``, else the nearest measured one on a log scale."""
        keys = sorted(int(k) for k in table)
        best = min(keys, key=lambda k: abs(np.log(k) - np.log(world)))
        return table[str(best)]

    def compute_slowdown(self, world: int) -> float:
        """How much slower each of ``world`` ranks computing at once is than one alone."""
        return slowdown_at({int(k): v for k, v in self.slowdown.items()}, world)

    def ring_step(self, world: int) -> tuple[float, float]:
        alpha, bandwidth = self._nearest(self.ring, world)
        return float(alpha), float(bandwidth)

    def short_anchor(self, world: int) -> float:
        """What a call right after no compute pays beyond its steps at the step latency (the first point of
        ``wake_short``'s curve): the back-to-back ring's price of the short loops' all-reduce (``short_size``)
        less the step's. The step latency is fitted on a series of calls after a unit's compute and carries its
        stalls (0.44-0.90 ms a step over seven calibrations at 2 ranks, back to back 0.21-0.33); a call after no
        compute has none of them (tensor-parallel calls after 0.2-0.45 ms pieces cost 1.1-1.4 ms where the
        step latency priced 1.7-1.8: docs/calibration.md). 0 where the ranks outnumber the cores (every call
        waits for time slices there, as the series' positions do: ``series_late``) and without the back-to-back
        fit (older profiles)."""
        shared = {w: s["back_to_back"] for w, s in (self.samples.get("shared") or {}).items() if "back_to_back" in s}
        if not shared or world > int(self.machine.get("cores") or 1):
            return 0.0
        back_to_back = [float(x) for x in self._nearest(shared, world)]
        return (ring_price("allreduce", self.short_size, world, *back_to_back)
                - ring_price("allreduce", self.short_size, world, *self.ring_step(world)))

    def wake_cost(self, world: int) -> float:
        return float(self._nearest(self.wake, world)) if self.wake else 0.0

    def wake_growth_cost(self, world: int) -> tuple[float, float]:
        """(seconds of wake per second of compute before the call, the compute ``wake`` was measured after):
        an older profile's one line; 0 with a measured curve (``wake_curve_cost``)."""
        if not self.wake_growth or self.wake_curve:
            return 0.0, float(self._nearest(self.wake_phase, world)) if self.wake_phase else 0.0
        return float(self._nearest(self.wake_growth, world)), float(self._nearest(self.wake_phase, world))

    def wake_curve_cost(self, world: int, algo: str = "ring") -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """(seconds of compute before a call, what it pays beyond the wake after the first) as measured for
        the ring's calls (``algo`` "ps": the Worker-Server all-reduce's), None in older profiles."""
        table = self.worker_server_curve if algo == "ps" else self.wake_curve
        if not table:
            return None
        phases, extras = self._nearest(table, world)
        return tuple(float(p) for p in phases), tuple(float(e) for e in extras)

    def handoff_cost(self, world: int) -> float:
        return float(self._nearest(self.handoff, world)) if self.handoff else 0.0

    def resume_cost(self, world: int) -> float:
        return float(self._nearest(self.resume, world)) if self.resume else 0.0

    def resume_after_recv_cost(self, world: int) -> float:
        return float(self._nearest(self.resume_after_recv, world)) if self.resume_after_recv else 0.0

    def step_cost(self, precision: str) -> tuple[dict[str, float], float]:
        """({"step": seconds per step, "step_tensor": per tensor stepped beyond the first, "concat_tensor",
        "concat_element": seconds per gradient tensor and element it concatenates first, "cold_concat_tensor",
        "cold_concat_element": the same where no call's handling touched them after the backward}, params/s) of the
        executor's optimizer step: as timed inside its step where measured, else Adam's rate on a bare tensor."""
        if self.optimizer_step.get(precision):
            overhead, rate = self.optimizer_step[precision]
            per_tensor, per_element = self.step_concat.get(precision) or (0.0, 0.0)
            cold_tensor, cold_element = self.step_concat_cold.get(precision) or (per_tensor, per_element)
            return ({"step": float(overhead), "step_tensor": float(self.optimizer_tensor),
                     "concat_tensor": float(per_tensor), "concat_element": float(per_element),
                     "cold_concat_tensor": float(cold_tensor), "cold_concat_element": float(cold_element)},
                    float(rate))
        return {}, self.optimizer_params_per_s.get("adam", 1e8)

    # -- the simulator's view -------------------------------------------------------------------
    def topology(self, world: int, precision: str) -> Topology:
        """``world`` rank processes on this machine, priced with what was measured."""
        if precision not in self.compute:
            raise SimparError(f"--precision: the hardware profile was calibrated for "
                              f"{', '.join(self.compute)}, not {precision}; recalibrate with --precision")
        # compute is priced as one rank alone: the simulator shares the cores among the ranks computing at
        # each moment (sim/cores.py); copies, which it does not share, take the slowdown of all at once
        slow = self.compute_slowdown(world)
        costs = {phase: (dict(zip(UNIT_KINDS, fit[:-1])), fit[-1]) for phase, fit in self.compute[precision].items()}
        costs["bwd"][0]["embedding_table"] = float(self.embedding_table.get(precision, 0.0))
        for phase, per_score in zip(("fwd", "bwd"), self.attention_scores.get(precision) or ()):
            costs[phase][0]["attention_scores"] = float(per_score)
        costs["step"] = self.step_cost(precision)
        for key, seconds in (self.tp_piece.get(precision) or {}).items():  # "fwd" (a layer piece), "head_fwd"...
            kind, _, phase = key.rpartition("_")
            costs[phase][0][f"tp_{kind or 'piece'}"] = float(seconds)
        cold = self.unit_cold.get(precision)
        if cold:
            costs["cold"] = (float(cold["tau"]), {(kind, phase): float(seconds) for phase in ("fwd", "bwd")
                                                  for kind, seconds in cold[phase].items()})
        rate = costs["fwd"][1]
        ram = 2**30 * 16
        device = GPUSpec("cpu-rank (calibrated)", rate, None, rate, rate, 1.0, ram, 1e12,
                         "simpar calibrate", costs=costs)
        host = HostSpec("cpu-host (calibrated)", 1, ram, self.copy_bytes_per_s, rate,
                        self.optimizer_params_per_s.get("adam", 1e8), "simpar calibrate")
        alpha, bandwidth = self.ring_step(world)
        topology = rank_processes(world, device, host, alpha, bandwidth, self.copy_bytes_per_s / slow,
                                  f"{world} gloo processes on {self.machine['cores']} cores (calibrated)")
        topology.wake_latency, topology.resume_latency = self.wake_cost(world), self.resume_cost(world)
        topology.wake_growth, topology.wake_phase = self.wake_growth_cost(world)
        topology.wake_curve = self.wake_curve_cost(world)
        topology.worker_server_curve = self.wake_curve_cost(world, "ps")
        topology.handoff_latency = self.handoff_cost(world)
        topology.resume_after_recv_latency = self.resume_after_recv_cost(world)
        topology.resume_unit = float(self._nearest(self.resume_unit, world)) if self.resume_unit else 0.0
        if self.resume_short.get(str(world)):  # measured for that world alone
            topology.resume_short = tuple(float(x) for x in self.resume_short[str(world)])
        topology.resume_tail = float(self.resume_tail.get(str(world), 0.0))  # measured for that world alone
        topology.later_steps = float(self.later_steps.get(str(world), 0.0))  # measured for that world alone
        topology.between_ops = self.between_ops
        topology.tensor_work = tuple(self.tensor_work.get(precision) or (0.0, 0.0))
        topology.sharded_work = {kind: tuple(fit) for kind, fit in (self.sharded_work.get(precision) or {}).items()}
        topology.core_slowdown = {int(k): float(v) for k, v in self.slowdown.items()}
        topology.step_latency_by_ranks = {int(k): float(v[0]) for k, v in self.ring.items()}
        topology.handoff_by_ranks = {int(k): float(v) for k, v in self.handoff.items()} or None
        topology.handoff_step_by_ranks = {int(k): float(v) for k, v in self.handoff_step.items()} or None
        topology.send_issue_by_ranks = {int(k): float(v) for k, v in self.send_issue.items()} or None
        topology.late_recv_by_ranks = {int(k): float(v) for k, v in self.late_recv.items()} or None
        topology.late_recv_by_computing = {int(k): float(v) for k, v in  # measured for that world alone
                                           self.late_recv_busy.get(str(world), {}).items()} or None
        topology.send_issue_spread = {int(k): list(v) for k, v in self.send_issue_spread.items() if v} or None
        if str(world) in self.series_late:  # measured where ranks do not outnumber cores, for that world alone
            topology.series_late = (SERIES + 1, float(self.series_late[str(world)]))
        topology.series_level = float(self.series_level.get(str(world), 0.0))  # measured for that world alone
        topology.series_last = float(self.series_last.get(str(world), 0.0))  # likewise
        topology.scatter_level = float(self.scatter_level.get(str(world), 0.0))  # likewise
        if self.series_first.get(str(world)):  # likewise
            topology.gather_short = (tuple(float(x) for x in self.series_first[str(world)]),)
        if self.wake_short:
            topology.wake_short = tuple((float(c), float(p)) for c, p in self._nearest(self.wake_short, world))
            topology.wake_anchor = self.short_anchor(world)
        if self.worker_server:
            wake, latency, rate = (float(x) for x in self._nearest(self.worker_server, world))
            topology.worker_server_wake, topology.worker_server_leg = wake, (latency, rate)
        return topology
