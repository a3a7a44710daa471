"""Model shapes: ModelSpec and the presets."""

from simpar.models.presets import PRESETS, model, resolve_model
from simpar.models.spec import ModelSpec

__all__ = ["PRESETS", "ModelSpec", "model", "resolve_model"]
