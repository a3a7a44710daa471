"""How finely a ``simpar validate`` can judge a model: the noise of its own measurements, and what it allows.

A case's measured figure is the median of its runs, and its price comes from the calibrations taken among
them. On the development VM both are draws of a machine whose speed drifts over tens of seconds to minutes
(one-rank compute passes of 12 s, back to back, ranged 55-72 ms for the same work),
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

``whole`` asks the same of the whole window against the goal of every world size at once (a
``validate --repeats 3`` over 2, 4 and 8 ranks): the median |error| over all the cases within 10 %, and
every case within 15 % or its own run-to-run spread, whichever is larger (the spread drawn with the runs).

The cases are drawn independently (the calibrations' error is partly common to the cases; the figures are
a guide, not a proof), by a seeded Monte Carlo, so a report reads the same every time.
"""

from __future__ import annotations

import math

import numpy as np

GOAL = (0.10, 0.05)  # every case within 10 %, the median within 5 %: the goal at 2 ranks
# every case within max(15 %, its spread), the median within 10 %: the goal over 2, 4 and 8 ranks
WHOLE_GOAL = (0.15, 0.10)
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


def _draw(rng, run_sd: float, runs: int, cases: int, price_sd: float, calibrations: int,
          trials: int) -> tuple[np.ndarray, np.ndarray]:
    """(|error|, run-to-run spread) of ``cases`` cases of a model without error, ``trials`` times: each case
    measured as the lower median of ``runs`` log-normal runs (as ``validate.lower_median`` picks one run) and
    priced by the mean of ``calibrations`` calibrations; the spread as validate's, (max - min) / median run."""
    logs = np.sort(rng.normal(0.0, run_sd, (trials, cases, runs)), axis=2)
    measured = logs[:, :, (runs - 1) // 2]
    priced = rng.normal(0.0, price_sd / math.sqrt(calibrations), (trials, cases)) if price_sd else 0.0
    spread = (np.exp(logs[:, :, -1]) - np.exp(logs[:, :, 0])) / np.exp(measured)
    return np.abs(np.exp(priced - measured) - 1.0), spread


def pass_chance(run_sd: float, runs: int, cases: int, price_sd: float = 0.0, calibrations: int = 1,
                within: float = GOAL[0], median_within: float = GOAL[1], trials: int = TRIALS, seed: int = 0) -> float:
    """The chance that ``cases`` cases, each measured as the (lower) median of ``runs`` runs (log-normal, ``run_sd``)
    and priced by the mean of ``calibrations`` calibrations (``price_sd`` each) of a model without error, are
    all judged within ``within`` with the median |error| within ``median_within``."""
    errors, _ = _draw(np.random.default_rng(seed), run_sd, runs, cases, price_sd, calibrations, trials)
    held = (errors.max(axis=1) <= within) & (np.median(errors, axis=1) <= median_within)
    return float(held.mean())


def whole_chance(worlds: list[dict], runs: int | None = None, priced: bool = True, trials: int = TRIALS,
                 seed: int = 0) -> float:
    """The chance that a model without error meets ``WHOLE_GOAL`` over the cases of ``worlds`` (``resolution``
    readings, one a world size): every case within max(15 %, its spread), the median over all within 10 %.
    ``runs`` a case (and as many calibrations) instead of each world's own; ``priced=False``: prices exact."""
    rng = np.random.default_rng(seed)
    errors, spreads = [], []
    for w in worlds:
        n = runs or w["runs"]
        price_sd = (w.get("price_sd") or 0.0) if priced else 0.0
        e, s = _draw(rng, w["run_sd"], n, w["cases"], price_sd, runs or w.get("calibrations") or 1, trials)
        errors.append(e)
        spreads.append(s)
    errors, spreads = np.concatenate(errors, axis=1), np.concatenate(spreads, axis=1)
    held = (errors <= np.maximum(WHOLE_GOAL[0], spreads)).all(axis=1) & (np.median(errors, axis=1) <= WHOLE_GOAL[1])
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


def whole(found: dict) -> dict:
    """What the window allows against ``WHOLE_GOAL``, from its ``resolution`` readings by world size ({} with
    fewer than two world sizes): the chance with prices exact, with the window's calibrations where every world
    size read their spread, and the runs a case that would reach ``CONFIDENT``."""
    worlds = list(found.values())
    if len(worlds) < 2:
        return {}
    out = {"worlds": sorted(int(w) for w in found), "cases": sum(w["cases"] for w in worlds),
           "runs": min(w["runs"] for w in worlds), "exact_chance": whole_chance(worlds, priced=False)}
    if all(w.get("price_sd") is not None for w in worlds):
        out["priced_chance"] = whole_chance(worlds)
        out["repeats_for"] = next((r for r in range(1, MAX_REPEATS + 1) if whole_chance(worlds, r) >= CONFIDENT), None)
    return out


def describe_whole(r: dict) -> str:
    """One line for the whole window against ``WHOLE_GOAL``."""
    goal = f"every case within {WHOLE_GOAL[0]:.0%} or its spread, the median within {WHOLE_GOAL[1]:.0%}"
    line = (f"all {r['cases']} cases ({', '.join(str(w) for w in r['worlds'])} ranks): a model without error would "
            f"be judged to meet '{goal}' with {r['runs']} runs a case in {100 * r['exact_chance']:.0f} % of windows "
            f"like this one")
    if "priced_chance" in r:
        more = (f"{r['repeats_for']} runs a case would reach {CONFIDENT:.0%}" if r["repeats_for"]
                else f"no number of runs up to {MAX_REPEATS} reaches {CONFIDENT:.0%}")
        line += f", priced with the window's calibrations in {100 * r['priced_chance']:.0f} %; {more}"
    return line


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



def window_noise(run_sd: float, runs: int, cases: int, trials: int = TRIALS, seed: int = 0) -> tuple[float, float]:
    """How far a window's median |error| and max |error| move by its runs' noise alone: their SDs over windows of
    ``cases`` cases, each the lower median of ``runs`` runs of ``run_sd``, priced by a model without any error. A
    change to the model that moves them by less cannot be told from the noise (``benchmarks/ablation.py``)."""
    errors, _ = _draw(np.random.default_rng(seed), run_sd, runs, cases, 0.0, 1, trials)
    return float(np.median(errors, axis=1).std()), float(errors.max(axis=1).std())
