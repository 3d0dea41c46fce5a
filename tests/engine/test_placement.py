"""Placement of data-parallel engines: engine i's devices are [i*tp*pp, (i+1)*tp*pp) of the visible ones, set through
the platform's device control variable; on the host each engine gets its share of the cores; too few devices is one
ConfigError line."""

from __future__ import annotations

import os
from typing import ClassVar

import pytest

from brigade.config import BrigadeConfig, ConfigError, ModelConfig, ParallelConfig
from brigade.engine.placement import check_device_count, engine_environment, plan_placements
from brigade.platforms.cpu import CpuPlatform
from brigade.platforms.interface import Platform


class FourDevices(Platform):
    """A device platform whose host has four devices (none is touched)."""

    name: ClassVar[str] = "fake"
    device_type: ClassVar[str] = "fake"
    device_control_env_var: ClassVar[str | None] = "FAKE_VISIBLE_DEVICES"

    @classmethod
    def physical_device_count(cls) -> int | None:
        return 4


def config(dp: int, tp: int = 1, pp: int = 1, rank: int | None = None) -> BrigadeConfig:
    return BrigadeConfig(ModelConfig(model="unused"),
                         parallel_config=ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                                        data_parallel_size=dp, data_parallel_rank=rank))


def test_each_engine_gets_its_own_slice_of_the_visible_devices(monkeypatch):
    monkeypatch.delenv("FAKE_VISIBLE_DEVICES", raising=False)
    placements = plan_placements(config(dp=2, tp=2), FourDevices)
    assert [p.env for p in placements] == [{"FAKE_VISIBLE_DEVICES": "0,1"}, {"FAKE_VISIBLE_DEVICES": "2,3"}]
    monkeypatch.setenv("FAKE_VISIBLE_DEVICES", "7,5,3,1")  # the operator's own list is what gets sliced
    placements = plan_placements(config(dp=4), FourDevices)
    assert [p.env["FAKE_VISIBLE_DEVICES"] for p in placements] == ["7", "5", "3", "1"]
    assert placements[2].index == 2 and "fake devices 3" in placements[2].description
    assert plan_placements(config(dp=1, tp=2), FourDevices)[0].env == {}  # one engine sees what the front end sees


def test_engines_on_the_host_share_the_cores():
    placements = plan_placements(config(dp=2), CpuPlatform, environ={})
    cores = len(os.sched_getaffinity(0))
    assert [p.env for p in placements] == [{"OMP_NUM_THREADS": str(max(1, cores // 2))}] * 2
    assert all(p.env == {} for p in plan_placements(config(dp=2), CpuPlatform, environ={"OMP_NUM_THREADS": "3"}))


def test_too_few_devices_is_one_line(monkeypatch):
    monkeypatch.delenv("FAKE_VISIBLE_DEVICES", raising=False)
    check_device_count(config(dp=2, tp=2), FourDevices)
    with pytest.raises(ConfigError) as info:
        check_device_count(config(dp=3, tp=2), FourDevices)
    assert str(info.value) == ("-dp 3 x -tp 2 x -pp 1 needs 6 fake devices but 4 are visible (the host); lower the "
                               "sizes so that their product is at most 4")
    monkeypatch.setenv("FAKE_VISIBLE_DEVICES", "0,1")  # inside engine 1 of -dp 2 -tp 2: its own two devices
    check_device_count(config(dp=2, tp=2, rank=1), FourDevices)
    with pytest.raises(ConfigError, match=r"needs 4 fake devices but 2 are visible \(FAKE_VISIBLE_DEVICES=0,1\)"):
        check_device_count(config(dp=2, tp=2), FourDevices)
    check_device_count(config(dp=64), CpuPlatform)  # the host has no device limit


def test_engine_environment_is_restored(monkeypatch):
    monkeypatch.setenv("FAKE_A", "before")
    monkeypatch.delenv("FAKE_B", raising=False)
    with engine_environment({"FAKE_A": "x", "FAKE_B": "y"}):
        assert os.environ["FAKE_A"] == "x" and os.environ["FAKE_B"] == "y"
    assert os.environ["FAKE_A"] == "before" and "FAKE_B" not in os.environ
