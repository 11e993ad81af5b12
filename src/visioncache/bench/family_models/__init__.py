"""Random-weight models of every described family, with offline processors (bench and tests)."""

from visioncache.bench.family_models.builders import FAMILY_MODELS, build_family_model
from visioncache.bench.family_models.spec import FamilyModel

__all__ = ["FAMILY_MODELS", "FamilyModel", "build_family_model"]
