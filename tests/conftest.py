import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # small per-head matmuls: threads only fight on 2 cores
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "model_specs").glob("*.yaml"))


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(12345)
