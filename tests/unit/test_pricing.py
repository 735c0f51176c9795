"""Cost (tasks.backends.pricing): the arithmetic against cases worked out by hand here, a missing price that says so
instead of a number, a malformed price file refused with the entry and the fix, SHIPLIFT_PRICES pointing at another
file, and the shipped table: dated, sourced, and covering every instance type the example configs place (or saying
which it knowingly leaves out, and why)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from shiplift.tasks.backends.placement import InstancePoolPlacement, InstanceTypePlacement, MigPartitionPlacement
from shiplift.tasks.backends.pricing import (
    DEFAULT_PRICES_PATH,
    PRICES_ENV,
    candidate_cost,
    candidate_cost_for,
    component_share,
    dry_run_cost_lines,
    hourly_cost,
    load_price_table,
    mig_copy_share,
    mig_copy_share_of,
    production_cost,
    release_cost,
    throughput_cost,
)
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import BadInput, ConfigError
from tests.fakes.price_tables import price_table

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "configs" / "releases"
QWEN = RELEASES / "qwen35-4b-semif.yaml"
MDEBERTA = RELEASES / "mdeberta-nli.yaml"
GEMMA = RELEASES / "gemma-decision.yaml"

# Types the example configs place that the shipped table knowingly leaves out, and why (none may be guessed). Empty
# since ml.p5.4xlarge got a quoted third-party figure (2026-12-07); a new unpriced type is listed here with its reason.
KNOWINGLY_UNPRICED: dict[str, str] = {}

# Test figures, written out here so the hand-worked cases below do not move when the shipped table is updated.
TEST_TABLE = price_table(
    "ml.g6e.xlarge: {usd_per_hour: 2.33, source: test figure, as_of: 2026-12-01, provenance: project-readme}",
    "ml.g6.2xlarge: {usd_per_hour: 1.22, source: test figure, as_of: 2026-12-01, provenance: project-readme}",
    "ml.g5.2xlarge: {usd_per_hour: 1.52, source: test figure, as_of: 2026-12-01, provenance: project-readme}",
    "ml.g4dn.2xlarge: {usd_per_hour: 1.05, source: test figure, as_of: 2026-12-01, provenance: project-readme}",
    "ml.p5.48xlarge:\n"
    "      usd_per_hour: 113\n"
    "      source: https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonSageMaker/current/us-east-1/index.json\n"
    "      as_of: \"2026-11-30\"\n"
    "      provenance: price-list-api",
    "ml.p5.4xlarge: {usd_per_hour: 10.5, source: test figure (not a price), as_of: 2026-12-01,\n"
    "                    provenance: project-readme}",
)


@pytest.fixture()
def table(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(TEST_TABLE, encoding="utf-8")
    return load_price_table(path)


def pool(*types: str) -> InstancePoolPlacement:
    return InstancePoolPlacement(kind="instance_pool", instance_count=2,
                                 pools=[{"instance_type": t, "priority": i} for i, t in enumerate(types, 1)])


def mig(instance_type: str, partitions: int) -> MigPartitionPlacement:
    return MigPartitionPlacement(kind="mig_partition", instance_type=instance_type, partition_type="mig-1g.10gb",
                                 partitions=partitions)


# --- production per hour ---------------------------------------------------------------------------------------------

def test_production_of_a_pool_is_its_instance_count_times_its_first_type_with_the_range_over_the_pool(table):
    cost = production_cost(table, "us-east-1",
                           pool("ml.g6e.xlarge", "ml.g6.2xlarge", "ml.g5.2xlarge", "ml.g4dn.2xlarge"))
    assert (cost.instance_type, cost.instances) == ("ml.g6e.xlarge", 2)
    assert cost.usd_per_hour == pytest.approx(4.66)  # 2 x 2.33
    assert cost.range_usd_per_hour == pytest.approx((2.10, 4.66))  # 2 x 1.05 (g4dn) .. 2 x 2.33 (g6e)
    text = cost.describe()
    assert text.startswith("production ≈ 4.66 $/h (2 × ml.g6e.xlarge at 2.33 $/h, us-east-1, price as of 2026-12-01 "
                           "as quoted in the project README, unchecked)"), text
    assert "SageMaker may provision another pool type instead: 2.10–4.66 $/h" in text


def test_a_pool_type_without_a_price_is_named_and_left_out_of_the_range(table):
    cost = production_cost(table, "us-east-1", pool("ml.g6e.xlarge", "ml.g5.12xlarge"))
    assert cost.range_usd_per_hour == pytest.approx((4.66, 4.66))
    assert cost.unpriced_pool_types == ("ml.g5.12xlarge",)
    assert "no price for ml.g5.12xlarge in us-east-1" in cost.describe()


def test_an_instance_type_placement_pays_its_instance_count(table):
    placement = InstanceTypePlacement(kind="instance_type", instance_type="ml.g6.2xlarge", instance_count=3)
    assert production_cost(table, "us-east-1", placement).usd_per_hour == pytest.approx(3.66)  # 3 x 1.22


def test_a_mig_placement_pays_its_whole_instance(table):
    cost = production_cost(table, "us-east-1", mig("ml.p5.48xlarge", 2))
    assert (cost.instances, cost.usd_per_hour) == (1, 113)  # one instance, whatever the layout uses of it
    assert "bills its whole ml.p5.48xlarge, idle partitions included" in cost.describe()
    assert "price as of 2026-11-30 from the AWS Price List API" in cost.describe()


# --- a model's share of a shared endpoint ----------------------------------------------------------------------------

def test_a_model_on_a_shared_mig_endpoint_carries_its_copies_over_the_endpoint_s_partitions(table):
    """2 copies on 7 x mig-1g.10gb of one ml.p5.4xlarge (1 H100) at the test figure 10.5 $/h: 2/7 x 10.5 = 3.0 $/h."""
    from types import SimpleNamespace

    placement = mig("ml.p5.4xlarge", 7).model_copy(update={"endpoint": "shared-h100"})
    share = component_share(table, "us-east-1", placement, SimpleNamespace(on_gpu=True, threads=2), 2)
    assert (share.copies, share.capacity, share.fraction) == (2, 7, pytest.approx(2 / 7))
    assert share.usd_per_hour == pytest.approx(3.0)
    assert share.describe() == ("this model's share of shared-h100 ≈ 3.00 $/h = 2 of 1 x ml.p5.4xlarge = 7 mig-1g.10gb "
                                "partitions at 10.50 $/h for the endpoint")


def test_a_model_on_a_shared_gpu_pool_carries_its_copies_over_the_pool_s_gpus(table):
    """3 one-GPU ml.g6e.xlarge instances at 2.33 $/h = 6.99 $/h; one copy holds one GPU: 1/3 of it, 2.33 $/h."""
    from types import SimpleNamespace

    placement = pool("ml.g6e.xlarge").model_copy(update={"instance_count": 3, "endpoint": "fleet"})
    share = component_share(table, "us-east-1", placement, SimpleNamespace(on_gpu=True, threads=2), 1)
    assert share.bill.usd_per_hour == pytest.approx(6.99) and share.usd_per_hour == pytest.approx(2.33)
    unpriced = component_share(table, "eu-west-1", placement, SimpleNamespace(on_gpu=True, threads=2), 1)
    assert unpriced.usd_per_hour is None and "no price" in unpriced.describe()


def test_a_model_that_scales_to_zero_pays_its_slot_share_unless_every_model_on_the_endpoint_scales_to_zero(table):
    """3 one-GPU instances, one copy each side: SageMaker stops a shared endpoint's instances only when every component
    is at 0 copies (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html), so a
    model that scales to zero beside one that never does pays its full slot share (2.33 $/h) while it idles. The gate
    report's share, priced from one config, cannot know the others and credits no saving either."""
    from types import SimpleNamespace

    placement = pool("ml.g6e.xlarge").model_copy(update={"instance_count": 3, "endpoint": "fleet"})
    gpu = SimpleNamespace(on_gpu=True, threads=2)
    kept = component_share(table, "us-east-1", placement, gpu, 1, scales_to_zero=True, kept_on_by=("gemma",))
    assert kept.usd_per_hour == pytest.approx(2.33) and kept.idle_costs is True
    assert kept.describe().endswith("but gemma never do(es), and SageMaker stops the instances only when every model "
                                    "on the endpoint is at 0 copies: this share is paid while it is at zero too")
    alone = component_share(table, "us-east-1", placement, gpu, 1, scales_to_zero=True, kept_on_by=())
    assert alone.usd_per_hour == pytest.approx(2.33) and alone.idle_costs is False
    unknown = component_share(table, "us-east-1", placement, gpu, 1, scales_to_zero=True)
    assert unknown.idle_costs is None and unknown.as_dict()["kept_on_by"] is None
    assert component_share(table, "us-east-1", placement, gpu, 1, kept_on_by=("gemma",)).kept_on_by == (), \
        "a model that never scales to zero is kept on by nobody"
    encoder = load_release_config(RELEASES / "minilm-nli-shared.yaml")
    cost = release_cost(encoder, answers_per_second=None, items_per_request=1, candidate_since=None,
                        until="2026-12-06T00:00:00+00:00", table=table)
    assert cost["share"]["scales_to_zero"] and cost["share"]["idle_costs"] is None
    assert "only when every model on it is at 0 copies" in cost["share"]["text"]


