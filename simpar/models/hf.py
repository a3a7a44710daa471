"""A ModelSpec from a Hugging Face ``config.json`` (GPT-2- and LLaMA-style keys).

GPT-2 style (``model_type`` gpt2 or keys ``n_layer``/``n_embd``): LayerNorm, GELU, biases, learned
positions, tied head, ``n_inner`` defaulting to 4 x hidden. LLaMA style (``model_type`` llama,
mistral, qwen2... or keys ``num_hidden_layers``/``hidden_size``): RMSNorm, SwiGLU, rotary
positions, ``tie_word_embeddings`` (default false), ``attention_bias``/``mlp_bias`` (default false).
Mixture-of-Experts (``model_type`` mixtral or deepseek): ``num_local_experts`` / ``n_routed_experts``,
``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``, ``first_k_dense_replace``.
Keys simpar has no use for (dropout, token ids, rope scaling...) are listed as ignored, never dropped
silently; a key that changes the parameter count in a way simpar does not model is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from simpar.errors import SimparError
from simpar.models.spec import ModelSpec

GPT2_TYPES = ("gpt2",)
LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "internlm2", "yi", "mixtral", "deepseek")
# keys read for each style: HF name -> meaning; the rest is reported as ignored
_GPT2_KEYS = {"n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "n_positions", "n_ctx",
              "activation_function", "tie_word_embeddings", "model_type"}
_LLAMA_KEYS = {"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size", "max_position_embeddings", "hidden_act",
               "tie_word_embeddings", "attention_bias", "mlp_bias", "model_type", "head_dim"}
_MOE_KEYS = {"num_local_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
             "n_shared_experts", "first_k_dense_replace", "moe_layer_freq"}


def looks_like_config(name: str) -> bool:
    """--model names a file rather than a preset."""
    return name.strip().lower().endswith(".json") or Path(name).is_file()


def _need(config: dict, key: str, path: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SimparError(f"--model: {path}: '{key}' must be a positive integer, got {value!r}")
    return value


def _style(config: dict, path: str) -> str:
    kind = str(config.get("model_type", "")).lower()
    if kind in GPT2_TYPES or (not kind and "n_layer" in config):
        return "gpt2"
    if kind in LLAMA_TYPES or (not kind and "num_hidden_layers" in config):
        return "llama"
    raise SimparError(f"--model: {path}: model_type {kind or '(none)'!r} is not a GPT-2- or LLaMA-style "
                      f"config (supported: {', '.join(GPT2_TYPES + LLAMA_TYPES)})")


def spec_from_config(config: dict, path: str = "config.json", seq: int | None = None) -> tuple[ModelSpec, list[str]]:
    """(ModelSpec, notes): the notes name the keys that were ignored. ``seq`` overrides the
    sequence length (default: the config's maximum positions)."""
    if not isinstance(config, dict):
        raise SimparError(f"--model: {path}: a config must be a JSON object")
    name = Path(path).parent.name or Path(path).stem
    if _style(config, path) == "gpt2":
        hidden = _need(config, "n_embd", path)
        positions = _need(config, "n_positions", path) if "n_positions" in config else 1024
        act = str(config.get("activation_function", "gelu_new"))
        if not act.startswith("gelu"):
            raise SimparError(f"--model: {path}: activation_function {act!r}: only GELU GPT-2 models are modelled")
        ffn = 4 * hidden if config.get("n_inner") is None else _need(config, "n_inner", path)
        spec = ModelSpec(name, layers=_need(config, "n_layer", path), hidden=hidden,
                         heads=_need(config, "n_head", path), ffn=ffn, vocab=_need(config, "vocab_size", path),
                         seq=seq or positions, positions=positions, activation="gelu", norm="layernorm",
                         tied_embeddings=bool(config.get("tie_word_embeddings", True)), bias=True)
        known = _GPT2_KEYS
    else:
        heads = _need(config, "num_attention_heads", path)
        hidden = _need(config, "hidden_size", path)
        if config.get("head_dim") not in (None, hidden // heads):
            raise SimparError(f"--model: {path}: head_dim {config['head_dim']} != hidden_size / "
                              f"num_attention_heads ({hidden // heads}); simpar models head_dim = hidden / heads")
        if bool(config.get("attention_bias", False)) != bool(config.get("mlp_bias", False)):
            raise SimparError(f"--model: {path}: attention_bias and mlp_bias differ; simpar models biases on "
                              "every linear layer or on none")
        act = str(config.get("hidden_act", "silu"))
        if act not in ("silu", "swish"):
            raise SimparError(f"--model: {path}: hidden_act {act!r}: LLaMA-style models are modelled with "
                              "SwiGLU (silu)")
        spec = ModelSpec(name, layers=_need(config, "num_hidden_layers", path), hidden=hidden, heads=heads,
                         kv_heads=config.get("num_key_value_heads") or None,
                         ffn=_need(config, "intermediate_size", path), vocab=_need(config, "vocab_size", path),
                         seq=seq or _need(config, "max_position_embeddings", path), activation="swiglu",
                         norm="rmsnorm", tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                         positions=0, bias=bool(config.get("attention_bias", False)), **_moe(config, path))
        known = _LLAMA_KEYS | _MOE_KEYS
    ignored = sorted(set(config) - known)
    notes = [f"{path}: ignored keys (no effect on the simulation): {', '.join(ignored)}"] if ignored else []
    return spec, notes


def _moe(config: dict, path: str) -> dict:
    """ModelSpec's MoE fields from Mixtral's or DeepSeek-MoE's keys ({} for a dense model)."""
    experts = config.get("num_local_experts") or config.get("n_routed_experts")
    if not experts:
        return {}
    if config.get("moe_layer_freq", 1) != 1:
        raise SimparError(f"--model: {path}: moe_layer_freq {config['moe_layer_freq']}: simpar models every layer "
                          "after the dense ones as MoE")
    fields = {"experts": _need(config, "num_local_experts" if "num_local_experts" in config else "n_routed_experts",
                               path), "top_k": _need(config, "num_experts_per_tok", path)}
    if "moe_intermediate_size" in config:
        fields["expert_ffn"] = _need(config, "moe_intermediate_size", path)
    fields["shared_experts"] = int(config.get("n_shared_experts") or 0)
    fields["dense_layers"] = int(config.get("first_k_dense_replace") or 0)
    return fields


def load_config(path: str, seq: int | None = None) -> tuple[ModelSpec, list[str]]:
    try:
        with open(path) as handle:
            config = json.load(handle)
    except OSError as exc:
        raise SimparError(f"--model: cannot read {path!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SimparError(f"--model: {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    return spec_from_config(config, path, seq)
