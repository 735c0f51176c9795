"""The encoder bench's arithmetic and machine facts, against hand-computed values (nothing here times anything)."""

from __future__ import annotations

import pytest

from bench.encoder import (
    BASE,
    int8_kernel_class,
    isa_line,
    paired_ratios,
    parse_isa,
    quantile,
    ratio_summary,
    rotated,
    samples_per_s,
    spread,
    summarize,
    summary,
    table,
    worker_env,
)
from bench.gemm_peak import encoder_flops, roofline

# The first processor of two real /proc/cpuinfo files, trimmed: the AVX2 build machine of issue 22 and a Sapphire
# Rapids class VM (AVX-512, VNNI, AMX).
AVX2_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt avx \
f16c rdrand hypervisor bmi1 avx2 smep bmi2 erms
bugs\t\t: cpu_meltdown

processor\t: 1
flags\t\t: fpu avx512f avx512_vnni amx_tile amx_int8
"""
SPR_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse sse2 avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi \
avx512_vbmi2 gfni avx512_vnni avx512_bitalg avx512_fp16 amx_bf16 amx_tile amx_int8
"""
VNNI_CPUINFO = "flags\t: fpu avx2 fma avx512f avx512bw avx512_vnni\n"


# ---------------------------------------------------------------------------------------------- ISA


def test_parse_isa_reads_the_first_processor_only() -> None:
    isa = parse_isa(AVX2_CPUINFO)
    assert isa["avx2"] and isa["fma"]
    assert not any(isa[flag] for flag in ("avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8"))
    assert int8_kernel_class(isa).startswith("AVX2 u8s8")
    assert "reduce_range" in int8_kernel_class(isa)  # the saturation note for non-VNNI CPUs


