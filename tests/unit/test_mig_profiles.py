"""NVIDIA's MIG placement table (tasks/backends/mig_profiles.py) against the documents it cites, and a mixed layout as
config, request, capacity and cost share (docs/fleet.md, "Mixed MIG layouts").

References, independent of the module's search: NVIDIA's "Supported MIG Profiles" tables (the instances each profile
allows on its own, https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html), the layouts
AWS's documents name (API_AcceleratorPartitionLayout: ["mig-3g.40gb", "mig-4g.40gb"];
inference-components-accelerator-partitioning-create: three mig-1g.5gb), and a brute force over multisets that
checks the sums and per-profile counts only, with no start slots."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from pydantic import TypeAdapter, ValidationError

from shiplift.tasks.backends import mig_profiles
from shiplift.tasks.backends.aws.hosting_requests import variant
from shiplift.tasks.backends.capacity import slots
from shiplift.tasks.backends.mig_profiles import (
    MigGpu,
    MigProfile,
    gpu_for_instance,
    layout_problem,
    placement_of,
    valid_layouts,
)
from shiplift.tasks.backends.placement import MigPartitionPlacement, Placement, endpoint_placement
from shiplift.tasks.backends.placement import layout_problem as single_profile_problem
from shiplift.tasks.backends.pricing import component_share, load_price_table, mig_copy_share_of
from shiplift.tasks.pipeline.fleet.layout import layout_id
from tests.fakes.price_tables import price_table

MIG_TYPES = ("ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g7.2xlarge", "ml.g7e.2xlarge")
# NVIDIA's tables: profile -> "Number of Instances Available" (A100-SXM4-40GB, H100-SXM5-80GB, RTX PRO 6000 and 4500)
NVIDIA_INSTANCES = {
    "ml.p4d.24xlarge": {"mig-1g.5gb": 7, "mig-1g.10gb": 4, "mig-2g.10gb": 3, "mig-3g.20gb": 2, "mig-4g.20gb": 1,
                        "mig-7g.40gb": 1},
    "ml.p5.48xlarge": {"mig-1g.10gb": 7, "mig-1g.20gb": 4, "mig-2g.20gb": 3, "mig-3g.40gb": 2, "mig-4g.40gb": 1,
                       "mig-7g.80gb": 1},
    "ml.g7e.2xlarge": {"mig-1g.24gb": 4, "mig-2g.48gb": 2, "mig-4g.96gb": 1},
    "ml.g7.2xlarge": {"mig-1g.16gb": 2, "mig-2g.32gb": 1},
}
MIXED = ("mig-3g.40gb", "mig-2g.20gb", "mig-1g.10gb", "mig-1g.10gb")


@pytest.mark.parametrize("instance_type", MIG_TYPES)
def test_each_profile_alone_allows_exactly_nvidias_instance_count(instance_type):
    gpu = gpu_for_instance(instance_type)
    assert {p.name: p.max_instances for p in gpu.profiles} == NVIDIA_INSTANCES[instance_type]
    for name, most in NVIDIA_INSTANCES[instance_type].items():
        assert layout_problem(instance_type, [name] * most) is None, name
        assert layout_problem(instance_type, [name] * (most + 1)) is not None, name


@pytest.mark.parametrize("instance_type, layout", [
    ("ml.p5.48xlarge", ("mig-3g.40gb", "mig-4g.40gb")),  # API_AcceleratorPartitionLayout's example
    ("ml.p4d.24xlarge", ("mig-1g.5gb",) * 3),  # inference-components-accelerator-partitioning-create's example
    ("ml.p5.48xlarge", MIXED),  # the portfolio
    ("ml.p4d.24xlarge", ("mig-4g.20gb", "mig-2g.10gb", "mig-1g.5gb")),
    ("ml.g7e.2xlarge", ("mig-2g.48gb", "mig-1g.24gb", "mig-1g.24gb")),
])
def test_layouts_the_documents_name_are_valid(instance_type, layout):
    assert layout_problem(instance_type, layout) is None
    assert tuple(sorted(layout)) in valid_layouts(instance_type)


def test_refusals_give_the_arithmetic_and_the_fix():
    too_big = layout_problem("ml.p5.48xlarge", ["mig-3g.40gb", "mig-3g.40gb", "mig-2g.20gb"])
    assert too_big == ("2 x mig-3g.40gb + 1 x mig-2g.20gb needs 8 compute slices and 100 GB, but one H100 80 GB GPU of "
                       "ml.p5.48xlarge has 7 slices and 80 GB; use fewer or smaller partitions")
    other_gpu = layout_problem("ml.g7e.2xlarge", ["mig-1g.10gb"])
    assert other_gpu.startswith("mig-1g.10gb is not a MIG profile of the RTX PRO 6000 96 GB GPU of ml.g7e.2xlarge")
    assert "use one of mig-1g.24gb, mig-2g.48gb, mig-4g.96gb" in other_gpu
    assert "not a MIG profile such as" in layout_problem("ml.p5.48xlarge", ["3g.40gb"])
    assert layout_problem("ml.g6e.xlarge", ["mig-1g.10gb"]).startswith("instance_type ml.g6e.xlarge: SageMaker MIG")
    assert "names no MIG profile" in layout_problem("ml.p5.48xlarge", [])


def _by_sums(instance_type: str) -> set[tuple[str, ...]]:
    """The reference: every multiset within the GPU's compute slices, memory and each profile's instance count."""
    gpu = gpu_for_instance(instance_type)
    found = set()
    for size in range(1, gpu.compute_slices + 1):
        for combo in itertools.combinations_with_replacement([p.name for p in gpu.profiles], size):
            profiles = [gpu.profile(name) for name in combo]
            if (sum(p.slices for p in profiles) <= gpu.compute_slices
                    and sum(p.memory_gb for p in profiles) <= gpu.memory_gb
                    and all(count <= gpu.profile(name).max_instances for name, count in Counter(combo).items())):
                found.add(tuple(sorted(combo)))
    return found


@pytest.mark.parametrize("instance_type", MIG_TYPES)
def test_the_placements_agree_with_the_sums_on_sagemakers_gpus(instance_type):
    """On these four GPUs every multiset within the sums also has start slots (checked exhaustively), so the exact
    search refuses nothing the sums allow; each valid layout's placement keeps its partitions apart."""
    layouts = valid_layouts(instance_type)
    assert set(layouts) == _by_sums(instance_type) and len(layouts) == len(set(layouts))
    gpu = gpu_for_instance(instance_type)
    for layout in layouts:
        starts = placement_of(instance_type, layout)
        used = [slot for name, start in zip(layout, starts, strict=True)
                for slot in range(start, start + gpu.profile(name).span)]
        assert len(used) == len(set(used)) and max(used) < gpu.memory_slices, layout
        assert all(start in gpu.profile(name).starts for name, start in zip(layout, starts, strict=True)), layout


