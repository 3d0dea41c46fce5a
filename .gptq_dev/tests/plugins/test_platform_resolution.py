"""Platform resolution over real installs: one detecting plugin platform beats the CPU; two are an error
unless BRIGADE_PLATFORM picks one; detection has no side effects; the reason is recorded."""

from __future__ import annotations

from plugin_env import PluginVenv, record, run_script


def test_no_detecting_plugin_falls_back_to_cpu_with_the_reason(plugin_venv: PluginVenv):
    platform = plugin_venv.plugins_json()["platform"]
    assert platform["name"] == "cpu" and platform["distribution"] == "brigade"
    assert platform["reason"].startswith("no plugin platform detected its hardware (checked: ")
    for name in ("cuda", "rocm", "oot", "detect_a", "detect_b"):
        assert name in platform["reason"]


def test_one_detecting_plugin_platform_beats_cpu(plugin_venv: PluginVenv):
    listing = plugin_venv.plugins_json({"BRIGADE_OOT_DEVICE": "1"})
    platform = listing["platform"]
    assert platform["name"] == "oot" and platform["distribution"] == "brigade-oot-platform"
    assert platform["class"] == "brigade_oot_platform.platform.OotPlatform"
    assert "only plugin platform that detected" in platform["reason"]
    assert sorted(platform["detected"]) == ["cpu", "oot"]
    assert record(listing, "oot")["platforms"] == {"oot": "active"}
    assert record(listing, "builtin")["platforms"] == {"cpu": "detected"}


def test_two_detecting_plugin_platforms_are_an_error_naming_both(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_FIXTURE_DETECT": "1"})
    assert result.returncode == 1
    listing = result.json()
    assert listing["platform"] is None
    error = listing["platform_error"]
    assert "'detect_a' from plugin 'detect_a' (brigade-fixture-detect-a 0.1.0)" in error
    assert "'detect_b' from plugin 'detect_b' (brigade-fixture-detect-b 0.1.0)" in error
    assert "BRIGADE_PLATFORM=NAME" in error


def test_brigade_platform_picks_one_of_two_detecting_platforms(plugin_venv: PluginVenv):
    listing = plugin_venv.plugins_json({"BRIGADE_FIXTURE_DETECT": "1", "BRIGADE_PLATFORM": "detect_b"})
    assert listing["platform"]["name"] == "detect_b"
    assert listing["platform"]["reason"] == "forced by BRIGADE_PLATFORM=detect_b"
    assert record(listing, "detect_a")["platforms"] == {"detect_a": "not checked"}


def test_forcing_a_platform_that_does_not_detect_or_does_not_exist_is_an_error(plugin_venv: PluginVenv):
    result = plugin_venv.plugins({"BRIGADE_PLATFORM": "cuda"})
    assert result.returncode == 1
    assert "did not detect its hardware" in result.json()["platform_error"]
    result = plugin_venv.plugins({"BRIGADE_PLATFORM": "tpu"})
    error = result.json()["platform_error"]
    assert "no installed plugin registers platform 'tpu'" in error and "cuda" in error and "cpu" in error


def test_cuda_detection_creates_no_cuda_context(plugin_venv: PluginVenv):
    out = run_script(plugin_venv, """
import json, torch
from brigade_cuda.platform import detect_cuda, nvml_device_count
from brigade.plugins import current_platform
found = detect_cuda()
chosen = current_platform().name
print(json.dumps({"found": found is not None, "chosen": chosen, "nvml": nvml_device_count(),
                  "initialized": torch.cuda.is_initialized()}))
""")
    # This machine has a CPU build of torch and no NVIDIA driver; the point is the absence of side effects.
    assert out == {"found": False, "chosen": "cpu", "nvml": None, "initialized": False}


def test_rocm_detects_on_a_hip_build_of_torch(plugin_venv: PluginVenv):
    out = run_script(plugin_venv, """
import json, os, torch
torch.version.hip = "6.2.41133"  # simulate a HIP build: the detector reads only this attribute
from brigade.plugins import platform_choice
choice = platform_choice()
p = choice.platform_cls
os.environ["HIP_VISIBLE_DEVICES"] = "2,3"
print(json.dumps({"name": choice.name, "reason": choice.reason, "device_type": p.device_type,
                  "dist_backend": p.dist_backend, "physical": p.logical_to_physical(1),
                  "logical": p.physical_to_logical(2), "graphs": p.supports_cuda_graphs(),
                  "initialized": torch.cuda.is_initialized()}))
""")
    assert out["name"] == "rocm" and "only plugin platform" in out["reason"]
    assert (out["device_type"], out["dist_backend"]) == ("cuda", "nccl")
    assert (out["physical"], out["logical"], out["graphs"], out["initialized"]) == (3, 0, True, False)


def test_platform_config_choices_come_from_the_platform(plugin_venv: PluginVenv):
    out = run_script(plugin_venv, """
import json, os
import torch
from brigade.config import BrigadeConfig, ModelConfig
from brigade.plugins import current_platform, registries
from brigade_cuda.platform import CudaPlatform
config = BrigadeConfig(ModelConfig(model="m"))
p = current_platform()
p.check_and_update_config(config)
os.environ["CUDA_VISIBLE_DEVICES"] = ""
empty_is_unset = (CudaPlatform.logical_to_physical(3), CudaPlatform.visible_device_ids())
print(json.dumps({"platform": p.name, "worker": config.parallel_config.worker_cls,
                  "block_size": config.cache_config.block_size, "backend": config.attention_backend,
                  "backend_cls": registries.attention_backends.get(config.attention_backend).__name__,
                  "cuda": [CudaPlatform.device_type, CudaPlatform.dist_backend, str(CudaPlatform.default_dtype),
                           CudaPlatform.supports_cuda_graphs(), CudaPlatform.default_attention_backend,
                           CudaPlatform.worker_cls],
                  "empty_is_unset": list(empty_is_unset)}))
""", env={"BRIGADE_OOT_DEVICE": "1"})
    assert out["platform"] == "oot"
    assert out["worker"] == "brigade_oot_platform.worker.OotWorker"
    assert (out["block_size"], out["backend"], out["backend_cls"]) == (32, "oot", "OotAttentionBackend")
    assert out["cuda"] == ["cuda", "nccl", "torch.bfloat16", True, "triton", "brigade_cuda.worker.CudaWorker"]
    assert out["empty_is_unset"] == [3, None]
