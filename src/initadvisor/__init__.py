"""initadvisor: signal propagation at initialisation for transformers."""

__version__ = "0.1.0"
