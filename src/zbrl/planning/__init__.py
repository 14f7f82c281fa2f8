"""The capacity planner (``zbrl plan``): predict a run's throughput and idle shares from a
measured run, by simulating the run's own admission rule and buffer (see docs/planning.md)."""

from zbrl.planning.rates import RatesError, RunRates, read_rates
from zbrl.planning.simulate import Prediction, Shape, simulate

__all__ = ["Prediction", "RatesError", "RunRates", "Shape", "read_rates", "simulate"]
