"""What one op of a Plan costs on its own: compute (calibrated costs, the kernel model, or a roofline;
the host's optimizer step shared by the ranks on its machine), and which node a rank's memory is.
Shared by the SimPy simulator and the fixed-duration evaluator (sim/fast.py)."""

from __future__ import annotations

from collections import Counter, defaultdict

from simpar.collectives.ring import ring_steps
from simpar.costs.kernels import Shape, unit_kernels
from simpar.costs.pricing import KernelPricer
from simpar.errors import SimparError
from simpar.plan import Alloc, Collective, Compute, Copy, Free, Plan, Recv, Send
from simpar.scenario import Scenario
from simpar.sim.accumulation import accumulating
from simpar.sim.cores import slowdown_at
from simpar.topologies.graph import Topology


def moved_tensors(spec, op: Collective) -> int:
    """The parameter tensors a data-parallel collective's data holds: its modules' or its units' (the executor
    handles each: ``OpCosts.handling``)."""
    if op.modules:
        names = [name for name, _ in spec.unit_modules(spec.unit_kind(op.units[0]))]
        return sum(spec.module_tensors(names[m]) for m in op.modules)
    return sum(spec.unit_tensors(spec.unit_kind(u)) for u in op.units)


class OpCosts:
    def __init__(self, plan: Plan, scenario: Scenario, topology: Topology):
        self.plan, self.scenario, self.topology = plan, scenario, topology
        gpu = topology.graph.nodes[topology.gpus[0]]["spec"]
        dtype = scenario.train.compute_dtype
        if getattr(gpu, f"{dtype}_flops") is None:
            raise SimparError(f"--precision: {gpu.name} has no fast {dtype}; use fp16-mixed or fp32")
        if scenario.train.fp8 and gpu.fp8_flops is None:
            raise SimparError(f"--precision: fp8-mixed needs FP8 tensor cores (Hopper or later: h100-sxm, h200, b200, "
                              f"gb200); {gpu.name} has none, use bf16-mixed")
        self.gpu = gpu
        self.flops_rate = gpu.flops(dtype)
        self.kernel_pricer = KernelPricer(scenario, gpu) if gpu.kernels is not None else None
        self._machines = self._machine_nodes()
        self._shares: dict = {}  # (unit kind, phase, part) -> share of the unit's calibrated overhead
        self._sharded: dict[str, bool] = {}  # params, grads -> whether ranks keep less than the whole model's
        turns = (topology.wake_latency or topology.wake_curve or topology.wake_short or topology.resume_latency
                 or topology.handoff_latency or topology.resume_after_recv_latency)
        self.after_compute, self.after_network = self._turns() if turns else ({}, {})
        self.paces = self._paces()
        self.accumulate = (self._accumulation() if gpu.costs is not None and "accumulate" in topology.sharded_work
                           else {})

    def _turns(self) -> tuple[dict, dict]:
        """(program, op id) -> seconds of compute since the program's last network op, of every collective and
        send that comes right after computing (its wake), and (program, op id) -> the resume of every compute
        that comes right after a collective, send or receive (after a pipeline receive the rank waits to be
        handed a core: ``resume_after_recv_latency``), in program order, memory bookkeeping aside. The compute is
        counted at its time with every rank computing at once on the cores they share (the pattern the wake
        was measured in; sim/cores.py) and round the step: a second lap gives the step's first call the compute
        after its last one (DDP's all-reduce comes after the previous step's optimizer too, as in a run of many
        steps)."""
        woken, resumed = {}, {}
        slow = self._all_at_once()
        laps = 2 if self.topology.wake_curve or self.topology.wake_short else 1
        for pi, prog in enumerate(self.plan.programs):
            phase, last = 0.0, None  # the compute since the last network op; the op before (kept between laps)
            for _ in range(laps):
                for op in prog.ops:
                    if isinstance(op, (Alloc, Free)):
                        continue
                    network = isinstance(op, (Collective, Send, Recv))
                    if isinstance(op, (Collective, Send)) and isinstance(last, (Compute, Copy)):
                        woken[(pi, op.id)] = phase
                    if isinstance(op, Compute):
                        resume = 0.0
                        if op.device == "gpu" and isinstance(last, (Collective, Send, Recv)):
                            resume = (self.topology.resume_after_recv_latency if isinstance(last, Recv)
                                      else self.topology.resume_latency)
                            if resume:
                                resumed[(pi, op.id)] = resume
                        phase += (self.compute_time(prog, op) + resume) * slow
                    phase = 0.0 if network else phase
                    last = op if network or isinstance(op, (Compute, Copy)) else last
        return woken, resumed

    def _paces(self) -> dict:
        """(program, op id) -> the compute a call's wake is read at, where not the compute right before it: each
        program's ring collectives after a short compute (below ``wake_phase``, where ``wake_short`` prices them)
        at the mean of their computes. What such a call pays beyond its steps follows the rank's pace over several
        calls more than the compute just before it (two computes alternated before a call, their calls cost
        nearly alike, where loops of either alone cost 0.08-0.47 ms apart a call at 2 ranks). A step's first
        call (``Program.calls_after_step``) keeps its own compute: it follows the optimizer's stretch."""
        paces: dict = {}
        if not self.topology.wake_short:
            return paces
        woken = self.after_compute
        for pi, prog in enumerate(self.plan.programs):
            stepped = prog.calls_after_step()  # a step's first call: the optimizer's stretch, not the pace
            keys = [(pi, op.id) for op in prog.ops if (pi, op.id) in woken and isinstance(op, Collective)
                    and op.algo in (None, "ring") and not self._sharded_gather(op) and op.id not in stepped
                    and woken[(pi, op.id)] < self.topology.wake_phase]
            if len(keys) > 1:
                paces.update(dict.fromkeys(keys, sum(woken[key] for key in keys) / len(keys)))
        return paces

    def _all_at_once(self) -> float:
        """How much slower a rank computes with every rank of the world computing at once on shared cores (1
        elsewhere): the speed ``_turns`` counts a program's compute at."""
        table = self.topology.core_slowdown
        return slowdown_at(table, self.plan.grid.world) if table else 1.0

    def handling(self, op: Collective) -> float:
        """Seconds the executor spends on a data-parallel collective's data besides moving it: concatenating
        the units' (or the module's) parameter tensors into one buffer, scaling, and re-pointing each tensor
        into the result (``Topology.tensor_work``: per tensor, per element; 0 for tensor-parallel activations,
        which are one tensor already, and elsewhere). Paid in the call, at one rank's speed: at 8 ranks on 2
        cores DDP's took about what it takes at 2 (before and after the ring 1.9-3.4 ms a step against 2.0-4.9),
        not 4x: the other ranks wait in the ring meanwhile instead of computing."""
        per_tensor, per_element = self.topology.tensor_work
        if op.group == "tp" or op.payload not in ("grads", "params") or not (per_tensor or per_element):
            return 0.0
        if self.topology.sharded_work:
            per_tensor, per_element = self.topology.sharded_work.get(self._handling_kind(op), (per_tensor, per_element))
        return per_tensor * moved_tensors(self.scenario.model, op) + per_element * op.nbytes / op.itemsize

    def _handling_kind(self, op: Collective) -> str:
        """Which of the executor's ways of handling its data a collective takes: "gather", an all-gather of
        whole units' parameters that its ranks hold whole (ZeRO-1 and 2: the gathered buffer copied into
        each, nothing concatenated); "scatter", a reduce-scatter of gradients its ranks keep only as the
        reduced shard (ZeRO-2 and 3: concatenated, then each dropped, nothing re-pointed); "" the
        all-reduce's (ZeRO-1's reduce-scatter, which re-points every gradient into the result, included)."""
        if op.op == "allgather" and op.payload == "params" and not op.modules and not self._kept_sharded("params"):
            return "gather"
        if op.op == "reducescatter" and op.payload == "grads" and self._kept_sharded("grads"):
            return "scatter"
        return ""

    @staticmethod
    def _held_units(prog) -> set[int]:
        """The units whose parameters a program's rank holds: those it computes."""
        return {op.unit for op in prog.ops if isinstance(op, Compute) and op.unit >= 0}

    def _sharded_gather(self, op: Collective) -> bool:
        """Whether a collective is ZeRO-3's gather of parameters the ranks keep sharded (a series of calls that
        keeps its ranks in step: its wake is read at its own compute, not the program's pace)."""
        return op.op == "allgather" and op.payload == "params" and self._kept_sharded("params")

    def _kept_sharded(self, category: str) -> bool:
        """Whether a rank keeps less than its whole model's ``category`` (params, grads) on the device for the
        step (as the executor tells: real/states.py), from the first program's allocations."""
        if category not in self._sharded:
            from simpar.strategies.work import Work

            prog = self.plan.programs[0]
            whole = self.scenario.train.weight_bytes * Work(self.scenario).params(self._held_units(prog))
            self._sharded[category] = prog.kept_bytes(category) < whole
        return self._sharded[category]

    def wakes(self, pi: int, op) -> bool:
        return (pi, op.id) in self.after_compute

    def wake(self, pi: int, op: Collective) -> float:
        """Seconds a collective pays besides its steps on the executor's ranks: the topology's wake after
        the compute before it (0 after another call, and elsewhere), what its later steps stall beyond their
        price after that compute (``later_steps``), and the handling of its data."""
        phase = self.after_compute.get((pi, op.id))
        if phase is None:
            return self.handling(op)
        pace = self.paces.get((pi, op.id), phase)
        return self.topology.collective_wake(pace, op.algo) + self.later_steps(op, phase) + self.handling(op)

    def later_steps(self, op: Collective, phase: float) -> float:
        """What a ring collective's steps after its first pay beyond their price when it comes after ``phase``
        seconds of compute (from the compute the wake was measured after on): the topology's ``later_steps``, the
        calibration's loops' all-reduce's, by the share of that all-reduce's later steps this call has (at 2 ranks
        all of it for an all-reduce, none for a one-step all-gather or reduce-scatter; calibrate/lag.py)."""
        topology = self.topology
        if not topology.later_steps or op.algo not in (None, "ring") or phase < topology.wake_phase:
            return 0.0
        ranks = getattr(self.plan.grid, op.group)
        loop_later = ring_steps("allreduce", ranks) - 1  # the later steps of the loops' all-reduce
        return topology.later_steps * (ring_steps(op.op, ranks) - 1) / loop_later if loop_later > 0 else 0.0

    def resume(self, pi: int, op: Compute) -> float:
        """What a compute pays on the executor's ranks beyond its work: the resume right after a call and a
        backward's adding its gradients into those an earlier micro-batch left (0 elsewhere)."""
        key = (pi, op.id)
        return self.after_network.get(key, 0.0) + self.accumulate.get(key, 0.0)

    def _accumulation(self) -> dict[tuple[int, int], float]:
        """(program, op id) -> seconds a backward compute pays to add its unit's gradients into held ones
        (sim/accumulation.py): the calibrated cost per tensor and per parameter (``sharded_work``'s
        "accumulate") over the unit's tensors and the parameters a rank holds of it; a tensor-parallel piece
        its share of them (``_overhead_share``)."""
        from simpar.strategies.work import Work

        per_tensor, per_element = self.topology.sharded_work["accumulate"]
        spec, work = self.scenario.model, Work(self.scenario)
        dropped = self._kept_sharded("grads")
        paid = {}
        for pi, prog in enumerate(self.plan.programs):
            for op in accumulating(prog, dropped):
                kind = spec.unit_kind(op.unit)
                share = self._overhead_share(kind, op) if op.part else 1.0
                tensors, params = spec.unit_tensors(kind), work.params((op.unit,))  # a rank's shard of them
                paid[(pi, op.id)] = share * (per_tensor * tensors + per_element * params)
        return paid

    def _machine_nodes(self) -> dict:
        nodes: dict = defaultdict(dict)
        for name, data in self.topology.graph.nodes(data=True):
            if data["kind"] in ("host", "nvme"):
                nodes[data["machine"]][data["kind"]] = name
        ranks = Counter(self.topology.machine(g) for g in self.topology.gpus[:self.plan.grid.world])
        for machine, count in ranks.items():
            nodes[machine]["ranks"] = count
        return nodes

    def compute_time(self, prog, op: Compute) -> float:
        if op.device == "host":
            machine = self._machines[self.topology.machine(self.topology.gpus[prog.ranks[0]])]
            host = self.topology.graph.nodes[self._host_node(machine, "host")]["spec"]
            return op.params * machine["ranks"] / host.adam_params_per_s  # the host's cores are shared
        kind = self.scenario.model.unit_kind(op.unit)
        if self.gpu.costs is not None:  # a calibrated profile: the framework's overhead, then the work
            overheads, rate = self.gpu.costs[op.phase]
            if op.phase == "step":  # one optimizer step of the rank's parameters, whatever units they are
                return overheads.get("step", 0.0) + op.params / rate
            whole = overheads.get(kind, overheads.get("layer", 0.0) if kind == "moe" else 0.0)  # (MoE: a layer's)
            overhead = whole * self._overhead_share(kind, op) if op.part else whole
            if kind in ("layer", "moe") and self._has_attention(op):
                overhead += self._attention_scores_cost(op)
            return overhead + op.flops / rate
        if self.kernel_pricer is not None:  # a GPU: the kernels the unit launches, each priced by shape
            return self.kernel_pricer.time(kind, op)
        return max(op.flops / self.flops_rate, op.bytes / self.gpu.memory_bandwidth)

    @staticmethod
    def _has_attention(op: Compute) -> bool:
        """Whether a layer's compute runs its attention: the whole layer, or tensor parallelism's attention
        piece (not its MLP, nor the weight-gradient half of a split backward: TP overlap's, zero bubble's W)."""
        return op.part in ("", "/input") or (op.part.startswith("attn") and not op.part.endswith(("wgrad", "weight")))

    def _attention_scores_cost(self, op: Compute) -> float:
        """Seconds a layer's attention scores cost on a calibrated profile: its scores on one rank (1/tp of
        the heads) at the phase's calibrated cost per score; a backward that recomputes the attention (full
        or selective recomputation) computes its forward scores again."""
        costs, spec = self.gpu.costs, self.scenario.strategy
        per_score = costs[op.phase][0].get("attention_scores", 0.0)
        if op.phase == "bwd" and spec.recompute != "none":
            per_score += costs["fwd"][0].get("attention_scores", 0.0)
        return per_score * self.scenario.model.attention_scores(self.scenario.train.micro_batch, spec.tp)

    def _overhead_share(self, kind: str, op: Compute) -> float:
        """The share of a whole unit's calibrated overhead that a piece of it (``op.part``: where tensor
        parallelism cuts a layer) pays: its share of the unit's kernels. The overhead is the framework's
        cost per op launched, and the unit's ops are divided among its pieces, not repeated in each (priced
        whole in every piece, tp's layers paid theirs twice: a forward piece 1.9 ms against 0.53 ms measured
        on 2 ranks)."""
        key = (kind, op.phase, op.part)
        if key not in self._shares:
            shape = Shape.of(self.scenario)
            whole = len(unit_kernels(shape, kind, op.phase, ""))
            self._shares[key] = len(unit_kernels(shape, kind, op.phase, op.part)) / whole if whole else 1.0
        return self._shares[key]

    def _host_node(self, machine: dict, kind: str) -> str:
        if kind not in machine:
            raise SimparError(f"--topology: {self.topology.name} has no {kind} memory for "
                              f"{self.plan.strategy} to offload to; use pcie, workstation or dgx-*")
        return machine[kind]

    def node(self, rank: int, memory: str) -> str:
        gpu = self.topology.gpus[rank]
        if memory == "gpu":
            return gpu
        return self._host_node(self._machines[self.topology.machine(gpu)], memory)

