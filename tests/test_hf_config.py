"""--model path/to/config.json: Hugging Face configs build the same ModelSpec as the presets."""

import json

import pytest

from simpar.cli import main
from simpar.errors import SimparError
from simpar.models import model, resolve_model
from simpar.models.hf import spec_from_config

GPT2 = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_inner": None, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257}


def llama(hidden, ffn, heads, kv, layers, vocab=32000, positions=4096, **extra):
    return {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": hidden,
            "intermediate_size": ffn, "max_position_embeddings": positions, "model_type": "llama",
            "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": kv,
            "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "vocab_size": vocab, **extra}


CONFIGS = {
    "gpt2": GPT2,
    "gpt2-xl": {**GPT2, "n_embd": 1600, "n_head": 25, "n_layer": 48},
    "llama2-7b": llama(4096, 11008, 32, 32, 32),
    "llama2-13b": llama(5120, 13824, 40, 40, 40),
    "llama2-70b": llama(8192, 28672, 64, 8, 80),
    "llama3-8b": llama(4096, 14336, 32, 8, 32, vocab=128256, positions=8192, rope_theta=500000.0),
}


@pytest.mark.parametrize("preset", sorted(CONFIGS))
def test_config_matches_preset(tmp_path, preset):
    path = tmp_path / preset / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS[preset]))
    spec = model(str(path))
    reference = model(preset)
    assert spec.name == preset  # named after its folder, as HF checkouts are
    assert spec.params == reference.params
    for field in ("layers", "hidden", "heads", "n_kv_heads", "ffn", "vocab", "seq", "activation", "norm",
                  "tied_embeddings", "positions", "bias"):
        assert getattr(spec, field) == getattr(reference, field), field


def test_ignored_keys_are_listed():
    _, notes = spec_from_config(GPT2, "gpt2/config.json")
    assert len(notes) == 1
    for key in ("attn_pdrop", "layer_norm_epsilon", "architectures"):
        assert key in notes[0]
    assert "n_embd" not in notes[0]


@pytest.mark.parametrize("config, message", [
    ({**GPT2, "n_layer": 0}, "'n_layer' must be a positive integer"),
    ({**GPT2, "n_embd": "big"}, "'n_embd' must be a positive integer"),
    ({"model_type": "bert", "hidden_size": 768}, "model_type 'bert'"),
    (llama(4096, 11008, 32, 32, 32, head_dim=64), "head_dim 64"),
    (llama(4096, 11008, 32, 32, 32, hidden_act="gelu"), "hidden_act 'gelu'"),
    (llama(4096, 11008, 32, 32, 32, attention_bias=True), "attention_bias and mlp_bias differ"),
    ({**GPT2, "n_head": 7}, "not divisible by heads"),
])
def test_bad_configs_name_the_key(config, message):
    with pytest.raises(SimparError, match=message):
        spec_from_config(config, "x/config.json")


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SimparError, match="cannot read"):
        resolve_model(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SimparError, match="not valid JSON"):
        resolve_model(str(bad))
    with pytest.raises(SimparError, match="unknown preset 'nope'"):
        resolve_model("nope")


def test_run_accepts_a_config(tmp_path, capsys):
    path = tmp_path / "llama2-7b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**CONFIGS["llama2-7b"], "use_cache": True}))
    assert main(["run", "--model", str(path), "--strategy", "zero3", "--gpus", "16", "--recompute", "full",
                 "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["params"] == model("llama2-7b").params
    assert any("use_cache" in note for note in out["inputs"])
