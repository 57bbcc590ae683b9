"""dtype="auto": the choice for each kind of machine (pure functions of flags and probe timings),
and the probe and its cache on this machine."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch

from quickdraft import hardware
from quickdraft.hardware import FormatTiming, Hardware, choose_config, cpu_formats


def machine(flags: str, aten: str, onednn_bf16: bool, int8: bool = True, **extra) -> Hardware:
    return Hardware(cpu="test cpu", flags=frozenset(flags.split()), cores=2, threads=2, aten_capability=aten,
                    onednn_bf16=onednn_bf16, int8_engine=int8, **extra)


AMX = machine("avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8", "AVX512", True)
ZEN4 = machine("avx2 fma avx512f avx512_bf16 avx512_vnni", "AVX512", True)
SKYLAKE = machine("avx2 fma avx512f", "AVX512", False)
ZEN1 = machine("avx2 fma", "AVX2", False)
AMX_AS_AVX2 = machine("avx2 fma avx512f avx512_bf16 amx_bf16", "AVX2", False,
                      restrictions=(("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ATEN_CPU_CAPABILITY", "avx2")))
GRAVITON3 = machine("asimd bf16 i8mm sve", "DEFAULT", True)


def timings(**steps: tuple[float, float]) -> dict[str, FormatTiming]:
    return {name.replace("_", "-"): FormatTiming(*pair) for name, pair in steps.items()}


@pytest.mark.parametrize("hw, level", [(AMX, "amx"), (ZEN4, "avx512-bf16"), (SKYLAKE, "avx512"), (ZEN1, "avx2"),
                                       (AMX_AS_AVX2, "avx2"), (GRAVITON3, "arm-bf16")])
def test_isa_level_follows_flags_and_restrictions(hw, level):
    assert hw.isa_level == level
    assert level in hw.describe()


def test_amx_restricted_below_amx_is_avx512_bf16():
    hw = machine("avx2 avx512f avx512_bf16 amx_bf16", "AVX512", True, restrictions=(("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16"),))
    assert hw.isa_level == "avx512-bf16"


def test_packing_is_timed_where_onednn_runs_the_dtype():
    assert cpu_formats(AMX) == ("float32", "bfloat16", "float32-packed", "bfloat16-packed")
    assert cpu_formats(ZEN1) == ("float32", "bfloat16", "float32-packed", "bfloat16-packed")  # widened
    assert cpu_formats(machine("asimd", "DEFAULT", False, onednn=False)) == ("float32", "bfloat16", "bfloat16-packed")


def test_without_a_probe_the_flags_guess():
    assert choose_config(ZEN4, "cpu").dtype == "bfloat16" and choose_config(ZEN4, "cpu").pack_weights
    assert choose_config(ZEN1, "cpu").dtype == "float32" and not choose_config(ZEN1, "cpu").pack_weights


def test_the_fastest_one_row_step_wins():
    # Zen 4 as measured: packing halves the step
    config = choose_config(ZEN4, "cpu", timings(float32=(0.30, 0.32), bfloat16=(0.24, 0.26), bfloat16_packed=(0.15, 0.16)))
    assert (config.dtype, config.pack_weights) == ("bfloat16", True)
    assert "bfloat16-packed 150.0/160.0/-" in config.reason


def test_among_equally_fast_steps_the_cheapest_verification_wins():
    # AVX2: bfloat16 a little faster at one row, but four times the cost at six rows
    config = choose_config(ZEN1, "cpu", timings(float32=(0.100, 0.110), bfloat16=(0.097, 0.430)))
    assert config.dtype == "float32"
    # ... but not when float32's step is clearly slower: decoding is one row at a time
    config = choose_config(ZEN1, "cpu", timings(float32=(0.150, 0.160), bfloat16=(0.100, 0.430)))
    assert config.dtype == "bfloat16" and not config.pack_weights


def test_packing_is_chosen_for_each_dtype_on_its_own():
    config = choose_config(AMX, "cpu", timings(float32=(0.08, 0.09), bfloat16=(0.12, 0.13), bfloat16_packed=(0.10, 0.11)))
    assert config.dtype == "float32" and not config.pack_weights and config.packed_dtypes == ("bfloat16",)
    assert config.packs(torch.bfloat16) and not config.packs(torch.float32)
    config = choose_config(AMX, "cpu", timings(float32=(0.20, 0.21), bfloat16=(0.10, 0.10), bfloat16_packed=(0.14, 0.11)))
    assert config.dtype == "bfloat16" and not config.pack_weights


def test_avx2_weighs_a_prompt_s_prefill_against_a_faster_one_row_step():
    # AVX2 as probed here (ms for 1/6/64 rows): bfloat16 steps a third faster than float32, but
    # fills a prompt four times slower; a 512-token prompt and 128 new tokens: float32 packed
    probe = {"float32": FormatTiming(0.0479, 0.0965, 0.060, 0.2374), "bfloat16": FormatTiming(0.0324, 0.1236, 0.090, 0.9419),
             "float32-packed": FormatTiming(0.0476, 0.0731, 0.065, 0.2202)}
    assert probe["bfloat16"].request_seconds() > 1.4 * probe["float32-packed"].request_seconds()
    config = choose_config(ZEN1, "cpu", probe)
    assert (config.dtype, config.pack_weights) == ("float32", True)
    assert "float32-packed 47.6/73.1/220.2" in config.reason
    # without the prefill the faster step alone would have won
    no_prefill = {name: FormatTiming(t.step, t.verify) for name, t in probe.items()}
    assert choose_config(ZEN1, "cpu", no_prefill).dtype == "bfloat16"


def test_avx2_takes_widened_bfloat16_where_it_fills_a_prompt_at_float32_s_speed():
    # An Intel Xeon restricted to AVX2 (ms for 1/6/2/64 rows): packed bfloat16 is widened there
    # (models.packing.WidenedLinear): stock bfloat16's one-row step, float32's 64-row forward
    probe = {"float32": FormatTiming(0.0340, 0.0720, 0.0652, 0.2054),
             "bfloat16": FormatTiming(0.0252, 0.0916, 0.0386, 0.8889),
             "float32-packed": FormatTiming(0.0378, 0.0588, 0.0513, 0.1877),
             "bfloat16-packed": FormatTiming(0.0256, 0.0811, 0.0372, 0.2100)}
    config = choose_config(ZEN1, "cpu", probe)
    assert (config.dtype, config.pack_weights, config.packed_dtypes) == ("bfloat16", True, ("bfloat16",))


def test_avx2_takes_packed_float32_for_its_cheaper_verification():
    # AVX2 as measured (docs/hardware.md): packing leaves the one-row step, and cuts six rows
    # from 2.1x a step to 1.45x
    config = choose_config(ZEN1, "cpu", timings(float32=(0.0422, 0.0880), bfloat16=(0.0441, 0.1190),
                                                float32_packed=(0.0437, 0.0633)))
    assert (config.dtype, config.pack_weights, config.packed_dtypes) == ("float32", True, ("float32",))
    assert config.to_dict()["pack_weights"] is True
    # ... but not where packing slows the one-row step that plain decoding runs
    config = choose_config(ZEN1, "cpu", timings(float32=(0.040, 0.088), bfloat16=(0.044, 0.119),
                                                float32_packed=(0.046, 0.050)))
    assert (config.dtype, config.pack_weights) == ("float32", False)


def test_the_draft_gets_int4_weights_where_the_kernel_runs_and_prompts_widen_to_native_bfloat16():
    with_kernel = machine("avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16", "AVX512", True, int4_kernel=True)
    config = choose_config(with_kernel, "cpu")
    assert (config.draft_quantization, config.draft_dtype) == ("int4", "float32")
    assert "draft int4 weights" in config.describe()
    assert choose_config(with_kernel, "cuda").draft_quantization == "none"
    # AVX2: the kernel runs, but a prompt's many rows would be float32 products: int8's integer ones are faster
    assert choose_config(machine("avx2 fma", "AVX2", False, int4_kernel=True), "cpu").draft_quantization == "int8"


def test_the_draft_gets_int8_weights_where_an_engine_runs_them():
    assert (choose_config(ZEN1, "cpu").draft_quantization, choose_config(ZEN1, "cpu").draft_dtype) == ("int8", "float32")
    no_engine = machine("asimd", "DEFAULT", False, int8=False)
    config = choose_config(no_engine, "cpu", timings(float32=(0.2, 0.2), bfloat16=(0.1, 0.1)))
    assert (config.draft_quantization, config.draft_dtype) == ("none", "bfloat16")


@pytest.mark.parametrize("bf16, dtype", [(True, "bfloat16"), (False, "float32")])
def test_a_gpu_takes_bfloat16_where_it_computes_in_it(bf16, dtype):
    hw = machine("avx2", "AVX2", False, gpu="test gpu", gpu_bf16=bf16)
    config = choose_config(hw, "cuda")
    assert (config.dtype, config.pack_weights, config.draft_quantization) == (dtype, False, "none")


def test_the_probe_times_every_format_and_its_result_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    hw = hardware.detect_hardware()
    probe = hardware.probe_formats(cpu_formats(hw), megabytes=8, rounds=1)
    assert set(probe) == set(cpu_formats(hw)) and all(t.step > 0 and t.verify > 0 and t.verify_one > 0 and t.prefill > 0
                                                      for t in probe.values())

    calls = []
    monkeypatch.setattr(hardware, "probe_formats", lambda formats: calls.append(formats) or probe)
    for busy in (1.5, 0.0):  # a contended probe is used but not cached; a quiet one is
        monkeypatch.setattr(hardware, "other_cpu", lambda busy=busy: _cores(busy))
        hardware.machine_config.cache_clear()
        try:
            first = hardware.machine_config("cpu")
            hardware.machine_config.cache_clear()
            second = hardware.machine_config("cpu")  # read back from the cache folder when cached
        finally:
            hardware.machine_config.cache_clear()
        assert first == second
    assert len(calls) == 3
    cached = json.loads(next((tmp_path / "machine").glob("*.json")).read_text())
    assert cached["hardware"]["cpu"] == hw.cpu and set(cached["probe"]) == set(probe)


@contextmanager
def _cores(busy: float):
    yield {"cores": busy}
