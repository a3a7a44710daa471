"""A calibrated CPU profile: what the micro-benchmarks measured, fitted into the terms the simulator prices the
executor's gloo ranks with, saved as JSON and turned back into a topology. Each term, what it models and how it
is measured, is in docs/calibration.md ("The CPU model"); ``benchmarks/ablation.py`` shows each one earns its place.

Compute is one rank alone (the simulator shares the cores among the ranks computing at each moment:
sim/cores.py, k ranks on c cores at max(1, k / c) each). Terms measured per world size are read at the world
asked for; beyond the largest measured, where ranks outnumber the cores, the latencies grow with the ranks per
core (every call waits for each rank's time slice): ``_at``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

import numpy as np

from simpar.calibrate.fits import UNIT_KINDS, ring_price
from simpar.devices.specs import GPUSpec, HostSpec
from simpar.errors import SimparError
from simpar.real.cpu_profile import rank_processes
from simpar.topologies.graph import Topology

if TYPE_CHECKING:
    from simpar.costs.gpu_profile import GPUProfile

VERSION = 23
PHASE_SIZE = 2**18  # bytes of the all-reduce after the calibration's long computes (phase_worker)
SHORT_SIZE = 2**14  # ... and after its short ones: a tensor-parallel activation's size
# the profile's tables keyed by world size (the number of ranks measured at once)
PER_WORLD = ("ring", "wake", "wake_phase", "wake_curve", "wake_short", "later_steps", "resume", "resume_after_recv",
             "handoff", "late_recv", "worker_server")


@dataclass
class HardwareProfile:
    machine: dict
    compute: dict[str, dict[str, list[float]]]  # precision -> phase -> [overhead per UNIT_KINDS..., FLOP/s]
    ring: dict[str, list[float]]  # world -> [seconds, bytes/s] of one ring step
    optimizer_params_per_s: dict[str, float]  # adam / sgd on a bare tensor (the host's optimizer, offload)
    copy_bytes_per_s: float
    samples: dict = field(default_factory=dict)  # the raw measurements, for the record
    version: int = VERSION
    # precision -> [forward, backward] seconds per attention score (batch x heads x seq^2 on one rank)
    attention_scores: dict[str, list[float]] = field(default_factory=dict)
    # precision -> [seconds, params/s] of the executor's optimizer step op, timed inside its step
    optimizer_step: dict[str, list[float]] = field(default_factory=dict)
    # precision -> kind -> [seconds per parameter tensor, per parameter] of the executor's handling of a
    # data-parallel call's data ("": an all-reduce's; "gather", "scatter", "accumulate": ZeRO's)
    handling: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    wake: dict[str, float] = field(default_factory=dict)  # world -> the first call after a unit's compute
    wake_phase: dict[str, float] = field(default_factory=dict)  # world -> that unit's compute (seconds)
    # world -> [[compute before the call...], [what it pays beyond the wake...]]: longer computes
    wake_curve: dict[str, list[list[float]]] = field(default_factory=dict)
    # world -> [[a short compute, what the call after it pays beyond its price], ...]: shorter computes
    wake_short: dict[str, list[list[float]]] = field(default_factory=dict)
    # world -> seconds a ring call's later steps pay, together, after a compute (for the phase loops' all-reduce)
    later_steps: dict[str, float] = field(default_factory=dict)
    resume: dict[str, float] = field(default_factory=dict)  # world -> the first compute after a call pays
    resume_after_recv: dict[str, float] = field(default_factory=dict)  # ... after a pipeline receive
    handoff: dict[str, float] = field(default_factory=dict)  # world -> a pipeline send after computing pays
    late_recv: dict[str, float] = field(default_factory=dict)  # world -> a receive posted after its send pays
    # world -> [wake s, latency s per leg, bytes/s per leg] of the executor's Worker-Server all-reduce
    worker_server: dict[str, list[float]] = field(default_factory=dict)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(asdict(self), handle, indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> HardwareProfile:
        """A profile from its JSON, fields this simpar does not know left out (``benchmarks/ablation.py`` reads the
        profiles a ``validate --save`` kept, whatever their version)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, path: str) -> HardwareProfile | GPUProfile:
        """A CPU-rank profile, or the GPU profile (``kind: gpu``) that ``--backend nccl`` writes."""
        try:
            with open(path) as handle:
                data = json.load(handle)
            if isinstance(data, dict) and data.get("kind") == "gpu":  # simpar calibrate --backend nccl
                from simpar.costs.gpu_profile import GPUProfile

                return GPUProfile.from_dict(data, path)
            if data.get("version") != VERSION:
                raise SimparError(f"--hardware: {path} is a version {data.get('version')} profile; "
                                  f"recalibrate (simpar calibrate) for version {VERSION}")
            return cls(**data)
        except OSError as exc:
            raise SimparError(f"--hardware: cannot read {path!r}: {exc.strerror}") from None
        except (json.JSONDecodeError, TypeError, AttributeError) as exc:
            raise SimparError(f"--hardware: {path} is not a simpar hardware profile ({exc})") from None

    # -- reading by world size ------------------------------------------------------------------
    @property
    def cores(self) -> int:
        return int(self.machine.get("cores") or 1)

    def _at(self, table: dict, world: int, latency: bool = True):
        """The entry for ``world``, else the nearest measured one on a log scale; beyond the largest measured
        where the ranks outnumber the cores, a latency (``latency``) grows with the ranks per core."""
        if not table:
            return None
        keys = sorted(int(k) for k in table)
        best = min(keys, key=lambda k: abs(np.log(k) - np.log(world)))
        value = table[str(best)]
        if latency and world > best >= self.cores and isinstance(value, (int, float)):
            return float(value) * world / best
        return value

    def ring_step(self, world: int) -> tuple[float, float]:
        alpha, bandwidth = self._at(self.ring, world, latency=False)
        return float(self._at({k: v[0] for k, v in self.ring.items()}, world)), float(bandwidth)

    def short_anchor(self, world: int) -> float:
        """What a call right after no compute pays beyond its steps at the step latency (the first point of
        ``wake_short``'s curve): the back-to-back ring's price of the short loops' all-reduce less the in-step
        one's, where the ranks fit the cores (the step latency is fitted after a unit's compute and carries its
        stalls; back to back there are none); 0 elsewhere."""
        shared = {w: s["back_to_back"] for w, s in (self.samples.get("shared") or {}).items() if "back_to_back" in s}
        if not shared or world > self.cores:
            return 0.0
        back_to_back = [float(x) for x in self._at(shared, world, latency=False)]
        return (ring_price("allreduce", SHORT_SIZE, world, *back_to_back)
                - ring_price("allreduce", SHORT_SIZE, world, *self.ring_step(world)))

    def step_cost(self, precision: str) -> tuple[dict[str, float], float]:
        """({"step": seconds per step}, params/s) of the executor's optimizer step, else Adam's bare rate."""
        if self.optimizer_step.get(precision):
            overhead, rate = self.optimizer_step[precision]
            return {"step": float(overhead)}, float(rate)
        return {}, self.optimizer_params_per_s.get("adam", 1e8)

    # -- the simulator's view -------------------------------------------------------------------
    def topology(self, world: int, precision: str) -> Topology:
        """``world`` rank processes on this machine, priced with what was measured."""
        if precision not in self.compute:
            raise SimparError(f"--precision: the hardware profile was calibrated for "
                              f"{', '.join(self.compute)}, not {precision}; recalibrate with --precision")
        costs = {phase: (dict(zip(UNIT_KINDS, fit[:-1])), fit[-1]) for phase, fit in self.compute[precision].items()}
        for phase, per_score in zip(("fwd", "bwd"), self.attention_scores.get(precision) or ()):
            costs[phase][0]["attention_scores"] = float(per_score)
        costs["step"] = self.step_cost(precision)
        rate = costs["fwd"][1]
        ram = 2**30 * 16
        device = GPUSpec("cpu-rank (calibrated)", rate, None, rate, rate, 1.0, ram, 1e12,
                         "simpar calibrate", costs=costs)
        host = HostSpec("cpu-host (calibrated)", 1, ram, self.copy_bytes_per_s, rate,
                        self.optimizer_params_per_s.get("adam", 1e8), "simpar calibrate")
        # the cores shared in proportion: copies, which the simulator does not share, at all ranks' share
        shared = {k: max(1.0, k / self.cores) for k in range(1, max(world, 2) + 1)}
        alpha, bandwidth = self.ring_step(world)
        topology = rank_processes(world, device, host, alpha, bandwidth, self.copy_bytes_per_s / shared[world],
                                  f"{world} gloo processes on {self.cores} cores (calibrated)")
        topology.core_slowdown = shared
        topology.wake_latency = float(self._at(self.wake, world) or 0.0)
        topology.wake_phase = float(self._at(self.wake_phase, world) or 0.0)
        if self.wake_curve:
            phases, extras = self._at(self.wake_curve, world, latency=False)
            topology.wake_curve = tuple(map(float, phases)), tuple(map(float, extras))
        if self.wake_short:
            topology.wake_short = tuple((float(c), float(p)) for c, p in self._at(self.wake_short, world, False))
            topology.wake_anchor = self.short_anchor(world)
        topology.later_steps = float(self.later_steps.get(str(world), 0.0))  # measured for that world alone
        topology.resume_latency = float(self._at(self.resume, world) or 0.0)
        topology.resume_after_recv_latency = float(self._at(self.resume_after_recv, world) or 0.0)
        topology.handoff_latency = float(self._at(self.handoff, world) or 0.0)
        handled = self.handling.get(precision) or {}
        topology.tensor_work = tuple(handled.get("", (0.0, 0.0)))
        topology.sharded_work = {kind: tuple(fit) for kind, fit in handled.items() if kind}
        measured = sorted(int(k) for k in self.ring)
        by_ranks = sorted(set(measured) | {world})  # the tables a pipeline message reads by ranks runnable
        topology.step_latency_by_ranks = {k: self.ring_step(k)[0] for k in by_ranks}
        if self.handoff:
            topology.handoff_by_ranks = {k: float(self._at(self.handoff, k)) for k in by_ranks}
        if self.late_recv:
            topology.late_recv_by_ranks = {k: float(self._at(self.late_recv, k)) for k in by_ranks}
        if self.worker_server:
            wake, latency, leg_rate = (float(x) for x in self._at(self.worker_server, world, latency=False))
            scale = self._scale(self.worker_server, world)
            topology.worker_server_wake, topology.worker_server_leg = wake * scale, (latency * scale, leg_rate)
        return topology

    def _scale(self, table: dict, world: int) -> float:
        """How much a latency of ``table`` grows from the nearest measured world to ``world`` (``_at``)."""
        keys = sorted(int(k) for k in table)
        best = min(keys, key=lambda k: abs(np.log(k) - np.log(world)))
        return world / best if world > best >= self.cores else 1.0