def test_parse_isa_recognises_vnni_and_amx_and_whole_flag_names() -> None:
    isa = parse_isa(SPR_CPUINFO)
    assert all(isa[flag] for flag in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8"))
    assert int8_kernel_class(isa).startswith("AMX-INT8")
    vnni = parse_isa(VNNI_CPUINFO)
    assert vnni["avx512_vnni"] and not vnni["amx_tile"] and not vnni["avx_vnni"]
    assert int8_kernel_class(vnni) == "AVX-512 VNNI (vpdpbusd)"
    # a flag is a whole word: avx512_fp16 alone is not avx512f
    assert parse_isa("flags : avx512_fp16 avx2\n")["avx512f"] is False
    assert int8_kernel_class(parse_isa("flags : avx2 avx_vnni\n")).startswith("AVX-VNNI")


def test_parse_isa_without_a_flags_line_says_nothing_is_there() -> None:
    isa = parse_isa("processor : 0\nmodel name : something\n")
    assert not any(isa.values())
    assert int8_kernel_class(isa).startswith("no x86 SIMD")
    line = isa_line(parse_isa(VNNI_CPUINFO))
    assert line.startswith("ISA: avx2 fma avx512f avx512bw avx512_vnni (absent: avx_vnni avx512_bf16 amx_tile")
    assert line.endswith("int8 GEMM: AVX-512 VNNI (vpdpbusd)")


# ---------------------------------------------------------------------------------------------- arithmetic


def test_quantiles_and_spread_by_hand() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)  # 1 + 0.75 * (2 - 1)
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.75) == pytest.approx(3.25)
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0  # order does not matter
    assert quantile([5.0], 0.95) == 5.0
    assert spread([2.0, 1.0, 4.0, 3.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "q1": 1.75, "q3": 3.25, "n": 4}
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_throughput_and_per_round_ratios_by_hand() -> None:
    assert samples_per_s([0.5, 0.5], 8) == 16.0  # 16 samples in 1 s
    assert samples_per_s([0.25, 0.5, 0.25], 8) == 24.0
    assert paired_ratios([20.0, 30.0, 25.0], [10.0, 20.0, 25.0]) == [2.0, 1.5, 1.0]
    summary_ = ratio_summary([20.0, 30.0, 25.0], [10.0, 20.0, 25.0])
    assert summary_ == {"median": 1.5, "min": 1.0, "max": 2.0, "q1": 1.25, "q3": 1.75, "n": 3}
    # the median of the per-round ratios, not the ratio of the medians (25 / 20 = 1.25): rounds are paired
    assert summary_["median"] != 25.0 / 20.0
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        paired_ratios([1.0, 2.0], [1.0])


def test_rounds_rotate_the_engine_order() -> None:
    engines = ["a", "b", "c"]
    assert rotated(engines, 0) == ["a", "b", "c"]
    assert rotated(engines, 1) == ["b", "c", "a"]
    assert rotated(engines, 2) == ["c", "a", "b"]
    assert rotated(engines, 4) == ["b", "c", "a"]
    assert engines == ["a", "b", "c"]  # not changed in place


def test_workers_get_pinned_thread_pools() -> None:
    env = worker_env(3)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == ("3", "3", "3")
    assert env["TOKENIZERS_PARALLELISM"] == "false"


def _run(batch8_s, longest_s, cpu_s, padded_ms, real_ms):
    return {"batch8_s": batch8_s, "batch8_longest_s": longest_s, "batch8_cpu_s": cpu_s, "padded_ms": padded_ms,
            "real_ms": real_ms, "load_s": 1.0, "settings": {"threads": 2}}


def _measured() -> dict:
    # two rounds; PyTorch at 8 and 16 samples/s, ORT int8 at 16 and 24: per-round ratios 2.0 and 1.5
    return {
        "runs": {
            BASE: [_run([1.0], [0.1], [2.0], [100.0, 300.0], [10.0]),
                   _run([0.5], [0.1], [1.0], [200.0, 400.0], [20.0])],
            "ort_int8": [_run([0.5], [0.05], [1.0], [50.0, 70.0], [5.0]),
                         _run([1 / 3], [0.05], [0.5], [60.0, 80.0], [6.0])],
        },
        "accuracy": {BASE: {"logits": [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]},
                     "ort_int8": {"logits": [[1, 0, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0]]}},
        "gold": [0, 1, 2, 1],
    }


def test_summarize_by_hand() -> None:
    rows = {row["engine"]: row for row in summarize(_measured(), [BASE, "ort_int8"])}
    base, int8 = rows[BASE], rows["ort_int8"]
    assert base["samples_per_s"]["median"] == pytest.approx(12.0)  # rounds at 8 and 16
    assert int8["samples_per_s"]["median"] == pytest.approx(20.0)  # 16 and 24
    assert int8["ratio"]["median"] == pytest.approx(1.75) and int8["ratio"]["min"] == pytest.approx(1.5)
    assert int8["ratio"]["max"] == pytest.approx(2.0) and base["ratio"]["median"] == 1.0
    assert int8["longest_ratio"]["median"] == pytest.approx(2.0)  # 160 vs 80 samples/s in both rounds
    assert int8["cpu_ratio"]["median"] == pytest.approx(2.0)  # 8 vs 4, then 16 vs 8
    assert base["p50_ms"] == pytest.approx(250.0)  # pooled over rounds: 100, 200, 300, 400
    assert base["p95_ms"] == pytest.approx(385.0)  # 300 + 0.85 * 100
    assert int8["real_p50_ms"] == pytest.approx(5.5)
    assert base["accuracy"] == 0.75 and int8["accuracy"] == 0.5  # pair 3 flipped to a wrong label
    assert int8["agreement"] == 0.75
    assert int8["versus_torch"]["difference"] == pytest.approx(-0.25)


def test_summary_rows_and_table_render() -> None:
    measured = _measured()
    measured["runs"]["ort_fp32"] = measured["runs"][BASE]
    measured["accuracy"]["ort_fp32"] = measured["accuracy"][BASE]
    engines = [BASE, "ort_fp32", "ort_int8"]
    report = {"rows": summarize(measured, engines), "rounds": 2, "threads": 2, "date": "2026-12-04",
              "machine": {"cpu": "test CPU", "cores": 2, "load_average": (0.1, 0.2, 0.3),
                          "isa": parse_isa(AVX2_CPUINFO),
                          "amx_granted": False},
              "inputs": {"batch8": 1, "batch1": 2, "warmup": 20, "mean_real_len": 54.0, "test_pairs": 4},
              "int8_graph": {"method": "static_qdq", "format": "QDQ", "per_channel": True, "reduce_range": False,
                             "calibration": {"source": "builtin:nli[calibration]"}, "keep_fp32": ["pooler"],
                             "int8_kernels": {"MatMulIntegerToFloat": 12}}}
    rows = {r["name"].split()[0]: r for r in summary(report)}
    assert rows["ort_fp32"]["value"] == 1.0 and not rows["ort_fp32"]["ok"]
    assert rows["ort_int8"]["value"] == pytest.approx(1.75)
    assert not rows["ort_int8"]["ok"]  # under 2x, and 25 pt of accuracy lost
    text = table(report)
    assert "ISA: avx2 fma (absent:" in text and "int8 GEMM: AVX2 u8s8" in text
    assert "ort_int8 = the served graph: static_qdq (QDQ)" in text
    assert "1.75x   1.50-2.00 [1.62, 1.88]" in text


# ---------------------------------------------------------------------------------------------- roofline


def test_encoder_flops_of_minilm_l6_by_hand() -> None:
    flops = encoder_flops(layers=6, hidden=384, heads=12, intermediate=1536, seq=512)
    # linear: 6 layers x 512 tokens x (4 x 384^2 + 2 x 384 x 1536) MACs x 2
    assert flops["linear"] == 6 * 512 * (4 * 384 * 384 + 2 * 384 * 1536) * 2 == 10_871_635_968
    # attention core: 6 layers x (QK^T + PV) x 512^2 x 384 MACs x 2
    assert flops["attention"] == 6 * 2 * 512 * 512 * 384 * 2 == 2_415_919_104
    assert flops["total"] == pytest.approx(13.29e9, rel=1e-3)
    with pytest.raises(ValueError, match="split into"):
        encoder_flops(layers=1, hidden=10, heads=3, intermediate=40, seq=8)


def test_roofline_bound_by_hand() -> None:
    bound = roofline({"linear": 1e9, "attention": 0.5e9, "total": 1.5e9}, int8_gemm_ops=1e12, fp32_gemm_flops=2e11,
                     attention_flops_rate=1e11, non_gemm_s=0.1, torch_s=0.296, batch=8)
    assert bound["linear_int8_s"] == pytest.approx(0.008)  # 8 x 1e9 / 1e12
    assert bound["attention_fp32_s"] == pytest.approx(0.04)  # 8 x 0.5e9 / 1e11
    assert bound["floor_s"] == pytest.approx(0.148)
    assert bound["max_ratio"] == pytest.approx(2.0)
    assert bound["fp32_linear_s"] == pytest.approx(0.04)  # 8 x 1e9 / 2e11
