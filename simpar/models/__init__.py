"""Model shapes: ModelSpec and the presets."""

from simpar.models.presets import PRESETS, model
from simpar.models.spec import ModelSpec

__all__ = ["PRESETS", "ModelSpec", "model"]
