"""Model presets from the published configs (Hugging Face config.json of each model).

``tiny``, ``small`` and ``tiny-deep`` are meant for real runs on CPU with gloo (16 ranks on 2 cores).
"""

from __future__ import annotations

from simpar.errors import SimparError
from simpar.models.hf import load_config, looks_like_config
from simpar.models.spec import ModelSpec

_GPT2 = dict(vocab=50257, activation="gelu", norm="layernorm", tied_embeddings=True, bias=True)
_LLAMA2 = dict(vocab=32000, seq=4096, activation="swiglu", norm="rmsnorm", tied_embeddings=False, bias=False)

PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("tiny", layers=2, hidden=64, heads=4, ffn=256, vocab=256, seq=32, positions=32),
        ModelSpec("small", layers=4, hidden=128, heads=4, ffn=512, vocab=1024, seq=64, positions=64),
        # splits 8 ways every way (pipeline stages, heads, ffn, vocabulary) and keeps its head untied,
        # so every strategy runs for real on 2-8 CPU ranks (simpar validate)
        ModelSpec("tiny-deep", layers=8, hidden=64, heads=8, ffn=256, vocab=256, seq=32, positions=32,
                  tied_embeddings=False),
        ModelSpec("gpt2", layers=12, hidden=768, heads=12, ffn=3072, seq=1024, positions=1024, **_GPT2),
        ModelSpec("gpt2-medium", layers=24, hidden=1024, heads=16, ffn=4096, seq=1024, positions=1024, **_GPT2),
        ModelSpec("gpt2-large", layers=36, hidden=1280, heads=20, ffn=5120, seq=1024, positions=1024, **_GPT2),
        ModelSpec("gpt2-xl", layers=48, hidden=1600, heads=25, ffn=6400, seq=1024, positions=1024, **_GPT2),
        ModelSpec("gpt3-175b", layers=96, hidden=12288, heads=96, ffn=49152, seq=2048, positions=2048, **_GPT2),
        # Narayanan et al. 2021 Table 1's largest row (1,008 B parameters, 3,072 A100s)
        ModelSpec("megatron-1t", layers=128, hidden=25600, heads=160, ffn=102400, seq=2048, positions=2048,
                  **{**_GPT2, "vocab": 51200}),
        ModelSpec("llama2-7b", layers=32, hidden=4096, heads=32, ffn=11008, **_LLAMA2),
        ModelSpec("llama2-13b", layers=40, hidden=5120, heads=40, ffn=13824, **_LLAMA2),
        ModelSpec("llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, **_LLAMA2),
        # Mixtral-8x7B (Jiang et al. 2024): 46.7 B parameters, 12.9 B active per token; routes without dropping
        ModelSpec("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, experts=8, top_k=2,
                  **_LLAMA2),
        # DeepSeek-MoE 16B (Dai et al. 2024): 16.4 B parameters, 2.8 B active; 64 fine-grained experts of 1408
        # (6 routed a token) and 2 shared, the first layer dense
        ModelSpec("deepseek-moe-16b", layers=28, hidden=2048, heads=16, ffn=10944, experts=64, top_k=6,
                  expert_ffn=1408, shared_experts=2, dense_layers=1, **{**_LLAMA2, "vocab": 102400}),
        # an MoE small enough for real runs: 4 experts (ep 2 or 4), capacity-bound routing, untied head
        ModelSpec("tiny-moe", layers=2, hidden=64, heads=4, ffn=128, vocab=256, seq=32, positions=32,
                  tied_embeddings=False, experts=4, top_k=2, capacity_factor=1.5),
        ModelSpec("llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
                  **{**_LLAMA2, "vocab": 128256, "seq": 8192}),
    ]
}


def model(name: str) -> ModelSpec:
    """A preset by name, or the model a Hugging Face config.json describes (see models/hf.py)."""
    return resolve_model(name)[0]


def resolve_model(name: str) -> tuple[ModelSpec, list[str]]:
    """(ModelSpec, notes): notes list what a config file held that simpar ignored."""
    key = name.strip().lower()
    if key in PRESETS:
        return PRESETS[key], []
    if looks_like_config(name):
        return load_config(name.strip())
    raise SimparError(f"--model: unknown preset {name!r}; choose from {', '.join(PRESETS)} or give a "
                      "Hugging Face config.json")
