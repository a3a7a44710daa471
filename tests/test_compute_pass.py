"""The one-rank compute pass (``compute_bench.compute_worker``): every model and batch timed, in visits taken
in turns, each row with the FLOPs the simulator prices its unit at."""

from simpar.calibrate.compute_bench import TIMED_PER_VISIT, compute_worker
from simpar.models import model
from simpar.real.launch import launch


def test_the_compute_pass_visits_every_model_and_batch_in_turns():
    """Every model and batch timed at least ``repeats`` steps, in visits of ``TIMED_PER_VISIT``."""
    rows = launch(compute_worker, 1, (["tiny"], [1, 2], "fp32", 3), timeout=120)[0]
    assert [(r["batch"], r["unit"]) for r in rows] == [(b, u) for b in (1, 2) for u in ("embedding", "layer", "head")]
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 and r["step_s"] > 0 and r["reduce_s"] > 0 for r in rows)
    assert TIMED_PER_VISIT == 2 and all(r["timed_steps"] == 4 for r in rows)  # two visits of two for 3
    spec = model("tiny")
    assert all(r["params"] == spec.params for r in rows)
    layers = [r for r in rows if r["unit"] == "layer"]
    assert layers[1]["fwd_flops"] == 2 * layers[0]["fwd_flops"]  # twice the batch, twice the FLOPs
    assert [r["scores"] for r in layers] == [spec.attention_scores(1), spec.attention_scores(2)]
