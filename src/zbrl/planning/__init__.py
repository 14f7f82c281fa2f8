"""The capacity planner (``zbrl plan``): predict a run's throughput and idle shares from a
measured run, by simulating the run's own admission rule and buffer (see docs/planning.md).

The names below are imported on first use, so that importing the package (``zbrl --help``, the
command line's parser) imports neither the simulation nor torch (docs/performance.md, Start-up).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from zbrl.lazy import lazy_attributes

if TYPE_CHECKING:
    from zbrl.planning.rates import RatesError, RunRates, read_rates
    from zbrl.planning.simulate import Prediction, Shape, simulate

__all__ = ["Prediction", "RatesError", "RunRates", "Shape", "read_rates", "simulate"]

_HOMES = {
    "RatesError": "rates",
    "RunRates": "rates",
    "read_rates": "rates",
    "Prediction": "simulate",
    "Shape": "simulate",
    "simulate": "simulate",
}
"""Where each public name lives."""


__getattr__ = lazy_attributes(__name__, _HOMES)


class _Package(types.ModuleType):
    """Loading the submodule ``zbrl.planning.simulate`` sets this package's attribute
    ``simulate``; the package keeps the function of that name there instead (as when it imported
    it eagerly), which :func:`__getattr__` provides."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