# --- a MIG copy's share ----------------------------------------------------------------------------------------------

def test_a_mig_copy_carries_the_instance_over_the_partitions_of_every_gpu(table):
    """7 x mig-1g.10gb on each of ml.p5.48xlarge's 8 GPUs = 56 copies an instance: 113 / 56 = 2.017857… $/h a copy."""
    share = mig_copy_share(table, "us-east-1", "ml.p5.48xlarge", "mig-1g.10gb", 7)
    assert (share.gpus, share.copies_per_instance) == (8, 56)
    assert share.fraction == pytest.approx(1 / 56)
    assert share.usd_per_copy_hour == pytest.approx(2.017857, rel=1e-6)
    assert share.compute_fraction == pytest.approx(1 / 56)  # 1 of 7 compute slices on each of 8 GPUs
    assert share.describe().startswith("a mig-1g.10gb copy ≈ 2.02 $/h = 1/56 of ml.p5.48xlarge at 113.00 $/h "
                                       "(7 partitions on each of 8 GPUs; the instance is billed whole")


def test_a_smaller_layout_leaves_slices_idle_and_each_copy_carries_more(table):
    """2 partitions a GPU: 16 copies an instance carry the whole bill, 113 / 16 = 7.0625 $/h each, though each uses
    only 1/56 of the compute."""
    share = mig_copy_share_of(table, "us-east-1", mig("ml.p5.48xlarge", 2))
    assert (share.copies_per_instance, share.usd_per_copy_hour) == (16, pytest.approx(7.0625))
    assert share.compute_fraction == pytest.approx(1 / 56)


