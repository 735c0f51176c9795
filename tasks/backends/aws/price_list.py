"""`shiplift prices refresh`: the price table's figures read from the AWS Price List API (docs/cost.md).

One GetProducts query per region and instance type (ServiceCode AmazonSageMaker; regionCode, component Hosting, which
is real-time inference, and instanceName as TERM_MATCH filters; every page read), sent through `tasks.backends.aws`'s
session, so the request is checked against the botocore model, has connect and read timeouts and bounded retries, and
its failures are domain errors. The API answers from us-east-1 whatever region is priced, and needs only
pricing:GetProducts (https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/using-the-aws-price-list-query-api.html).
Each answer must be one product with one hourly On-Demand price; it becomes a `price-list-api` entry whose `as_of` is
the offer's publicationDate. Every other entry is kept; any problem refuses the whole refresh before anything is
written, and the file is written atomically, its leading comment block kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from shiplift.tasks.atomic import write_text_atomic
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.backends.pricing_table import InstanceTypeName, Price, PriceTable, Region, price_dict
from shiplift.tasks.errors import BadInput, ConfigError
from shiplift.tasks.yamlfile import parse_yaml

PRICE_LIST_REGION = "us-east-1"  # the Price List API's endpoint, whichever region is priced
SERVICE_CODE = "AmazonSageMaker"
HOSTING = "Hosting"  # the `component` of real-time inference; training, processing, notebooks are others
OFFER_URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonSageMaker/current/{region}/index.json"
READ_TIMEOUT_S = 30
PAGE_SIZE = 100  # GetProducts' MaxResults maximum
GET_PRODUCTS = "aws pricing get-products in docs/cost.md, \"How to update a figure\""


def price_list_session(access=None) -> Aws:
    """The Price List API's session: us-east-1, the default credential chain (or `access`), a 30 s read timeout."""
    return Aws(region=PRICE_LIST_REGION, access=access, read_timeout_s=READ_TIMEOUT_S)


@dataclass(frozen=True)
class PriceChange:
    """One figure as the table had it (None: no entry) and as the Price List API gives it now."""

    region: str
    instance_type: str
    before: Price | None
    after: Price

    @property
    def change(self) -> str:
        """new, changed (the figure moved), re-dated (same figure, newer offer or another source) or unchanged."""
        if self.before is None:
            return "new"
        if self.before.usd_per_hour != self.after.usd_per_hour:
            return "changed"
        return "unchanged" if self.before == self.after else "re-dated"

    def as_dict(self) -> dict[str, Any]:
        return {"region": self.region, "instance_type": self.instance_type, "change": self.change,
                "before": price_dict(self.before), "after": price_dict(self.after)}


def refresh_prices(aws: Aws, table: PriceTable, regions: list[str], types: list[str]) -> list[PriceChange]:
    """Every (region, type)'s figure from the Price List API beside the table's; BadInput lists every type that has
    no product or several, and nothing is returned then; a misspelt region or type is refused before any request."""
    _check_names("--region", regions, TypeAdapter(Region), "a region code such as us-east-1")
    _check_names("--types", types, TypeAdapter(InstanceTypeName), "an ml. instance type such as ml.g6e.xlarge")
    changes, problems = [], []
    for region in regions:
        for instance_type in types:
            try:
                after = read_price(aws, region, instance_type)
            except BadInput as exc:
                problems.append(exc.problem)
                continue
            changes.append(PriceChange(region, instance_type, table.hourly(region, instance_type), after))
    if problems:
        raise BadInput("the Price List API gave no single real-time inference price for:\n  " + "\n  ".join(problems),
                       fix="check each type's spelling and that SageMaker AI offers it in that region, leave it out "
                           f"of --types, or read its products with the {GET_PRODUCTS}; nothing was written")
    return changes


def _check_names(flag: str, names: list[str], adapter: TypeAdapter, expected: str) -> None:
    wrong = []
    for name in names:
        try:
            adapter.validate_python(name)
        except ValidationError:
            wrong.append(name)
    if wrong:
        raise BadInput(f"{flag}: {', '.join(map(repr, wrong))} is not {expected}", fix=f"pass {expected}")


