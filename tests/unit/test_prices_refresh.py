"""`shiplift prices refresh` (tasks.backends.aws.price_list, tasks.cli.prices_commands) against GetProducts answers
replayed through botocore's Stubber (tests/data/pricing-get-products.json, in the pricing model's shape), never the
network: the requests it sends and pages through, the entries it writes (price-list-api, the offer URL, the
publicationDate), what it keeps, --dry-run writing nothing, and each refusal (no product, several, a misspelt type, no
credentials, AccessDenied) leaving the file as it was."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from shiplift.tasks.backends.aws import price_list
from shiplift.tasks.backends.pricing_table import load_price_table
from shiplift.tasks.cli.prices_commands import add_prices_commands
from shiplift.tasks.errors import BadInput, ConfigError
from tests.fakes.price_tables import price_table

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "data" / "pricing-get-products.json").read_text())
EXCHANGES = RECORDED["exchanges"]
OFFER = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonSageMaker/current/{}/index.json"

TABLE = ("# A price table for tests: this comment block is kept by a refresh.\n#\n# (two lines of it)\n" + price_table(
    "ml.g6e.xlarge: {usd_per_hour: 2.33, source: test figure, as_of: 2026-12-01, provenance: project-readme}",
    "ml.g5.2xlarge: {usd_per_hour: 1.52, source: test figure, as_of: 2026-12-01, provenance: project-readme,"
    " note: kept}"))


@pytest.fixture()
def prices(tmp_path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(TABLE, encoding="utf-8")
    return path


def stubbed(exchanges: list[dict]) -> tuple[price_list.Aws, Stubber]:
    """The Price List session with fake credentials of its own, its client answering `exchanges` in order."""
    aws = price_list.price_list_session(boto3.Session(aws_access_key_id="AKIDSHIPLIFTTEST",
                                                   aws_secret_access_key="not-a-secret", region_name="us-east-1"))
    stub = Stubber(aws.client("pricing", read_timeout_s=price_list.READ_TIMEOUT_S))
    for exchange in exchanges:
        stub.add_response("get_products", exchange["response"], exchange["request"])
    return aws, stub


def refresh(argv: list[str], aws, monkeypatch, capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="shiplift")
    add_prices_commands(parser.add_subparsers(dest="command", required=True))
    monkeypatch.setattr(price_list, "price_list_session", lambda: aws)
    args = parser.parse_args(["prices", "refresh", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_the_client_reads_from_us_east_1_with_timeouts():
    aws = price_list.price_list_session()
    assert aws.region == "us-east-1" and aws.read_timeout_s == 30


def test_refresh_writes_price_list_entries_dated_by_publication_and_keeps_the_rest(prices, monkeypatch, capsys):
    aws, stub = stubbed(EXCHANGES)
    with stub:
        code, out = refresh(["--prices", str(prices), "--region", "us-east-1", "eu-west-1",
                             "--types", "ml.c7i.xlarge", "ml.g6e.xlarge", "--json"], aws, monkeypatch, capsys)
        stub.assert_no_pending_responses()  # both pages of the first query were read
    assert code == 0
    report = json.loads(out)
    assert [(c["region"], c["instance_type"], c["change"]) for c in report["changes"]] == [
        ("us-east-1", "ml.c7i.xlarge", "new"), ("us-east-1", "ml.g6e.xlarge", "changed"),
        ("eu-west-1", "ml.c7i.xlarge", "new"), ("eu-west-1", "ml.g6e.xlarge", "new")]
    assert report["written"] is True
    table = load_price_table(prices)
    c7i = table.hourly("us-east-1", "ml.c7i.xlarge")
    assert (c7i.usd_per_hour, c7i.provenance, c7i.source, c7i.as_of.isoformat()) == (
        0.5, "price-list-api", OFFER.format("us-east-1"), "2026-11-27")
    assert c7i.note == "usagetype USE1-Host:ml.c7i.xlarge, sku TESTSKUC7IUSE1"
    assert table.hourly("us-east-1", "ml.g6e.xlarge").usd_per_hour == 2.5
    assert table.hourly("eu-west-1", "ml.g6e.xlarge").source == OFFER.format("eu-west-1")
    kept = table.hourly("us-east-1", "ml.g5.2xlarge")
    assert (kept.usd_per_hour, kept.provenance, kept.note) == (1.52, "project-readme", "kept")
    assert prices.read_text().startswith("# A price table for tests: this comment block is kept by a refresh.\n#\n"
                                         "# (two lines of it)\nversion: 1\n")


def test_the_table_shows_what_changed(prices, monkeypatch, capsys):
    aws, stub = stubbed(EXCHANGES[:3])
    with stub:
        code, out = refresh(["--prices", str(prices), "--region", "us-east-1", "--types", "ml.c7i.xlarge",
                             "ml.g6e.xlarge"], aws, monkeypatch, capsys)
    assert code == 0
    assert "2.33 (project-readme)" in out and "changed" in out and "2026-11-27" in out
    assert f"2 of 2 figures new or changed; {prices} written" in out


def test_dry_run_writes_nothing(prices, monkeypatch, capsys):
    aws, stub = stubbed(EXCHANGES[:2])
    with stub:
        code, out = refresh(["--prices", str(prices), "--region", "us-east-1", "--types", "ml.c7i.xlarge", "--dry-run"],
                            aws, monkeypatch, capsys)
    assert code == 0 and prices.read_text() == TABLE
    assert "new" in out and "nothing written (--dry-run)" in out


def test_a_rerun_with_the_same_answer_changes_nothing(prices, monkeypatch, capsys):
    aws, stub = stubbed(EXCHANGES[:2] + EXCHANGES[:2])
    argv = ["--prices", str(prices), "--region", "us-east-1", "--types", "ml.c7i.xlarge"]
    with stub:
        refresh(argv, aws, monkeypatch, capsys)
        written = prices.read_text()
        code, out = refresh(argv, aws, monkeypatch, capsys)
    assert code == 0 and "unchanged" in out and "0 of 1 figures new or changed; nothing written" in out
    assert prices.read_text() == written


def product(index: int) -> dict:
    return json.loads(EXCHANGES[index]["response"]["PriceList"][0])


def answer(request: dict, *items: dict) -> dict:
    return {"request": request, "response": {"FormatVersion": "aws_v1", "PriceList": [json.dumps(i) for i in items]}}


def test_a_type_with_no_product_is_refused_naming_it_and_nothing_is_written(prices):
    aws, stub = stubbed([answer(EXCHANGES[2]["request"])])
    with stub, pytest.raises(BadInput) as caught:
        price_list.refresh_prices(aws, load_price_table(prices), ["us-east-1"], ["ml.g6e.xlarge"])
    assert "ml.g6e.xlarge in us-east-1: no Hosting product" in caught.value.problem
    assert "nothing was written" in caught.value.fix and prices.read_text() == TABLE


def test_several_products_are_refused_with_their_usage_types(prices):
    other = copy.deepcopy(product(2))
    other["product"]["attributes"]["usagetype"] = "USE1-Host-Other:ml.g6e.xlarge"
    aws, stub = stubbed([answer(EXCHANGES[2]["request"], product(2), other)])
    with stub, pytest.raises(BadInput) as caught:
        price_list.refresh_prices(aws, load_price_table(prices), ["us-east-1"], ["ml.g6e.xlarge"])
    assert ("ml.g6e.xlarge in us-east-1: 2 Hosting products (usagetype USE1-Host-Other:ml.g6e.xlarge, "
            "USE1-Host:ml.g6e.xlarge)") in caught.value.problem


def test_a_product_of_another_component_is_not_taken_for_hosting(prices):
    training = copy.deepcopy(product(2))
    training["product"]["attributes"]["component"] = "Training"
    aws, stub = stubbed([answer(EXCHANGES[2]["request"], training)])
    with stub, pytest.raises(BadInput, match="no Hosting product"):
        price_list.refresh_prices(aws, load_price_table(prices), ["us-east-1"], ["ml.g6e.xlarge"])


@pytest.mark.parametrize("regions, types, named", [(["us-east-1"], ["g6e.xlarge"], "--types: 'g6e.xlarge'"),
                                                   (["US East"], ["ml.g6e.xlarge"], "--region: 'US East'")])
def test_a_misspelt_name_is_refused_before_any_request(prices, regions, types, named):
    aws, stub = stubbed([])
    with stub, pytest.raises(BadInput, match=named):  # no answer queued: a request sent would fail otherwise
        price_list.refresh_prices(aws, load_price_table(prices), regions, types)


def test_access_denied_names_the_permission_and_writes_nothing(prices, monkeypatch, capsys):
    aws, stub = stubbed([])
    stub.add_client_error("get_products", service_error_code="AccessDeniedException",
                          service_message="User is not authorized to perform: pricing:GetProducts",
                          http_status_code=400, expected_params=EXCHANGES[2]["request"])
    with stub, pytest.raises(ConfigError) as caught:
        refresh(["--prices", str(prices), "--region", "us-east-1", "--types", "ml.g6e.xlarge"], aws, monkeypatch,
                capsys)
    assert "AccessDeniedException" in caught.value.problem
    assert "needs only pricing:GetProducts" in caught.value.fix and prices.read_text() == TABLE


def test_no_credentials_is_a_config_error_with_the_fix(prices, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(ConfigError) as caught:
        price_list.refresh_prices(price_list.price_list_session(), load_price_table(prices), ["us-east-1"],
                                       ["ml.g6e.xlarge"])
    assert "no usable AWS credentials" in caught.value.problem
    assert "pricing:GetProducts" in caught.value.fix and prices.read_text() == TABLE


def test_a_table_with_no_type_asks_for_types_and_sends_nothing(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text(TABLE.split("prices:")[0] + "prices: {}\n", encoding="utf-8")
    aws, stub = stubbed([])
    with stub, pytest.raises(BadInput, match="lists no instance type to refresh"):
        refresh(["--prices", str(empty)], aws, monkeypatch, capsys)
