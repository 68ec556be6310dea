"""initadvisor: signal propagation at initialisation for transformers.

    import initadvisor
    report = initadvisor.check("model.yaml")        # or a config.json, a dict, a PretrainedConfig
    report.verdict, report.layers[-1].rho, report.to_json()

The API (`initadvisor.api`) is imported on first use, so `import initadvisor` (and the CLI's start-up) stays
cheap. `initadvisor.torch.audit` reads a live PyTorch model.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_API = ("load", "check", "recommend", "verify", "diagram", "sweep", "CheckReport", "Recommendation", "VerifyReport",
        "Diagram", "SweepReport", "Layer", "RecipeResult", "Report", "Spec")
_ERRORS = ("InitAdvisorError", "SpecError", "InvalidSpecError", "UsageError", "MissingExtraError")
__all__ = ["__version__", *_API, *_ERRORS]

if TYPE_CHECKING:  # pragma: no cover
    from initadvisor.api import (CheckReport, Diagram, Layer, RecipeResult, Recommendation, Report, Spec,
                                 SweepReport, VerifyReport, check, diagram, load, recommend, sweep, verify)
    from initadvisor.errors import InitAdvisorError, InvalidSpecError, MissingExtraError, SpecError, UsageError


def __getattr__(name: str):
    if name in _API:
        from initadvisor import api

        return getattr(api, name)
    if name in _ERRORS:
        from initadvisor import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'initadvisor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
