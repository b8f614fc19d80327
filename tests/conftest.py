from __future__ import annotations

import os

# Tests never use the network: Hugging Face libraries read these when first imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# make test runs one pytest-xdist worker per core: each worker, and the relmt commands it starts, use one
# thread unless OMP_NUM_THREADS says otherwise (torch reads it when first imported).
PIN_THREADS = bool(os.environ.get("PYTEST_XDIST_WORKER")) and "OMP_NUM_THREADS" not in os.environ
if PIN_THREADS:
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if PIN_THREADS:
    torch.set_num_threads(1)  # in case a plugin imported torch before this file


@pytest.fixture
def float64():
    """Run a test with float64 as the default dtype, restoring the previous default after."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture(scope="module")
def cpu_for_auto():
    """device=auto means the CPU for a module's tests, in this process and in the commands they start (CUDA
    hidden), as on a machine without a GPU. For modules that pin float32 results reached along two paths
    (sampling's top-1 against greedy, the API's scores against score_references on the CPU, an ensemble of
    copies against its model): on CUDA auto means bf16 and kernels that vary with the batch, and those
    equivalences are tests/test_cuda.py's, at bf16 tolerances."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        mp.setattr(torch.cuda, "is_available", lambda: False)
        yield


def pytest_collection_modifyitems(config, items):
    """Tests marked `first` run before the others, in their own order: each compiles for minutes, and
    pytest-xdist's worksteal gives every worker a contiguous share of the collection, so they all land at the
    head of the first worker's share while the others take the rest (make test's wall time; at the end they left
    one worker compiling alone). Tests marked gpu need a CUDA device (make test-gpu); without one they are skipped,
    saying so."""
    items.sort(key=lambda item: "first" not in item.keywords)  # stable: the collection's order otherwise
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run make test-gpu on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
