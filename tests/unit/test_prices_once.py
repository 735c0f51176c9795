"""A missing price is said once per run (the first cost line names it with the command that fills it, the lines after it
point back), and the shipped table prices what the demo, its shared endpoint and the shared-h100 fleet run on, so their
cost columns show dollars (issue 47: the demo's gate reports, `status` and `fleet plan`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shiplift.tasks.backends.pricing import DEFAULT_PRICES_PATH, dry_run_cost_lines, load_price_table, release_cost
from shiplift.tasks.config import load_release_config
from shiplift.tasks.pipeline.fleet.plan import plan_snapshot
from shiplift.tasks.pipeline.fleet.snapshot import load_fleet_configs, read_snapshot
from tests.fakes.price_tables import price_table

RELEASES = Path(__file__).resolve().parents[2] / "configs" / "releases"
DEMO = RELEASES / "gemma-decision.yaml"  # the demo's first release; its nominal type is ml.c7i.xlarge
SHARED = [RELEASES / "gemma-decision-shared.yaml", RELEASES / "minilm-nli-shared.yaml"]  # the demo's shared endpoint
MIG = RELEASES / "mdeberta-nli.yaml"
SHARED_H100 = sorted((RELEASES.parent / "fleets" / "shared-h100").glob("*.yaml"))  # two models on one ml.p5.4xlarge

NO_C7I = price_table(
    "ml.g6e.xlarge: {usd_per_hour: 2.33, source: test figure, as_of: 2026-12-01, provenance: project-readme}")
NO_P5 = NO_C7I  # nor ml.p5.4xlarge: the MIG example's instance is unpriced in it


@pytest.fixture()
def no_p5(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(NO_P5, encoding="utf-8")
    return load_price_table(path)


def texts(value) -> list[str]:
    """Every `text` of a cost result, nested as release_cost returns them."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in ([item] if key == "text" else texts(item))]
    return [text for item in value for text in texts(item)] if isinstance(value, list) else []


def gate_cost(config_path: Path, table=None) -> dict:
    return release_cost(load_release_config(config_path, environ={}), answers_per_second=12.5, items_per_request=1,
                        candidate_since="2026-12-03T10:00:00+00:00", until="2026-12-03T10:30:00+00:00", table=table)


def test_a_release_names_an_unpriced_type_once_with_the_command_that_fills_it(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(NO_C7I, encoding="utf-8")
    cost = gate_cost(DEMO, load_price_table(path))
    said = [text for text in texts(cost) if "no price for ml.c7i.xlarge in us-east-1" in text]
    assert said == [cost["production"]["text"]], texts(cost)
    assert ("`shiplift prices refresh --region us-east-1 --types ml.c7i.xlarge` reads it from the AWS Price List API"
            in said[0])
    assert "no price (ml.c7i.xlarge in us-east-1, as above)" in cost["candidate"]["text"]
    assert "no price (ml.c7i.xlarge in us-east-1, as above)" in cost["per_million"]["text"]
    assert cost["per_million"]["per_million_requests"] is None


def test_the_dry_run_names_the_unpriced_mig_instance_once(no_p5):
    lines = dry_run_cost_lines(load_release_config(MIG, environ={}), no_p5)
    assert sum("no price for ml.p5.4xlarge in us-east-1" in line for line in lines) == 1, lines
    assert lines[0].startswith("cost: production: no price for ml.p5.4xlarge in us-east-1; add it to ")
    assert lines[1] == "cost: a candidate: no price (ml.p5.4xlarge in us-east-1, as above)"
    assert lines[2].startswith("cost: a mig-1g.10gb copy's share: no price (ml.p5.4xlarge in us-east-1, as above)")


def test_each_run_says_it_again_once(no_p5):
    config = load_release_config(MIG, environ={})
    first = dry_run_cost_lines(config, no_p5)[0]
    assert "no price for ml.p5.4xlarge in us-east-1" in first
    assert dry_run_cost_lines(config, no_p5)[0] == first  # the caller's table unchanged


def test_the_demo_s_gate_prices_its_nominal_type():
    cost = gate_cost(DEMO)
    price = load_price_table(DEFAULT_PRICES_PATH).hourly("us-east-1", "ml.c7i.xlarge")
    copies = load_release_config(DEMO, environ={}).placement.instance_count
    assert cost["nominal"] and cost["production"]["usd_per_hour"] == pytest.approx(copies * price.usd_per_hour)
    assert cost["candidate"]["usd"] == pytest.approx(0.5 * price.usd_per_hour)  # one instance for 30 minutes
    assert "from a third-party page, unchecked against AWS" in cost["production"]["text"]
    assert not [text for text in texts(cost) if "no price" in text]
    json.dumps(cost, allow_nan=False)


def test_the_demo_s_shared_endpoint_plan_shows_each_model_s_dollars():
    plan = plan_snapshot(read_snapshot(load_fleet_configs(SHARED)))
    assert plan.bill.usd_per_hour is not None
    shares = {tenant.model: tenant.share.usd_per_hour for tenant in plan.tenants}
    assert len(shares) == 2 and all(usd is not None and usd > 0 for usd in shares.values()), shares


def test_the_shared_h100_fleet_plan_shows_each_model_s_dollars():
    plan = plan_snapshot(read_snapshot(load_fleet_configs(SHARED_H100)))
    price = load_price_table(DEFAULT_PRICES_PATH).hourly("us-east-1", "ml.p5.4xlarge")
    assert plan.bill.usd_per_hour == pytest.approx(price.usd_per_hour)  # one instance, billed whole
    shares = {tenant.model: tenant.share.usd_per_hour for tenant in plan.tenants}
    assert shares == {"mdeberta-nli": pytest.approx(2 / 7 * price.usd_per_hour),
                      "mdeberta-nli-de": pytest.approx(2 / 7 * price.usd_per_hour)}, shares  # 2 of 7 partitions each