def test_the_one_gpu_p5_shares_its_price_among_its_seven_partitions(table):
    share = mig_copy_share_of(table, "us-east-1", mig("ml.p5.4xlarge", 7))  # 10.5 / 7 = 1.50
    assert (share.gpus, share.copies_per_instance, share.usd_per_copy_hour) == (1, 7, pytest.approx(1.5))
    assert "(7 partitions on its GPU;" in share.describe()


# --- a candidate -----------------------------------------------------------------------------------------------------

def test_a_candidate_pays_its_lifetime(table):
    """37 minutes on 1 x 1.22 $/h: 37/60 x 1.22 = 0.752333… $."""
    cost = candidate_cost(table, "us-east-1", "ml.g6.2xlarge", "2026-12-03T10:00:00Z", "2026-12-03T10:37:00+00:00")
    assert cost.seconds == 37 * 60
    assert cost.instance_hours == pytest.approx(37 / 60)
    assert cost.usd == pytest.approx(0.752333, rel=1e-6)
    assert cost.describe().startswith("candidate ≈ 0.75 $ (1 × ml.g6.2xlarge at 1.22 $/h for 37.0 min, "
                                      "2026-12-03T10:00:00+00:00 → 2026-12-03T10:37:00+00:00, us-east-1")


def test_a_config_candidate_is_one_instance_of_the_type_it_ran_on(table):
    config = load_release_config(QWEN, environ={})
    first = candidate_cost_for(table, config, "2026-12-03T10:00:00+00:00", "2026-12-03T10:30:00+00:00")
    assert (first.hourly.instance_type, first.hourly.instances, first.usd) == ("ml.g6e.xlarge", 1, pytest.approx(1.165))
    fallback = candidate_cost_for(table, config, "2026-12-03T10:00:00+00:00", "2026-12-03T10:30:00+00:00",
                                  instance_type="ml.g4dn.2xlarge")  # the type the backend recorded
    assert fallback.usd == pytest.approx(0.525)  # 0.5 h x 1.05