def read_price(aws: Aws, region: str, instance_type: str) -> Price:
    """The On-Demand real-time inference price of one `instance_type` in `region`, as a price-list-api entry."""
    where = f"{instance_type} in {region}"
    wanted = {"instanceName": instance_type, "regionCode": region, "component": HOSTING}
    products = [product for product in _products(aws, region, instance_type)
                if all(_attributes(product).get(key) == value for key, value in wanted.items())]
    if not products:
        raise BadInput(f"{where}: no Hosting product")
    if len(products) > 1:
        usage = ", ".join(sorted(str(_attributes(p).get("usagetype")) for p in products))
        raise BadInput(f"{where}: {len(products)} Hosting products (usagetype {usage}), so which one bills an endpoint "
                       "is not clear")
    product = products[0]
    hourly = [dimension for term in (product.get("terms") or {}).get("OnDemand", {}).values()
              for dimension in (term.get("priceDimensions") or {}).values() if dimension.get("unit") == "Hrs"]
    if len(hourly) != 1:
        raise BadInput(f"{where}: the product has {len(hourly)} hourly On-Demand prices, not one")
    attributes = _attributes(product)
    try:
        return Price(usd_per_hour=float(hourly[0]["pricePerUnit"]["USD"]), source=OFFER_URL.format(region=region),
                     as_of=date.fromisoformat(str(product["publicationDate"])[:10]), provenance="price-list-api",
                     note=f"usagetype {attributes.get('usagetype')}, sku {(product.get('product') or {}).get('sku')}")
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise BadInput(f"{where}: the product's price or publicationDate cannot be read ({exc})") from None


def _products(aws: Aws, region: str, instance_type: str):
    """Every product GetProducts answers for the filters, page after page, each parsed from its JSON string."""
    filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value}
               for field, value in (("regionCode", region), ("component", HOSTING), ("instanceName", instance_type))]
    token = None
    while True:
        page = _get_products(aws, {"ServiceCode": SERVICE_CODE, "Filters": filters, "FormatVersion": "aws_v1",
                                   "MaxResults": PAGE_SIZE, **({"NextToken": token} if token else {})})
        for item in page.get("PriceList", []):
            try:
                yield json.loads(item)
            except (TypeError, ValueError):
                raise BadInput(f"{instance_type} in {region}: a PriceList item is not JSON") from None
        token = page.get("NextToken")
        if not token:
            return


def _get_products(aws: Aws, params: dict) -> dict:
    try:
        return aws.call("pricing", "GetProducts", **params)
    except ConfigError as exc:  # no, expired or refused credentials: say what the Price List API needs
        raise ConfigError(exc.problem, fix=f"{exc.fix}; the Price List API needs only pricing:GetProducts, with "
                                           "credentials of any account; nothing was written") from exc


def _attributes(product: dict) -> dict:
    return (product.get("product") or {}).get("attributes") or {}


def updated_table(table: PriceTable, changes: list[PriceChange]) -> dict[str, Any]:
    """The table as data with each change's figure in place: regions and types kept in order, new ones after."""
    tree = table.model_dump(mode="json", exclude_none=True)
    for change in changes:
        tree["prices"].setdefault(change.region, {})[change.instance_type] = change.after.model_dump(
            mode="json", exclude_none=True)
    return tree


def write_price_table(path: Path, tree: dict[str, Any]) -> None:
    """Write the price table atomically, keeping the file's leading comment block; the text is read back and checked
    as a price table before it replaces the file."""
    text = _leading_comments(path) + yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, width=120)
    try:
        PriceTable.model_validate(parse_yaml(text, str(path)))
    except ValidationError as exc:  # a figure the API gave that the table cannot hold
        raise BadInput(f"{path}: the refreshed table would not read back: {exc}",
                       fix="report it; nothing was written") from None
    write_text_atomic(path, text)


def _leading_comments(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            break
        kept.append(line)
    return "".join(kept)