def test_start_slots_refuse_what_the_sums_allow(monkeypatch):
    """A GPU whose start slots, not its sums, rule a layout out: the exact search finds it and says why."""
    odd = MigGpu("test GPU", 40, 4, (MigProfile("mig-1g.10gb", 1, 10, 3, (1, 2, 3), 1, "test"),
                                     MigProfile("mig-2g.20gb", 2, 20, 1, (1,), 2, "test")), memory_slices=4)
    monkeypatch.setitem(mig_profiles.MIG_GPUS, "p5", odd)
    problem = layout_problem("ml.p5.48xlarge", ["mig-2g.20gb", "mig-1g.10gb", "mig-1g.10gb"])
    assert problem.startswith("1 x mig-2g.20gb + 2 x mig-1g.10gb fits the sums (4 of 4 compute slices, 40 of 40 GB) "
                              "but cannot be placed")
    assert "mig-2g.20gb starts at memory slice 1 and spans 2" in problem
    assert ("mig-1g.10gb", "mig-1g.10gb", "mig-2g.20gb") not in mig_profiles._valid_layouts(odd)
    assert ("mig-1g.10gb", "mig-2g.20gb") in mig_profiles._valid_layouts(odd)


def test_the_single_profile_check_delegates():
    assert single_profile_problem("ml.p5.48xlarge", "mig-1g.10gb", 7) is None
    assert single_profile_problem("ml.p5.48xlarge", "mig-1g.10gb", 8) == layout_problem("ml.p5.48xlarge",
                                                                                       ["mig-1g.10gb"] * 8)


# -- a mixed layout as config, request, capacity and cost share ---------------------------------------------------

def tenant(partition_type: str, **extra) -> MigPartitionPlacement:
    data = {"kind": "mig_partition", "instance_type": "ml.p5.48xlarge", "partition_type": partition_type,
            "layout": list(MIXED), "endpoint": "portfolio", **extra}
    return TypeAdapter(Placement).validate_python(data)


