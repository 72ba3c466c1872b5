import pytest

from feather_sparse.registry import Registry


def test_lookup_pass_through_and_errors() -> None:
    reg: Registry[int] = Registry("widget")
    reg.register("mobilenet_v1", 1)

    @reg.register("global-flops")
    def f() -> int:
        return 2

    assert reg.get("mobilenet_v1") == 1
    assert reg.get("MOBILENET-V1") == 1  # case and -/_ insensitive
    assert reg.get("global_flops") is f
    assert reg.get(5) == 5
    assert reg.names() == ["global-flops", "mobilenet_v1"]
    assert "Global_Flops" in reg and "nope" not in reg
    with pytest.raises(
        ValueError, match=r"unknown widget 'nope'; choose one of: global-flops, mobilenet_v1"
    ):
        reg.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("mobilenet-v1", 3)
