"""`shiplift fleet pack` (tasks/pipeline/fleet/pack.py, issue 49 items 2 and 4): the packer is exact, checked against a
brute force written here (every assignment of every model to every profile of every instance type, each per-GPU
layout checked by `mig_profiles.layout_problem`'s placement over start slots, each model's update counted in turn
beside the others' most copies) on 240 seeded random portfolios and on the worked example; its refusals carry their
arithmetic; a copy's memory comes from its last build or is an estimate, marked so; the CLI prints, writes and
refuses without a traceback, and `fleet plan` validates what it wrote."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
import yaml

from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.backends.mig_profiles import (
    A100_40GB,
    H100_80GB,
    RTX_PRO_4500,
    RTX_PRO_6000,
    layout_problem,
    valid_layouts,
)
from shiplift.tasks.backends.pricing import load_price_table
from shiplift.tasks.cli.main import main
from shiplift.tasks.console import EXIT_BAD_INPUT
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.hashing import sha256_file
from shiplift.tasks.ledger.records import is_fleet_move, promotion
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.fleet.move import move_fleet
from shiplift.tasks.pipeline.fleet.pack import (
    Need,
    Offer,
    load_sizes,
    need_of,
    offers_of,
    pack,
    pack_fleet,
    reasons,
    write_placements,
)
from shiplift.tasks.pipeline.fleet.plan import plan_fleet
from shiplift.tasks.pipeline.fleet.snapshot import load_fleet_configs
from shiplift.tasks.pipeline.release import run_release

ROOT = Path(__file__).resolve().parents[2]
PORTFOLIO = ROOT / "configs" / "fleets" / "h100-portfolio"
MODELS = sorted(PORTFOLIO.glob("*.yaml"))
SIZES = PORTFOLIO / "sizes" / "estimates.yaml"
EIGHT_B = PORTFOLIO / "8b-fp16" / "llama31-8b-fp16.yaml"


def offer(instance_type: str, gpus: int, usd: float, gpu) -> Offer:
    return Offer(instance_type, gpus, usd, gpu, frozenset(valid_layouts(instance_type)))


def brute_force(needs: list[Need], offers: list[Offer]):
    """The least (price, type, slices, memory, partitions, layout) over every assignment, and the first assignment (in
    model-name order, each model's profiles smallest first) reaching it; None where nothing fits."""
    models = sorted(needs, key=lambda n: n.model)
    best = None
    for each in offers:
        holding = [[p for p in each.gpu.profiles if n.memory_mb <= p.memory_gb * 1024] for n in models]
        for choice in itertools.product(*holding):
            partitions = {}
            for profile in set(choice):
                mine = [n for n, p in zip(models, choice, strict=True) if p == profile]
                while_updating = [sum(o.most for o in mine if o is not n) + n.peak for n in mine]
                partitions[profile] = max([sum(n.copies for n in mine), *while_updating])
            per_gpu = sorted(p.name for p, total in partitions.items() for _ in range(-(-total // each.gpus)))
            if layout_problem(each.instance_type, per_gpu):
                continue
            used = [each.gpu.profile(name) for name in per_gpu]
            key = (each.usd_per_hour, each.instance_type, sum(p.slices for p in used), sum(p.memory_gb for p in used),
                   len(per_gpu), tuple(per_gpu))
            if best is None or key < best[0]:
                best = (key, {n.model: p.name for n, p in zip(models, choice, strict=True)})
    return best


def random_need(rng: random.Random, name: str) -> Need:
    memory = rng.choice([rng.randint(500, 9000), rng.randint(9000, 20000), rng.randint(20000, 41000),
                         rng.randint(500, 4000)])
    copies = rng.randint(1, 3)
    most = copies + rng.choice([0, 0, 1, 2])
    extra = rng.randint(1, most)  # all at once: every copy again; a rolling update or its rollback: a batch
    return Need(name, memory, "estimate", "drawn", copies, most, most + extra, "drawn")


@pytest.mark.parametrize("seed", range(240))
def test_the_packer_is_exact_against_brute_force_on_random_portfolios(seed):
    rng = random.Random(seed)
    offers = [offer("ml.p5.4xlarge", 1, round(rng.uniform(5, 12), 2), H100_80GB),
              offer("ml.p5.48xlarge", 8, round(rng.uniform(40, 120), 2), H100_80GB),
              offer("ml.p4d.24xlarge", 8, round(rng.uniform(20, 60), 2), A100_40GB),
              offer("ml.g7e.2xlarge", 1, round(rng.uniform(2, 12), 2), RTX_PRO_6000),
              offer("ml.g7.2xlarge", 1, round(rng.uniform(1, 6), 2), RTX_PRO_4500)]
    needs = [random_need(rng, f"m{i}") for i in range(rng.choice([1, 2, 2, 3, 3, 4, 4, 5]))]
    expected = brute_force(needs, offers)
    if expected is None:
        with pytest.raises(ConfigError, match="no MIG layout holds the portfolio|more than the largest MIG profile"):
            pack(needs, offers)
        return
    found = pack(needs, offers)
    assert (found.key, found.profile_of) == expected


def test_six_models_on_one_h100_and_seven_on_an_eight_gpu_instance_agree_with_brute_force():
    """Where the per-GPU limit binds: six one-copy models beside each other on one H100 (7 partitions at most), and
    seven large ones (each on a 40 GB profile or larger) on the eight H100s of an ml.p5.48xlarge, whose layout is carved
    on every GPU."""
    rng = random.Random(7)
    small = [Need(f"s{i}", rng.randint(1000, 11000), "estimate", "drawn", 1, 1, 2, "drawn") for i in range(6)]
    h100 = [offer("ml.p5.4xlarge", 1, 7.912, H100_80GB)]
    found = pack(small, h100)
    assert (found.key, found.profile_of) == brute_force(small, h100)
    large = [Need(f"l{i}", rng.randint(21000, 40000), "estimate", "drawn", 1, 1, 2, "drawn") for i in range(7)]
    eight = [offer("ml.p5.48xlarge", 8, 113.0, H100_80GB)]
    found = pack(large, eight)
    assert (found.key, found.profile_of) == brute_force(large, eight)


def test_a_model_larger_than_the_largest_profile_is_refused_with_the_arithmetic():
    needs = [Need("big", 90000, "estimate", "estimate: 88 GB weights", 1, 1, 2, "all at once")]
    with pytest.raises(ConfigError) as refused:
        pack(needs, [offer("ml.p5.4xlarge", 1, 7.912, H100_80GB)])
    assert refused.value.problem == ("big needs 90000 MB a copy (estimate: 88 GB weights), more than the largest MIG "
                                     "profile of any priced MIG instance type holds: mig-7g.80gb, 80 GB = 81920 MB "
                                     "(8080 MB short)")
    assert "artifact.quantization" in refused.value.fix


def test_a_portfolio_no_layout_holds_is_refused_with_the_arithmetic():
    """Three models of 3 copies each, updated all at once: 3 + 3 + 3 at their most and the smallest update's 3 more
    = 12 one-slice partitions at least, but an H100 has 7 compute slices."""
    needs = [Need(name, 4000, "estimate", "drawn", 3, 3, 6, "all at once") for name in ("a", "b", "c")]
    with pytest.raises(ConfigError) as refused:
        pack(needs, [offer("ml.p5.4xlarge", 1, 7.912, H100_80GB)])
    assert refused.value.problem == ("no MIG layout holds the portfolio: on ml.p5.4xlarge (1 x H100 80 GB) the copies "
                                     "take at least a 3 x 1 + b 3 x 1 + c 3 x 1 + 3 x 1 (a's update) = 12 compute "
                                     "slices, more than its 7")


def test_a_portfolio_within_the_sums_that_nvidia_cannot_place_says_so():
    """A 15 GB copy (smallest profile mig-1g.20gb, one slice) and a 38 GB one (mig-3g.40gb, three), one copy each,
    updated all at once: at least 1 + 3 + 1 = 5 of the H100's 7 slices, but 2 x 1g.20gb and 2 x 3g.40gb need 120 GB of
    its 80 (and sharing 3g.40gb needs 3 of them, 4g.40gb or 7g.80gb fewer than 2 fit): nothing places."""
    needs = [Need("a", 15000, "estimate", "drawn", 1, 1, 2, "all at once"),
             Need("b", 38000, "estimate", "drawn", 1, 1, 2, "all at once")]
    offers = [offer("ml.p5.4xlarge", 1, 7.912, H100_80GB)]
    assert brute_force(needs, offers) is None
    with pytest.raises(ConfigError) as refused:
        pack(needs, offers)
    assert refused.value.problem == ("no MIG layout holds the portfolio: on ml.p5.4xlarge (1 x H100 80 GB) the copies "
                                     "take at least a 1 x 1 + b 1 x 3 + 1 x 1 (a's update) = 5 compute slices of its "
                                     "7, but no layout NVIDIA places gives each profile the partitions its models "
                                     "need")


def portfolio_needs(paths: list[Path]) -> list[Need]:
    configs = load_fleet_configs(paths, placed=False)
    sizes = load_sizes(SIZES)
    return [need_of(fleet, None, sizes.models.get(fleet.name)) for fleet in configs]


def test_the_worked_example_packs_four_models_on_one_h100_and_agrees_with_brute_force():
    result = pack_fleet(load_fleet_configs(MODELS, placed=False), sizes=load_sizes(SIZES))
    needs = portfolio_needs(MODELS)
    offers = offers_of(load_price_table(), "us-east-1")
    assert (result.packing.key, result.packing.profile_of) == brute_force(needs, offers)
    assert result.packing.offer.instance_type == "ml.p5.4xlarge"
    assert all(n.memory_from == "estimate" and "stated: " in n.memory_note for n in result.needs)
    assert result.plan.problems == ()


def test_the_seed_8b_fp16_example_is_placed_by_its_estimate_and_agrees_with_brute_force():
    """~15 GiB of F16 weights + the KV cache of 8,000 tokens (8000 x 32 blocks x 8 heads x (128 + 128) x 2 bytes =
    1000 MiB) + 1.5 GB runtime: 17,865 MiB a copy."""
    result = pack_fleet(load_fleet_configs([EIGHT_B], placed=False), sizes=load_sizes(SIZES))
    (need,) = result.needs
    assert need.memory_mb == -(-16074000000 // 1024**2) + 1000 + 1536 and need.memory_from == "estimate"
    assert (result.packing.key, result.packing.profile_of) == brute_force(
        [need], offers_of(load_price_table(), "us-east-1"))


def test_a_copy_s_memory_is_its_last_build_s_where_the_ledger_has_one_else_an_estimate(tmp_path):
    ledger = Ledger.for_sqlite(tmp_path / "ledger.db")
    memory = {"weights_mb": 1100, "context_mb": 1500, "runtime_mb": 1536, "context_label": "activations",
              "total_mb": 4136}
    output = {"uri": "file:///built", "sha256": "0" * 64, "size": 1, "kind": "folder"}
    ledger.append(release_id="mdeberta-nli-000000000000", model="mdeberta-nli", stage="build", event="succeeded",
                  payload={"output": output, "model_sha256": "0" * 64, "info": {}, "memory": memory,
                           "temperature": 1.0}, actor="test")
    result = pack_fleet(load_fleet_configs(MODELS, placed=False), ledger=ledger, sizes=load_sizes(SIZES))
    ledger.close()
    froms = {n.model: (n.memory_from, n.memory_mb) for n in result.needs}
    assert froms["mdeberta-nli"] == ("build", 4136)
    assert froms["mdeberta-nli-de"][0] == "estimate" and froms["mdeberta-nli-de"][1] != 4136


def test_a_local_gguf_is_sized_from_its_file_and_header_and_a_model_with_nothing_to_size_is_refused(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, seed=3, dtype="F16")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "extends": str(PORTFOLIO / "qwen35-4b-semif.yaml"), "name": "tiny",
        "artifact": {"kind": "gguf", "source": {"kind": "path", "path": "tiny.gguf", "sha256": sha256_file(gguf)}}}))
    (need,) = portfolio_needs([config])
    assert need.memory_from == "estimate" and "the GGUF file tiny.gguf and its header" in need.memory_note
    assert need.memory_mb >= gguf.stat().st_size // 1024**2 + 1536
    with pytest.raises(ConfigError, match="has no build in the ledger and its artifact .* is not on this machine"):
        pack_fleet(load_fleet_configs([PORTFOLIO / "qwen35-4b-semif.yaml"], placed=False))


def test_the_cli_prints_writes_configs_that_fleet_plan_validates_and_never_overwrites(tmp_path, capsys):
    args = ["fleet", "pack", *map(str, MODELS), "--sizes", str(SIZES), "--state-dir", str(tmp_path / "state")]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["instance_type"] == "ml.p5.4xlarge" and len(report["models"]) == 4
    assert all(m["memory_from"] == "estimate" for m in report["models"])
    out_dir = tmp_path / "packed"
    assert main([*args, "--write", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    assert "each GPU carved" in printed and "left: " in printed and "estimate" in printed
    written = sorted(out_dir.glob("*.yaml"))
    assert {p.stem for p in written} == {m["model"] for m in report["models"]}
    plan = plan_fleet(written)
    assert plan.problems == () and {t.model: t.share.usd_per_hour for t in plan.tenants} == {
        m["model"]: m["share"]["usd_per_hour"] for m in report["models"]}
    assert main(["fleet", "plan", *map(str, written)]) == 0
    capsys.readouterr()
    assert main([*args, "--write", str(out_dir)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--write would replace" in err and "Traceback" not in err
    assert main([*args, "--write", str(PORTFOLIO)]) == EXIT_BAD_INPUT
    assert "a config packed from is never overwritten" in capsys.readouterr().err


def test_a_model_sharing_a_larger_profile_s_update_room_is_told_why():
    """A 5 GB and a 15 GB model, one copy each, updated all at once: apart they need 2 x mig-1g.10gb + 2 x mig-1g.20gb
    (4 compute slices); together on mig-1g.20gb 1 + 1 and one update's extra copy, 3 x mig-1g.20gb (3 slices), so the
    small one takes the larger profile and the reason says what the smaller would have cost."""
    needs = [Need("small", 5000, "estimate", "drawn", 1, 1, 2, "all at once"),
             Need("wide", 15000, "estimate", "drawn", 1, 1, 2, "all at once")]
    found = pack(needs, [offer("ml.p5.4xlarge", 1, 7.912, H100_80GB)])
    assert found.layout == ("mig-1g.20gb",) * 3 and found.profile_of == {"small": "mig-1g.20gb", "wide": "mig-1g.20gb"}
    told = {r.model: r.text for r in reasons(found, needs)}
    assert told["small"] == ("a copy needs 5000 MB (estimate), which mig-1g.10gb holds, but with it on mig-1g.10gb "
                             "each GPU would carve 2 x mig-1g.10gb + 2 x mig-1g.20gb, 4 compute slices against 3")
    assert told["wide"] == ("a copy needs 15000 MB (estimate), more than mig-1g.10gb's 10240 MB: the smallest profile "
                            "that holds it")


def test_the_cli_refuses_a_model_no_profile_holds_with_its_arithmetic_and_no_traceback(tmp_path, capsys):
    """A million-token context: 2,486 MB of weights + 32 x 4 x (256 + 256) x 2 bytes x 1,048,576 tokens of KV cache
    (131,072 MB) + 1,536 MB runtime, more than an H100's whole 80 GB."""
    code = main(["fleet", "pack", str(PORTFOLIO / "qwen35-4b-chat.yaml"), "--sizes", str(SIZES),
                 "--set", "image.server.ctx_size=1048576", "--state-dir", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and "Traceback" not in err
    assert ("qwen35-4b-chat needs 135094 MB a copy (estimate: " in err
            and "more than the largest MIG profile of any priced MIG instance type holds: mig-7g.80gb, 80 GB = "
                "81920 MB (53174 MB short)" in err)


@pytest.mark.slow  # two tiny releases and two fleet moves on the AWS double: make test-slow
def test_a_fleet_moves_from_one_packed_layout_to_another_each_tenant_moved_and_recorded(aws, aws_release,
                                                                                        tiny_release, tmp_path):
    """Two tiny models released on a hand-written 7 x mig-1g.10gb layout are packed from their builds' memory (3
    partitions: one copy each and one update's extra), moved there, then packed again once tiny-b asks two copies (5;
    its config extends the hand-written one, whose layout holds them) and moved again: each move records every
    tenant's move with the packed placement it serves with now."""
    aws_release.prepare_account(aws)
    state = tmp_path / "state"
    hand = {"kind": "mig_partition", "instance_type": "ml.p5.4xlarge", "partition_type": "mig-1g.10gb",
            "partitions": 7, "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1", "endpoint": "fleet"}
    paths = [aws_release.write_aws_config(tiny_release, tmp_path / name, state, name=f"tiny-{name}", placement=hand)
             for name in ("a", "b")]
    for path in paths:
        assert run_release(path, progress=lambda message: None)["status"] == "promoted"
    ledger = Ledger.for_sqlite(state / "ledger.db")
    first = pack_fleet(load_fleet_configs(paths, placed=False), ledger=ledger)
    assert {n.memory_from for n in first.needs} == {"build"} and first.packing.layout == ("mig-1g.10gb",) * 3
    packed = sorted(write_placements(first, tmp_path / "packed-1"))
    grown = tmp_path / "grown" / "tiny-b.yaml"
    grown.parent.mkdir()
    grown.write_text(yaml.safe_dump({"extends": str(paths[1]), "rollout": {"strategy": "all_at_once", "copies": 2}}))
    second = pack_fleet(load_fleet_configs([packed[0], grown], placed=False), ledger=ledger)
    assert second.packing.layout == ("mig-1g.10gb",) * 5
    repacked = sorted(write_placements(second, tmp_path / "packed-2"))
    for result, configs in ((first, packed), (second, repacked)):
        moved = move_fleet(configs, reason="packed", actor="ops", progress=lambda message: None)
        assert [m["outcome"] for m in moved["models"]] == ["moved", "moved"]
        for model in ("tiny-a", "tiny-b"):
            record = [r for r in ledger.history(model) if is_fleet_move(r)][-1]
            assert promotion(record).moved_to["placement"] == result.placements[model]
    ledger.close()


def test_a_sizes_file_with_an_unknown_key_is_refused_naming_it(tmp_path):
    sizes = tmp_path / "sizes.yaml"
    sizes.write_text(yaml.safe_dump({"models": {"m": {"artifact_byte": 1, "shape": {}, "source": "typed"}}}))
    with pytest.raises(ConfigError) as refused:
        load_sizes(sizes)
    assert "invalid sizes file" in refused.value.problem
    assert "models.m.artifact_bytes: Field required" in refused.value.problem
    assert "models.m.artifact_byte: Extra inputs are not permitted" in refused.value.problem


def test_fleet_plan_of_a_mixed_layout_counts_each_profile_s_partitions_apart(tmp_path):
    """The packed portfolio fills its 4 mig-1g.10gb partitions (three one-copy models and one update's extra); a fifth
    tenant there overfills them (5 of 4 while an update runs) while the chat model's 2 mig-1g.20gb stay as they were."""
    result = pack_fleet(load_fleet_configs(MODELS, placed=False), sizes=load_sizes(SIZES))
    written = write_placements(result, tmp_path / "packed")
    fifth = tmp_path / "packed" / "mdeberta-nli-fr.yaml"
    fifth.write_text(yaml.safe_dump({"extends": "mdeberta-nli-de.yaml", "name": "mdeberta-nli-fr"}))
    plan = plan_fleet([*written, fifth])
    peaks = {t.model: (plan.peak(t), plan.slots_of(t).total(1)) for t in plan.tenants}
    assert peaks == {"mdeberta-nli": (5, 4), "mdeberta-nli-de": (5, 4), "mdeberta-nli-fr": (5, 4),
                     "qwen35-4b-semif": (5, 4), "qwen35-4b-chat": (2, 2)}
    assert len(plan.problems) == 4 and not any(p.startswith("qwen35-4b-chat") for p in plan.problems)
    assert all("1 x ml.p5.4xlarge = 4 mig-1g.10gb partitions" in p for p in plan.problems)