@pytest.mark.parametrize("started, finished, says", [
    ("2026-12-03T10:37:00+00:00", "2026-12-03T10:00:00+00:00", "is before started_at"),
    ("yesterday", "2026-12-03T10:00:00+00:00", "is not an ISO 8601 timestamp"),
    ("2026-12-03T10:00:00", "2026-12-03T10:37:00+00:00", "one has a time zone and the other not"),
])
def test_a_candidate_lifetime_that_is_not_one_is_refused(table, started, finished, says):
    with pytest.raises(BadInput, match=says):
        candidate_cost(table, "us-east-1", "ml.g6.2xlarge", started, finished)


# --- per million requests and decisions ------------------------------------------------------------------------------

def test_cost_per_million_requests_and_decisions_at_a_measured_throughput(table):
    """4.66 $/h at 12.5 req/s: 4.66 / (3600 x 12.5) x 1e6 = 103.5555… $ per million requests; an NLI batch of 16 pairs a
    request answers 16 decisions: 103.5555… / 16 = 6.4722… $ per million decisions."""
    hourly = production_cost(table, "us-east-1", pool("ml.g6e.xlarge", "ml.g6.2xlarge"))
    batch = throughput_cost(hourly, 12.5, items_per_request=16)
    assert batch.per_million_requests == pytest.approx(103.5556, rel=1e-5)
    assert batch.per_million_decisions == pytest.approx(6.47222, rel=1e-5)
    assert batch.describe() == ("≈ 103.56 $ per million requests, ≈ 6.47 $ per million decisions "
                                "(4.66 $/h / (3600 × 12.5 req/s) × 1e6; 16 decisions a request)")
    single = throughput_cost(4.66, 12.5)  # a decision request answers one decision
    assert single.per_million_decisions == single.per_million_requests == pytest.approx(103.5556, rel=1e-5)


@pytest.mark.parametrize("rps, items", [(0, 1), (-1.0, 1), (float("nan"), 1), (12.5, 0)])
def test_a_throughput_that_cannot_be_divided_by_is_refused(rps, items):
    with pytest.raises(BadInput):
        throughput_cost(4.66, rps, items_per_request=items)


# --- a missing price -------------------------------------------------------------------------------------------------

def test_a_missing_price_says_so_instead_of_a_number(table):
    cost = hourly_cost(table, "eu-west-1", "ml.g6e.xlarge", 2)
    assert cost.price is None and cost.usd_per_hour is None
    assert cost.describe() == (f"production: no price for ml.g6e.xlarge in eu-west-1; add it to {table.origin}: "
                               "`shiplift prices refresh --region eu-west-1 --types ml.g6e.xlarge` reads it from the "
                               "AWS Price List API (docs/cost.md)")
    assert "no price for ml.g6e.xlarge in eu-west-1" in throughput_cost(cost, 12.5).describe()
    assert throughput_cost(cost, 12.5).per_million_requests is None
    candidate = candidate_cost(table, "us-east-1", "ml.g7e.2xlarge", "2026-12-03T10:00:00Z", "2026-12-03T11:00:00Z")
    assert candidate.usd is None and "no price for ml.g7e.2xlarge in us-east-1" in candidate.describe()
    share = mig_copy_share(table, "us-west-2", "ml.p5.48xlarge", "mig-1g.10gb", 7)
    assert share.usd_per_copy_hour is None and "no price for ml.p5.48xlarge in us-west-2" in share.describe()


def test_the_working_of_every_result_is_json(table):
    hourly = production_cost(table, "us-east-1", pool("ml.g6e.xlarge", "ml.g5.12xlarge"))
    results = [hourly, throughput_cost(hourly, 3.0, 8),
               mig_copy_share(table, "us-east-1", "ml.p5.48xlarge", "mig-1g.10gb", 7),
               candidate_cost(table, "us-east-1", "ml.g6.2xlarge", "2026-12-03T10:00:00Z", "2026-12-03T10:37:00Z"),
               hourly_cost(table, "eu-west-1", "ml.g6e.xlarge")]
    for result in results:
        working = json.loads(json.dumps(result.as_dict()))
        assert working["text"] == result.describe()
    assert results[0].as_dict()["price"] == {"usd_per_hour": 2.33, "source": "test figure", "as_of": "2026-12-01",
                                             "provenance": "project-readme", "note": None}


# --- the price file --------------------------------------------------------------------------------------------------