def test_a_tenant_counts_the_partitions_of_its_own_type():
    small, large = tenant("mig-1g.10gb"), tenant("mig-3g.40gb")
    assert (small.partitions, large.partitions) == (2, 1) and small.profiles == MIXED
    assert slots(small, None).describe(1) == "1 x ml.p5.48xlarge = 16 mig-1g.10gb partitions"  # 2 on each of 8 GPUs
    assert slots(large, None).describe(1) == "1 x ml.p5.48xlarge = 8 mig-3g.40gb partitions"
    request = variant(large, model_name=None, variant_name="AllTraffic", on_gpu=True)
    assert request["AcceleratorPartitionLayouts"] == [{"AcceleratorPartitionTypes": list(MIXED)}]
    assert endpoint_placement(small) == endpoint_placement(large) and layout_id(small) == layout_id(large), \
        "every tenant names the same endpoint"
    assert layout_id(tenant("mig-1g.10gb", layout=["mig-4g.40gb"] + ["mig-1g.10gb"] * 3)) != layout_id(small)
    again = TypeAdapter(Placement).validate_python(small.model_dump(mode="json"))
    assert again == small, "a dumped placement loads back"


def test_a_single_profile_placement_keeps_its_endpoint_name():
    old = TypeAdapter(Placement).validate_python({"kind": "mig_partition", "instance_type": "ml.p5.4xlarge",
                                                  "partition_type": "mig-1g.10gb", "partitions": 7})
    assert "layout" not in endpoint_placement(old) and old.profiles == ("mig-1g.10gb",) * 7
    assert variant(old, model_name=None, variant_name="AllTraffic", on_gpu=True)["AcceleratorPartitionLayouts"] == [
        {"AcceleratorPartitionTypes": ["mig-1g.10gb"] * 7}]


@pytest.mark.parametrize("extra, message", [
    ({"partition_type": "mig-4g.40gb"}, "placement.partition_type mig-4g.40gb is not in placement.layout"),
    ({"partitions": 3}, "placement.partitions is 3, but placement.layout has 2 x mig-1g.10gb"),
    ({"layout": ["mig-3g.40gb", "mig-3g.40gb", "mig-1g.10gb", "mig-1g.10gb"]}, "needs 8 compute slices and 100 GB"),
    ({"layout": ["mig-1g.10gb", "mig-1g.24gb"]}, "mig-1g.24gb is not a MIG profile of the H100 80 GB GPU"),
    ({"instance_type": "ml.p4d.24xlarge", "partition_type": "mig-3g.20gb",
      "layout": ["mig-3g.20gb", "mig-1g.10gb", "mig-1g.10gb"]},
     "the layout on mig-1g.10gb partitions of P4d needs NVIDIA driver >= 525"),  # another tenant's type
])
def test_a_bad_layout_is_refused_at_load(extra, message):
    with pytest.raises(ValidationError, match=message.replace(".", r"\.").replace("(", r"\(")):
        tenant(extra.pop("partition_type", "mig-1g.10gb"), **extra)


def test_a_tenant_pays_its_compute_slices_of_the_gpu(tmp_path):
    """3g + 2g + 1g + 1g uses 7 slices on each of 8 GPUs: a mig-3g.40gb copy carries 3/56 of the instance, a
    mig-1g.10gb copy 1/56; one profile repeated keeps 1 / (partitions x GPUs)."""
    path = tmp_path / "prices.yaml"
    path.write_text(price_table("ml.p5.48xlarge: {usd_per_hour: 112, source: test figure, as_of: 2026-12-01, "
                                "provenance: project-readme}"), encoding="utf-8")
    table = load_price_table(path)
    large, small = (mig_copy_share_of(table, "us-east-1", tenant(t)) for t in ("mig-3g.40gb", "mig-1g.10gb"))
    assert large.fraction == pytest.approx(3 / 56) and large.usd_per_copy_hour == pytest.approx(6.0)
    assert small.fraction == pytest.approx(1 / 56) and small.usd_per_copy_hour == pytest.approx(2.0)
    assert "3/7 compute slices" in large.describe() and large.as_dict()["layout"] == list(MIXED)
    mid = mig_copy_share_of(table, "us-east-1", tenant("mig-2g.20gb"))
    whole = 8 * (large.usd_per_copy_hour + mid.usd_per_copy_hour + 2 * small.usd_per_copy_hour)
    assert whole == pytest.approx(112.0), "the layout's partitions carry the whole instance"
    shared = component_share(table, "us-east-1", tenant("mig-3g.40gb"), None, 1)
    assert shared.usd_per_hour == pytest.approx(large.usd_per_copy_hour), "fleet share = copy share: 1 of 8, at 3/7"
    assert "which carry 0.429 of the bill by compute slices" in shared.describe()
    assert component_share(table, "us-east-1", tenant("mig-1g.10gb"), None, 2).usd_per_hour == pytest.approx(4.0)
