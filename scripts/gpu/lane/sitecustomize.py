"""The device lane for a whole process: with RELMT_LANE=1 and this folder on PYTHONPATH (beside the repository's
root), every Python process starts inside tests/fake_cuda.py's `fake_cuda()`, so a script run with `--device cuda`
on a CPU-only machine takes relmt's CUDA paths on "CUDA" tensors. scripts/gpu/rehearse.sh runs the GPU call so,
end to end (issue 73 §1): a script error is found here, not on a lent GPU's clock. Without RELMT_LANE=1 it does
nothing.

Out of the lane's reach (its docstring): torch.compile and FlexAttention, CUDA's kernels and memory limits; a
phase that needs them fails its cases under the lane, and the rehearsal checks that such a failure is written
down and costs no other case its result."""

import os

if os.environ.get("RELMT_LANE") == "1":
    import torch.profiler

    from tests.fake_cuda import fake_cuda

    _LANE = fake_cuda()
    _LANE.__enter__()  # for the whole process: never left

    # torch's profiler asked for CUDA's activity on a CPU build records nothing and warns at every op (150 MB of
    # log in one phase): the lane's profiles are of the CPU alone, through the same calls
    _profile_init = torch.profiler.profile.__init__

    def _cpu_profile(self, *args, activities=None, **kwargs):
        cpu = torch.profiler.ProfilerActivity.CPU
        _profile_init(self, *args, activities=[a for a in activities or [cpu] if a == cpu] or [cpu], **kwargs)

    torch.profiler.profile.__init__ = _cpu_profile
