from __future__ import annotations

import os

# Tests never use the network: Hugging Face libraries read these when first imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def float64():
    """Run a test with float64 as the default dtype, restoring the previous default after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need a CUDA device (make test-gpu); without one they are skipped, saying so."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run make test-gpu on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