GOOD_ENTRY = "{usd_per_hour: 2.33, source: test figure, as_of: 2026-12-01, provenance: project-readme}"
HEAD = "version: 1\noffer: sagemaker-real-time-on-demand\ncurrency: USD\nunit: instance-hour\n"


@pytest.mark.parametrize("text, says", [
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: {usd_per_hour: -2.33, source: x, as_of: 2026-12-01, "
            "provenance: project-readme}}}",
            "prices.us-east-1.ml.g6e.xlarge.usd_per_hour: Input should be greater than 0"),
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: {usd_per_hour: '2.33', source: x, as_of: 2026-12-01, "
            "provenance: project-readme}}}",
            "prices.us-east-1.ml.g6e.xlarge.usd_per_hour: Input should be a valid number"),
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: {usd_per_hour: 2.33, as_of: 2026-12-01, provenance: project-readme}}}",
     "prices.us-east-1.ml.g6e.xlarge.source: Field required"),
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: {usd_per_hour: 2.33, source: x, provenance: project-readme}}}",
     "prices.us-east-1.ml.g6e.xlarge.as_of: Field required"),
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: {usd_per_hour: 2.33, source: the console, as_of: 2026-12-01, "
            "provenance: price-list-api}}}", "names the https URL it was read from"),
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: {usd_per_hour: 2.33, source: x, as_of: 2026-12-01, "
            "provenance: project-readme, spot: 0.7}}}",
            "prices.us-east-1.ml.g6e.xlarge.spot: Extra inputs are not permitted"),
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: {usd_per_hour: 2.33, source: x, as_of: last week, "
            "provenance: project-readme}}}", "prices.us-east-1.ml.g6e.xlarge.as_of"),
    (HEAD + f"prices: {{US East: {{ml.g6e.xlarge: {GOOD_ENTRY}}}}}", "prices.US East.[key]"),
    (HEAD + f"prices: {{us-east-1: {{g6e.xlarge: {GOOD_ENTRY}}}}}", "prices.us-east-1.g6e.xlarge.[key]"),
    (HEAD.replace("USD", "EUR") + f"prices: {{us-east-1: {{ml.g6e.xlarge: {GOOD_ENTRY}}}}}", "currency"),
    ("- ml.g6e.xlarge\n", "a price table is a mapping"),
    (HEAD + "prices: {us-east-1: {ml.g6e.xlarge: [1, 2}}", "not valid YAML"),
])
def test_a_malformed_price_file_is_refused_with_the_entry_and_the_fix(tmp_path, text, says):
    path = tmp_path / "prices.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_price_table(path)
    assert says in str(refused.value), str(refused.value)
    assert refused.value.fix


def test_shiplift_prices_points_at_another_file(tmp_path, monkeypatch):
    path = tmp_path / "mine.yaml"
    path.write_text(HEAD + f"prices: {{eu-west-1: {{ml.g6e.xlarge: {GOOD_ENTRY.replace('2.33', '2.99')}}}}}\n",
                    encoding="utf-8")
    table = load_price_table(environ={PRICES_ENV: str(path)})
    assert table.hourly("eu-west-1", "ml.g6e.xlarge").usd_per_hour == 2.99
    assert table.hourly("us-east-1", "ml.g6e.xlarge") is None, "the other file replaces the shipped one, not merges"
    assert f"add it to {path}" in table.missing("us-east-1", "ml.g6e.xlarge")
    monkeypatch.setenv(PRICES_ENV, str(path))
    assert load_price_table().hourly("eu-west-1", "ml.g6e.xlarge").usd_per_hour == 2.99
    monkeypatch.setenv(PRICES_ENV, str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match=f"absent.yaml \\(named by {PRICES_ENV}\\) does not exist"):
        load_price_table()
    monkeypatch.delenv(PRICES_ENV)
    assert load_price_table().origin == "configs/prices/sagemaker-real-time-on-demand.yaml"


