"""The CPU profile's terms and their ablation: a term taken out is the simulator's default (no such cost), and
the recorded runs of ``validation/cpu-runs.json`` price again, bytes and memory exact, with any profile."""

from dataclasses import fields
from pathlib import Path

import pytest

from simpar.calibrate.ablate import TERMS, without
from simpar.calibrate.average import average_profiles
from simpar.calibrate.profile import HardwareProfile
from simpar.validate import load_runs, reprice, summary

RUNS = Path(__file__).resolve().parents[1] / "validation" / "cpu-runs.json"


def _recorded():
    saved = load_runs(str(RUNS))
    profiles = [HardwareProfile.from_dict(p) for p in saved["profiles"]]
    return saved, average_profiles(profiles, [""] * len(profiles), common=True)


def test_the_terms_are_fields_of_the_profile_and_at_most_twelve():
    names = {f.name for f in fields(HardwareProfile)}
    assert set(TERMS) <= names and len(TERMS) <= 12


def test_a_term_taken_out_prices_as_a_profile_without_it():
    saved, profile = _recorded()
    assert profile.wake and profile.late_recv
    bare = without(profile, ["wake", "late_recv"])
    assert bare.wake == {} and bare.late_recv == {} and bare.ring == profile.ring  # the rest as calibrated
    topology = bare.topology(2, "fp32")
    assert topology.wake_latency == 0.0 and topology.late_recv_by_ranks is None
    assert profile.topology(2, "fp32").wake_latency > 0


@pytest.mark.slow
def test_the_recorded_runs_price_again_with_every_term_and_with_one_out():
    """21 cases (7 strategies x 2, 4, 8 ranks), three runs each: bytes and memory exact whatever the profile
    (they follow from the Plan), and each term's removal changes what the cases read."""
    saved, profile = _recorded()
    cases = reprice(saved, profile)
    assert len(cases) == 21 and {c["gpus"] for c in cases} == {2, 4, 8}
    judged = summary(cases)
    assert judged["bytes_exact"] and judged["memory_exact"]
    assert judged["max_abs_error"] == max(abs(c["error"]) for c in cases)
    bare = summary(reprice(saved, without(profile, ["resume"])))
    assert bare["bytes_exact"] and bare["median_abs_error"] != judged["median_abs_error"]
