"""One builder per strategy: ``build(scenario) -> Plan``. ``--strategy NAME`` maps to exactly one."""

from __future__ import annotations

from collections.abc import Callable

from simpar.plan import Plan
from simpar.scenario import STRATEGY_NAMES, Scenario
from simpar.strategies import ddp, dp, megatron, offload, zero, zero3

BUILDERS: dict[str, Callable[[Scenario], Plan]] = {
    "dp": dp.build,
    "ddp": ddp.build,
    "zero1": zero.build,
    "zero2": zero.build,
    "zero3": zero3.build,
    "hsdp": zero3.build,
    "zero2-offload": offload.build_zero2,
    "zero3-offload": offload.build_zero3,
    "zero3-infinity": offload.build_infinity,
    "pp": megatron.build,
    "tp": megatron.build,
    "3d": megatron.build,
}
assert set(BUILDERS) == set(STRATEGY_NAMES)


def build_plan(scenario: Scenario) -> Plan:
    return BUILDERS[scenario.strategy.name](scenario)
