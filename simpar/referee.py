"""How finely a ``simpar validate`` can judge a model: the noise of its own measurements, and what it allows.

A case's measured figure is the median of its runs, and its price comes from the calibrations taken among
them. On the development VM both are draws of a machine whose speed drifts over tens of seconds to minutes
(one-rank compute passes of 12 s, back to back, ranged 55-72 ms for the same work: docs/calibration.md),
so even a model without any error is judged off by the runs' noise, and priced off by the calibrations'.
This module reads both off a validate's own numbers and says what they allow:

- ``run_sd``: the spread of one run, the standard deviation of log step times within a case, pooled over
  the cases of a world size (degrees of freedom weighted);
- ``price_sd``: the same for the prices of one calibration (each case priced with each profile of the window);
- ``exact_chance``: the chance that a model pricing every case exactly is judged within the goal (every case
  within ``within``, the median within ``median_within``) with this many runs a case: the median of ``runs``
  normal draws of ``run_sd`` against no error at all;
- ``priced_chance``: the same for a model without bias priced with the mean of ``calibrations`` calibrations,
  each off by a normal draw of ``price_sd``;
- ``repeats_for``: the fewest runs a case (one calibration a round, as ``--calibrate-after rounds`` takes)
  whose ``priced_chance`` reaches ``CONFIDENT``, up to ``MAX_REPEATS``.

The cases are drawn independently (the calibrations' error is partly common to the cases; the figures are
a guide, not a proof), by a seeded Monte Carlo, so a report reads the same every time.
"""

from __future__ import annotations

import math

import numpy as np

GOAL = (0.10, 0.05)  # every case within 10 %, the median within 5 %: the 2-rank goal of issue 16
CONFIDENT = 0.9
MAX_REPEATS = 15
TRIALS = 20000


def pooled_sd(groups: list[list[float]]) -> float | None:
    """The standard deviation of log values within each group, pooled over the groups (each weighted by its
    degrees of freedom); None without a group of two values or more. Values must be positive (times)."""
    squares, freedom = 0.0, 0
    for group in groups:
        if len(group) < 2:
            continue
        logs = [math.log(v) for v in group]
        mean = sum(logs) / len(logs)
        squares += sum((x - mean) ** 2 for x in logs)
        freedom += len(logs) - 1
    return math.sqrt(squares / freedom) if freedom else None


def pass_chance(run_sd: float, runs: int, cases: int, price_sd: float = 0.0, calibrations: int = 1,
                within: float = GOAL[0], median_within: float = GOAL[1], trials: int = TRIALS, seed: int = 0) -> float:
    """The chance that ``cases`` cases, each measured as the median of ``runs`` runs (log-normal, ``run_sd``)
    and priced by the mean of ``calibrations`` calibrations (``price_sd`` each) of a model without error, are
    all judged within ``within`` with the median |error| within ``median_within``."""
    rng = np.random.default_rng(seed)
    measured = np.median(rng.normal(0.0, run_sd, (trials, cases, runs)), axis=2)
    priced = rng.normal(0.0, price_sd / math.sqrt(calibrations), (trials, cases)) if price_sd else 0.0
    errors = np.abs(np.exp(priced - measured) - 1.0)
    held = (errors.max(axis=1) <= within) & (np.median(errors, axis=1) <= median_within)
    return float(held.mean())


def resolution(runs: list[list[float]], prices: list[list[float]] | None = None) -> dict:
    """What one world size's cases allow: ``runs`` (each case's measured step times) and, where the window
    held two calibrations or more, ``prices`` (each case's price by each of them). {} with a run a case."""
    run_sd = pooled_sd(runs)
    if run_sd is None:
        return {}
    price_sd = pooled_sd(prices) if prices else None
    repeats, cases = min(len(r) for r in runs), len(runs)
    calibrations = min(len(p) for p in prices) if prices else 0
    out = {"run_sd": run_sd, "price_sd": price_sd, "runs": repeats, "calibrations": calibrations,
           "cases": cases, "exact_chance": pass_chance(run_sd, repeats, cases)}
    if price_sd is not None:
        out["priced_chance"] = pass_chance(run_sd, repeats, cases, price_sd, calibrations)
        out["repeats_for"] = next((r for r in range(1, MAX_REPEATS + 1)
                                   if pass_chance(run_sd, r, cases, price_sd, r) >= CONFIDENT), None)
    return out


def describe(world: int, r: dict) -> str:
    """One line for the report and the terminal."""
    goal = f"every case within {GOAL[0]:.0%}, the median within {GOAL[1]:.0%}"
    line = (f"{world} ranks: one run spreads by {100 * r['run_sd']:.1f} % (SD, pooled over {r['cases']} cases); a "
            f"model without error would be judged to meet '{goal}' with {r['runs']} runs a case in "
            f"{100 * r['exact_chance']:.0f} % of windows like this one")
    if r.get("price_sd") is not None:
        more = (f"{r['repeats_for']} runs a case, a calibration a round, would reach {CONFIDENT:.0%}"
                if r["repeats_for"] else f"no number of runs up to {MAX_REPEATS} reaches {CONFIDENT:.0%}")
        line += (f"; one calibration's price of a case spreads by {100 * r['price_sd']:.1f} % (SD), and priced "
                 f"with the mean of {r['calibrations']} calibrations such a model would meet it in "
                 f"{100 * r['priced_chance']:.0f} %; {more}")
    return line
