"""Cluster files (``--cluster my.yaml``): read, validate with one clear error per mistake, write.

The schema is documented in docs/clusters.md; ``simpar topologies --show NAME`` prints any preset
in it. Quantities are numbers in SI base units (bytes/s, seconds, bytes, FLOP/s) or strings with
units: rates "300GB/s" (bytes) or "200Gb/s" (bits), times "0.6us", sizes "80GiB", FLOP/s "312T".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from simpar import devices
from simpar.costs.nccl import LINK_EFFICIENCY
from simpar.devices.specs import GPUSpec, HostSpec, NVMeSpec
from simpar.errors import SimparError
from simpar.topologies.cluster import FABRICS, NETWORKS, NIC_ATTACH, PCIE_X16, Cluster, IntraNode, Network, Nics, Pcie

_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
       "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_RATE = re.compile(r"^\s*([0-9.eE+-]+)\s*([kKmMgGtTpP]?)\s*(B|b)(?:/s|ps)\s*$")
_TIME = re.compile(r"^\s*([0-9.eE+-]+)\s*(s|ms|us|µs|ns)\s*$")
_TIME_UNITS = {"s": "1", "ms": "1e-3", "us": "1e-6", "µs": "1e-6", "ns": "1e-9"}
_SIZE = re.compile(r"^\s*([0-9.eE+-]+)\s*([kKmMgGtTpP]i?)?\s*B?\s*$")


class _Reader:
    """Reads one section of the file, naming every key it complains about by its full path."""

    def __init__(self, raw, where: str, source: str):
        if not isinstance(raw, dict):
            raise SimparError(f"cluster {source}: {where}: expected a mapping of keys, got {raw!r}")
        self.raw, self.where, self.source = raw, where, source
        self.used: set[str] = set()

    def fail(self, key: str, message: str):
        path = f"{self.where}.{key}" if self.where else key
        raise SimparError(f"cluster {self.source}: {path}: {message}")

    def get(self, key: str, default=None, required: bool = False):
        self.used.add(key)
        if key not in self.raw or self.raw[key] is None:
            if required:
                self.fail(key, "missing (required)")
            return default
        return self.raw[key]

    def done(self, allowed: tuple[str, ...]) -> None:
        for key in self.raw:
            if key not in allowed:
                self.fail(key, f"unknown key (typo?); expected one of {', '.join(allowed)}")

    def section(self, key: str):
        value = self.get(key)
        return None if value is None else _Reader(value, f"{self.where}.{key}" if self.where else key, self.source)

    # -- typed values ------------------------------------------------------------------------
    def integer(self, key: str, default=None, minimum: int = 1, required: bool = False) -> int:
        value = self.get(key, default, required)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(key, f"must be a whole number >= {minimum}, got {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {value!r}")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = str(self.get(key, default)).strip().lower()
        if value not in choices:
            self.fail(key, f"unknown {value!r}; choose from {', '.join(choices)}")
        return value

    def _number(self, key: str, value, pattern: re.Pattern, scale) -> float:
        if isinstance(value, bool):
            self.fail(key, f"expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        match = pattern.match(str(value))
        try:
            if not match:
                raise InvalidOperation
            return float(Decimal(match.group(1)) * scale(match))
        except InvalidOperation:
            self.fail(key, f"cannot read {value!r} (examples: {_EXAMPLES[pattern]})")

    def rate(self, key: str, default=None, required: bool = False) -> float:
        """Bytes/s; "GB/s" is bytes, "Gb/s" bits (as NICs are sold)."""
        value = self.get(key, default, required)
        rate = self._number(key, value, _RATE, lambda m: Decimal(_SI[m.group(2).lower()]) /
                            (8 if m.group(3) == "b" else 1))
        return self._positive(key, rate, value)

    def seconds(self, key: str, default) -> float:
        value = self.get(key, default)
        seconds = self._number(key, value, _TIME, lambda m: Decimal(_TIME_UNITS[m.group(2)]))
        if seconds < 0:
            self.fail(key, f"must not be negative, got {value!r}")
        return seconds

    def size(self, key: str, default=None, required: bool = False) -> float:
        value = self.get(key, default, required)
        size = self._number(key, value, _SIZE, lambda m: Decimal(_SI[(m.group(2) or "").lower()]))
        return self._positive(key, size, value)

    def _positive(self, key: str, number: float, value) -> float:
        if not number > 0 or number == float("inf"):
            self.fail(key, f"must be positive, got {value!r}")
        return number

    def efficiency(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, str):
            if value.strip().lower() not in LINK_EFFICIENCY:
                self.fail(key, f"unknown link class {value!r}; give a fraction or one of {', '.join(LINK_EFFICIENCY)}")
            return LINK_EFFICIENCY[value.strip().lower()]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            self.fail(key, f"must be a fraction in (0, 1] or a link class, got {value!r}")
        return float(value)


_EXAMPLES = {_RATE: "300GB/s, 200Gb/s, 25e9", _TIME: "0.6us, 5e-6, 2ms", _SIZE: "80GiB, 141e9, 312T"}

# Inline device fields: file key -> (dataclass field, reader method)
_GPU_FIELDS = {"memory": ("memory_bytes", "size"), "memory_bandwidth": ("memory_bandwidth", "rate"),
               "achievable_fraction": ("achievable_fraction", "fraction")}
_HOST_FIELDS = {"cores": ("cores", "integer"), "memory": ("memory_bytes", "size"),
                "memory_bandwidth": ("memory_bandwidth", "rate"), "peak_flops": ("fp32_flops", "size"),
                "adam_params_per_s": ("adam_params_per_s", "size")}
_NVME_FIELDS = {"capacity": ("capacity_bytes", "size"), "read_bandwidth": ("read_bandwidth", "rate"),
                "write_bandwidth": ("write_bandwidth", "rate")}


def _device(reader: _Reader, key: str, table: dict, cls, fields: dict, required: bool = False):
    """A preset name, or a mapping: {preset: NAME (optional), name, and fields to set or override}."""
    value = reader.get(key, required=required)
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() not in table:
            reader.fail(key, f"unknown preset {value!r}; choose from {', '.join(table)} or give a mapping")
        return table[value.strip().lower()]
    r = reader.section(key)
    base = r.get("preset")
    if base is not None and str(base).strip().lower() not in table:
        r.fail("preset", f"unknown {base!r}; choose from {', '.join(table)}")
    values = {}
    for name, (attr, kind) in fields.items():
        if r.get(name) is not None:
            if kind == "fraction":
                values[attr] = r.efficiency(name, None)
            elif kind == "integer":
                values[attr] = r.integer(name)
            else:
                values[attr] = int(getattr(r, kind)(name)) if attr.endswith("_bytes") or attr == "cores" \
                    else getattr(r, kind)(name)
    peaks = r.section("peak_flops") if cls is GPUSpec else None
    if peaks is not None:
        for dtype in devices.DTYPES:
            if peaks.get(dtype) is not None:
                values[f"{dtype}_flops"] = peaks.size(dtype)
        peaks.done(devices.DTYPES)
    allowed = ("preset", "name", *fields, *(("peak_flops",) if cls is GPUSpec else ()))
    r.done(allowed)
    name = str(r.get("name", f"{base}-custom" if base else None, required=base is None))
    if base is not None:
        return dataclasses.replace(table[str(base).strip().lower()], name=name, **values,
                                   source=f"{reader.source}: {base} with {', '.join(values) or 'no'} changes")
    missing = [k for k, (attr, _) in fields.items() if attr not in values and k != "achievable_fraction"]
    if cls is GPUSpec:
        missing += [f"peak_flops.{d}" for d in ("fp32", "fp16") if f"{d}_flops" not in values]
        values = {"tf32_flops": None, "bf16_flops": None, "achievable_fraction": 0.7, **values}
    if missing:
        r.fail(missing[0], "missing (required without a preset)")
    return cls(name=name, **values, source=f"{reader.source} (inline)")


def parse(raw, source: str = "<cluster>", name: str = "cluster") -> Cluster:
    """A Cluster from the file's parsed contents (a dict), every mistake a SimparError naming its key."""
    top = _Reader(raw, "", source)
    nodes, per_node = top.integer("nodes", required=True), top.integer("gpus_per_node", required=True)
    gpu = _device(top, "gpu", devices.GPUS, GPUSpec, _GPU_FIELDS, required=True)
    host = _device(top, "host", devices.HOSTS, HostSpec, _HOST_FIELDS)
    nvme = _device(top, "nvme", devices.NVMES, NVMeSpec, _NVME_FIELDS)
    pcie = None
    if (r := top.section("pcie")) is not None:
        gen = r.integer("gen", 4, minimum=3)
        if gen not in PCIE_X16:
            r.fail("gen", f"must be one of {', '.join(map(str, PCIE_X16))}, got {gen}")
        pcie = Pcie(gen, r.integer("gpus_per_switch", 0, minimum=0), r.flag("p2p", True))
        r.done(("gen", "gpus_per_switch", "p2p"))
        if not pcie.p2p and pcie.gpus_per_switch:
            r.fail("p2p", "false is modelled for GPUs on the root complex (gpus_per_switch: 0), where "
                          "GPU-to-GPU traffic turns around in the CPU")
    for key, value in (("host", host), ("nvme", nvme)):
        if value is not None and pcie is None:
            top.fail(key, "needs a pcie section (it hangs off the CPU's root complex)")
    intra = IntraNode()
    if (r := top.section("intra_node")) is not None:
        fabric = r.choice("fabric", FABRICS, "pcie")
        nvlink = fabric in ("nvswitch", "nvlink-mesh", "nvlink-ring")
        intra = IntraNode(fabric, r.rate("bandwidth", required=fabric != "pcie") if fabric != "pcie" else 0.0,
                          r.seconds("latency", 0.5e-6), r.efficiency("efficiency", "nvlink3" if nvlink else 1.0),
                          r.flag("sharp", False))
        r.done(("fabric", "bandwidth", "latency", "efficiency", "sharp"))
        if intra.sharp and fabric != "nvswitch":
            r.fail("sharp", "in-switch reduction needs fabric: nvswitch")
    if intra.fabric == "pcie" and pcie is None and per_node > 1:
        top.fail("pcie", f"the {per_node} GPUs of a node need a path between them: give pcie or an intra_node fabric")
    nics = None
    if (r := top.section("nics")) is not None:
        kind = r.choice("kind", ("ib", "eth"), "ib")
        nics = Nics(r.integer("per_node", required=True), r.rate("bandwidth", required=True),
                    r.seconds("latency", 0.6e-6), r.choice("attach", NIC_ATTACH, "pcie-switch"), kind,
                    r.efficiency("efficiency", "ib-hdr" if kind == "ib" else 1.0))
        r.done(("per_node", "bandwidth", "latency", "attach", "kind", "efficiency"))
        if nics.attach == "gpu" and nics.per_node != per_node:
            r.fail("per_node", f"attach: gpu gives each GPU its own port: per_node must equal gpus_per_node "
                               f"({per_node}), got {nics.per_node}")
        if nics.attach != "gpu" and (nics.per_node > per_node or per_node % nics.per_node):
            r.fail("per_node", f"{nics.per_node} NICs cannot be shared evenly by the {per_node} GPUs of a node")
        if nics.attach != "gpu" and pcie is None:
            r.fail("attach", f"{nics.attach} needs a pcie section (a NIC is a PCIe device)")
        if nics.attach == "pcie-switch" and not pcie.gpus_per_switch:
            r.fail("attach", "pcie-switch needs pcie.gpus_per_switch > 0; with GPUs on the root complex use root")
    network = Network()
    if (r := top.section("network")) is not None:
        network = Network(r.choice("topology", NETWORKS, "fat-tree"), r.integer("nodes_per_leaf", 16),
                          r.number("oversubscription", 1.0), r.seconds("latency", 0.6e-6),
                          _device(r, "server", devices.HOSTS, HostSpec, _HOST_FIELDS))
        r.done(("topology", "nodes_per_leaf", "oversubscription", "latency", "server"))
        if not network.oversubscription >= 1:
            r.fail("oversubscription", f"must be >= 1 (downlink : uplink), got {network.oversubscription}")
    if (nodes > 1 or network.server is not None) and nics is None:
        top.fail("nics", f"{nodes} nodes need NICs to join them" if nodes > 1 else "a server needs NICs")
    nccl = top.flag("nccl", True)
    cluster_name = str(top.get("name", name))
    description = str(top.get("description", f"{nodes} node(s) x {per_node} {gpu.name} ({intra.fabric} inside)"))
    top.done(("name", "description", "nodes", "gpus_per_node", "gpu", "host", "nvme", "pcie", "intra_node",
              "nics", "network", "nccl"))
    return Cluster(cluster_name, nodes, per_node, gpu, description, host, nvme, pcie, intra, nics, network, nccl)


def is_cluster_file(name: str) -> bool:
    """Whether a --topology/--cluster value names a file rather than a preset."""
    return name.lower().endswith((".yaml", ".yml", ".json")) or os.sep in name


def load(path: str) -> Cluster:
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError as exc:
        raise SimparError(f"--cluster: cannot read {path!r}: {exc.strerror}") from None
    return _load(os.path.abspath(path), stamp)


@lru_cache(maxsize=16)
def _load(path: str, _stamp: int) -> Cluster:  # keyed by mtime: an edited file is read again
    import yaml  # JSON is YAML too

    with open(path) as handle:
        text = handle.read()
    try:
        raw = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SimparError(f"--cluster: {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise SimparError(f"--cluster: {path} is not YAML ({where}{getattr(exc, 'problem', exc)})") from None
    return parse(raw, os.path.basename(path), os.path.splitext(os.path.basename(path))[0])


def dump(raw: dict) -> str:
    """A cluster's dict as YAML, keys in the schema's order."""
    import yaml

    return yaml.safe_dump(raw, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)
