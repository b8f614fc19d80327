"""A busy machine (issue 57): relmt-train warns when the cores its threads would use are already held,
since spinning OpenMP threads then train several times slower (docs/results/performance/busy_cpu.md)."""

from __future__ import annotations

import logging

import pytest
import torch

from relmt import runtime

CPU = torch.device("cpu")


@pytest.fixture
def two_threads_on_two_cores(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


def test_it_warns_when_others_hold_the_cores(two_threads_on_two_cores, caplog):
    with caplog.at_level(logging.WARNING):
        assert runtime.warn_if_busy(CPU, load=1.0)
    assert "the machine is busy (load average 1.0 on 2 cores)" in caplog.text
    assert "threads=1" in caplog.text


@pytest.mark.parametrize("load", [0.0, 0.4])
def test_a_quiet_machine_is_left_alone(two_threads_on_two_cores, load):
    assert not runtime.warn_if_busy(CPU, load=load)


def test_one_thread_a_gpu_or_a_passive_wait_never_warn(two_threads_on_two_cores, monkeypatch):
    assert not runtime.warn_if_busy(torch.device("cuda"), load=4.0)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert not runtime.warn_if_busy(CPU, load=4.0)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert not runtime.warn_if_busy(CPU, load=4.0)


@pytest.fixture
def restore_threads():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("busy,expected", [(0.1, 2), (0.9, 1), (1.6, 1), (None, 2)])
def test_threads_0_takes_the_cores_free_at_start(busy, expected, monkeypatch, restore_threads):
    """Issue 74 §2: threads=0 (every command's default) takes the cores other processes leave free, measured at
    start; an explicit count is taken as given, and OMP_NUM_THREADS in the environment is kept."""
    monkeypatch.setattr(runtime, "busy_cores", lambda window=0.25: busy)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert runtime.choose_threads(0, CPU) == expected
    assert runtime.choose_threads(3, CPU) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert runtime.choose_threads(0, CPU) == 2


def test_busy_cores_reads_the_machine():
    busy = runtime.busy_cores(0.05)
    assert busy is None or 0 <= busy <= (__import__("os").cpu_count() or 1)