def test_the_shipped_table_is_dated_and_sourced_and_says_which_figures_are_unchecked():
    table = load_price_table(DEFAULT_PRICES_PATH)
    assert table.prices["us-east-1"], "us-east-1 is priced"
    for region, types in table.prices.items():
        for instance_type, price in types.items():
            assert price.source and price.as_of, (region, instance_type)
            if price.provenance == "project-readme":
                assert "check before relying on it" in (price.note or ""), (region, instance_type)
            if price.provenance == "third-party-page":
                assert price.source.startswith("https://"), (region, instance_type)
                assert "unchecked against AWS" in (price.note or ""), (region, instance_type)
    readme = {t: p.usd_per_hour for t, p in table.prices["us-east-1"].items() if p.provenance == "project-readme"}
    assert readme == {"ml.g6e.xlarge": 2.33, "ml.g6.2xlarge": 1.22, "ml.g5.2xlarge": 1.52, "ml.g4dn.2xlarge": 1.05,
                      "ml.p5.48xlarge": 113}, "the README's figures, as quoted (change this test when they are sourced)"


def _placed_types(config) -> list[str]:
    placement = config.placement
    return ([p.instance_type for p in placement.pools] if placement.kind == "instance_pool"
            else [placement.instance_type])


def test_every_instance_type_the_example_configs_place_is_priced_in_us_east_1_or_knowingly_unpriced():
    table = load_price_table(DEFAULT_PRICES_PATH)
    placed = {t for path in sorted(RELEASES.glob("*.yaml"))
              for t in _placed_types(load_release_config(path, environ={}))}
    unpriced = {t for t in placed if table.hourly("us-east-1", t) is None}
    assert unpriced == set(KNOWINGLY_UNPRICED), "price the new type, or list it here with the reason"
    assert all(KNOWINGLY_UNPRICED.values())


# --- the dry run's summary -------------------------------------------------------------------------------------------

def test_the_dry_run_prices_production_a_candidate_and_the_update_of_the_qwen_pool(table):
    lines = dry_run_cost_lines(load_release_config(QWEN, environ={}), table)
    assert len(lines) == 3, lines
    assert lines[0].startswith("cost: production ≈ 4.66 $/h (2 × ml.g6e.xlarge at 2.33 $/h")
    assert lines[1].startswith("cost: a candidate ≈ 2.33 $/h (1 × ml.g6e.xlarge")
    assert "≈ 1.17 $ for 30 minutes" in lines[1]
    # all at once: 2 new copies beside 2 serving, one GPU each: managed scaling adds 2 instances for the update
    assert lines[2].startswith("cost: an update's extra instances ≈ 4.66 $/h (2 × ml.g6e.xlarge")
    assert "4 × ml.g6e.xlarge ≈ 9.32 $/h at the peak" in lines[2]


def test_the_dry_run_of_the_mig_example_shares_the_instance_and_adds_nothing_for_an_update(table):
    lines = dry_run_cost_lines(load_release_config(MDEBERTA, environ={}), table)
    assert lines[0].startswith("cost: production ≈ 10.50 $/h (1 × ml.p5.4xlarge")
    assert "bills its whole ml.p5.4xlarge" in lines[0]
    assert lines[2].startswith("cost: a mig-1g.10gb copy ≈ 1.50 $/h = 1/7 of ml.p5.4xlarge")
    assert lines[3].startswith("cost: an update adds no instance (")  # 2 idle partitions take the 2 new copies


def test_the_dry_run_with_the_shipped_table_prices_the_mig_example_and_says_where_the_figure_is_from():
    price = load_price_table(DEFAULT_PRICES_PATH).hourly("us-east-1", "ml.p5.4xlarge")
    lines = dry_run_cost_lines(load_release_config(MDEBERTA, environ={}))
    assert not [line for line in lines if "no price" in line], lines
    assert lines[0].startswith(f"cost: production ≈ {price.usd_per_hour:.2f} $/h (1 × ml.p5.4xlarge"), lines
    assert price.provenance == "third-party-page" and "unchecked against AWS" in lines[0]
    assert lines[2].startswith(f"cost: a mig-1g.10gb copy ≈ {price.usd_per_hour / 7:.2f} $/h = 1/7 of ml.p5.4xlarge")


def test_the_dry_run_of_a_local_config_prices_nothing(table):
    assert dry_run_cost_lines(load_release_config(GEMMA, environ={}), table) == [
        "cost: the local backend serves on this machine; no SageMaker price applies"]


def test_pricing_imports_neither_validation_nor_the_pipeline():
    source = (ROOT / "tasks" / "backends" / "pricing.py").read_text(encoding="utf-8")
    modules = [alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
               for alias in node.names]
    modules += [node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom) and node.module]
    heavy = ("shiplift.validation", "shiplift.tasks.pipeline", "boto3", "botocore")
    assert [m for m in modules if m.startswith(heavy)] == []
