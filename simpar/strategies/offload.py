"""ZeRO-Offload and ZeRO-Infinity: the optimizer lives on the CPU (and, for Infinity, the
parameter and optimizer shards on NVMe), trading GPU memory for PCIe traffic and CPU time.

- zero2-offload: ZeRO-2 on the GPU, but each reduced gradient shard is copied to host memory
  (the GPU holds it only until then),
  the CPU runs Adam on the rank's shard, and the updated 16-bit shard is copied back before the
  all-gather (Ren et al. 2021).
- zero3-offload: the same around ZeRO-3 (the GPU keeps a 16-bit parameter shard).
- zero3-infinity: parameter shards are read from NVMe before every gather; optimizer states are
  read from NVMe for the step and written back with the new parameters (Rajbhandari et al. 2021).
"""

from __future__ import annotations

from simpar.plan import Compute, Copy, Grid, Plan, Program
from simpar.scenario import Scenario
from simpar.strategies import zero, zero3
from simpar.strategies.work import Work


def host_states(prog: Program, work: Work, scenario: Scenario, with_params: bool = True) -> None:
    """What the CPU's step keeps in host memory besides the optimizer states: the gradient shard
    copied down and, in fp32 (where K holds no master copy), its own copy of the parameter shard."""
    n, phi = len(prog.ranks), work.params(range(work.num_units))
    grad_bytes = 4 if work.fp32_grads else work.w  # DeepSpeed's CPU Adam takes fp32 gradients
    if work.fp32_grads and scenario.strategy.name.startswith("zero3"):  # and ZeRO-3 keeps its 16-bit gradient
        grad_bytes += work.w  # partition buffer on the offload device too (stage3.py grad_partitions_flat_buffer)
    prog.alloc("compute", "grads", grad_bytes * phi / n, memory="host", payload="model states")
    if with_params and not scenario.train.mixed and not work.fp32_master:  # (DeepSpeed's: an optimizer state)
        prog.alloc("compute", "params", 4 * phi / n, memory="host", payload="model states")


def _grads_to_host(prog: Program, work: Work, op: int, units: tuple[int, ...], mb: int) -> int:
    """The reduced gradient shard of a bucket waits on the GPU only until it is copied down."""
    n = len(prog.ranks)
    nbytes = work.w * work.params(units) // n
    prog.alloc("comm", "buffers", nbytes, payload=f"reduced grads of units {units[0]}..{units[-1]}", deps=[op])
    copy = prog.add(Copy, "copy", [op], src="gpu", dst="host", nbytes=nbytes, payload="grads", units=units)
    prog.free("copy", "buffers", nbytes, payload=f"reduced grads of units {units[0]}..{units[-1]}")
    return copy


def _host_step(prog: Program, work: Work, last) -> int:
    """Adam on the CPU over this rank's shard, then its new 16-bit parameters back to the GPU."""
    n = len(prog.ranks)
    phi = work.params(range(work.num_units))
    step = prog.add(Compute, "host", last, phase="step", params=phi // n, device="host")
    return prog.add(Copy, "copy", [step], src="host", dst="gpu", nbytes=work.w * phi // n, payload="params")


def build_zero2(scenario: Scenario) -> Plan:
    spec = scenario.strategy
    work, n = Work(scenario), spec.dp
    prog = Program(tuple(range(n)), name="all ranks")
    phi = work.params(range(work.num_units))
    work.static(prog, work.w * phi, 0, work.k * phi / n, optimizer_memory="host")
    host_states(prog, work, scenario)
    copies = zero.reduce_gradients(prog, work, scenario, sharded_grads=True, after_reduce=_grads_to_host)
    zero.gather_parameters(prog, work, spec, _host_step(prog, work, copies))
    return Plan(spec.name, Grid(dp=n), [prog])


def _params_from_host(prog: Program, work: Work, unit: int, mb: int, deps) -> int:
    """offload_param: the rank's 16-bit shard of a unit comes up from host memory before its gather."""
    nbytes = work.w * work.units[unit].params // len(prog.ranks)
    return prog.add(Copy, "copy", deps, src="host", dst="gpu", nbytes=nbytes, payload=f"params unit{unit} mb{mb}",
                    units=(unit,))


def _host_step_in_place(prog: Program, work: Work, last) -> int:
    """offload_param: Adam on the CPU updates the shard where it lives, in host memory."""
    phi = work.params(range(work.num_units))
    return prog.add(Compute, "host", last, phase="step", params=phi // len(prog.ranks), device="host")


def build_zero3(scenario: Scenario) -> Plan:
    if scenario.strategy.offload_params:  # DeepSpeed's offload_param: the parameter shards live on the host too
        return zero3.build(scenario, before_gather=_params_from_host, after_reduce=_grads_to_host,
                           params_memory="host", optimizer_memory="host", step=_host_step_in_place,
                           host_states=host_states)
    return zero3.build(scenario, after_reduce=_grads_to_host, optimizer_memory="host", step=_host_step,
                       host_states=host_states)


def _params_from_nvme(prog: Program, work: Work, unit: int, mb: int, deps) -> int:
    nbytes = work.w * work.units[unit].params // len(prog.ranks)
    return prog.add(Copy, "copy", deps, src="nvme", dst="gpu", nbytes=nbytes, payload=f"params unit{unit} mb{mb}",
                    units=(unit,))


def _nvme_step(prog: Program, work: Work, last) -> int:
    """Optimizer states stream in from NVMe, the CPU updates them, both go back out. In fp32 the
    parameter shard on NVMe is the master copy the CPU updates, so it is read in as well (with
    mixed precision the fp32 master is one of the K optimizer bytes)."""
    n = len(prog.ranks)
    phi = work.params(range(work.num_units))
    states = work.k * phi // n
    master = 0 if work.mixed else work.w * phi // n
    prog.alloc("copy", "buffers", states + master, memory="host", payload="optimizer states from NVMe")
    reads = [prog.add(Copy, "copy", last, src="nvme", dst="host", nbytes=states, payload="optimizer states")]
    if master:
        reads.append(prog.add(Copy, "copy", last, src="nvme", dst="host", nbytes=master, payload="params"))
    update = prog.add(Compute, "host", reads, phase="step", params=phi // n, device="host")
    prog.add(Copy, "copy", [update], src="host", dst="nvme", nbytes=states, payload="optimizer states")
    done = prog.add(Copy, "copy", [update], src="host", dst="nvme", nbytes=work.w * phi // n, payload="params")
    prog.free("copy", "buffers", states + master, memory="host", payload="optimizer states from NVMe")
    return done


def build_infinity(scenario: Scenario) -> Plan:
    return zero3.build(scenario, before_gather=_params_from_nvme, after_reduce=_grads_to_host,
                       params_memory="nvme", optimizer_memory="nvme", step=_nvme_step,
                       host_states=lambda prog, work, scenario: host_states(prog, work, scenario, False))
