import dataclasses

import pytest

from simpar import SimparError, devices

REQUIRED_GPUS = ["v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "rtx-3090", "rtx-4090"]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpu_presets_have_sane_numbers(name):
    gpu = devices.gpu(name)
    assert gpu.fp32_flops > 1e12 and gpu.fp16_flops > gpu.fp32_flops
    assert 0 < gpu.achievable_fraction <= 1
    assert gpu.memory_bytes >= 16 * 2**30 and gpu.memory_bandwidth > 500e9
    assert gpu.flops("fp16") == pytest.approx(gpu.fp16_flops * gpu.achievable_fraction)


def test_datasheet_relations_between_skus():
    a40, a80, h100, h200 = (devices.gpu(n) for n in ["a100-40gb", "a100-80gb", "h100-sxm", "h200"])
    assert a40.bf16_flops == a80.bf16_flops == 312e12
    assert a80.memory_bytes == 2 * a40.memory_bytes
    assert h200.bf16_flops == h100.bf16_flops and h200.memory_bytes > h100.memory_bytes
    assert h200.memory_bandwidth > h100.memory_bandwidth > a80.memory_bandwidth


def test_presets_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        devices.gpu("a100-80gb").memory_bytes = 1


def test_missing_dtype_support_is_a_clear_error():
    with pytest.raises(SimparError, match="v100-32gb has no bf16"):
        devices.gpu("v100-32gb").flops("bf16")
    with pytest.raises(SimparError, match="a100-80gb has no fp8"):
        devices.gpu("a100-80gb").flops("fp8")
    with pytest.raises(SimparError, match="unknown 'fp4'"):
        devices.gpu("b200").flops("fp4")


def test_unknown_preset_names_the_field_and_the_choices():
    with pytest.raises(SimparError, match=r"--device: unknown preset 'b300'.*a100-80gb"):
        devices.gpu("b300")


def test_host_and_nvme_presets():
    assert devices.HOSTS and devices.NVMES
    for host in devices.HOSTS.values():
        assert host.cores > 0 and host.memory_bytes > 0 and host.adam_params_per_s > 0
    for drive in devices.NVMES.values():
        assert drive.read_bandwidth >= drive.write_bandwidth > 0
