"""The dated, sourced price table (docs/cost.md): its format, where it is read from (`SHIPLIFT_PRICES`, else the
checkout's configs/prices file) and its checks, and how a price and an amount are written in a report."""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from shiplift.tasks.errors import ConfigError
from shiplift.tasks.project import PROJECT_ROOT
from shiplift.tasks.yamlfile import read_yaml_file

PRICES_ENV = "SHIPLIFT_PRICES"
DEFAULT_PRICES_PATH = PROJECT_ROOT / "configs" / "prices" / "sagemaker-real-time-on-demand.yaml"

Region = Annotated[str, Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")]
InstanceTypeName = Annotated[str, Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9-]+$")]
PROVENANCE_TEXT = {
    "price-list-api": "from the AWS Price List API",
    "pricing-page": "from the SageMaker AI pricing page",
    "third-party-page": "from a third-party page, unchecked against AWS",
    "project-readme": "as quoted in the project README, unchecked",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Price(_Frozen):
    """One On-Demand figure: USD for one instance-hour, where it was read and when."""

    usd_per_hour: float = Field(gt=0, le=10_000)
    source: str = Field(min_length=1, max_length=500)
    as_of: date = Field(strict=False, description="the date the figure was read (a Price List offer's publicationDate)")
    provenance: Literal["price-list-api", "pricing-page", "third-party-page", "project-readme"]
    note: str | None = Field(None, max_length=2000)

    @model_validator(mode="after")
    def _read_from_aws_means_a_url(self) -> Price:
        if self.provenance != "project-readme" and not self.source.startswith("https://"):
            raise ValueError(f"a {self.provenance} figure names the https URL it was read from as its source, got "
                             f"{self.source!r}")
        return self

    def describe(self) -> str:
        """`2.33 $/h, price as of 2026-12-03 as quoted in the project README, unchecked`."""
        return f"{_usd(self.usd_per_hour)} $/h, price as of {self.as_of.isoformat()} {PROVENANCE_TEXT[self.provenance]}"


class PriceTable(_Frozen):
    """The price file: USD per instance-hour by region, then instance type."""

    version: Literal[1]
    offer: Literal["sagemaker-real-time-on-demand"]
    currency: Literal["USD"]
    unit: Literal["instance-hour"]
    prices: dict[Region, dict[InstanceTypeName, Price]]
    _origin: str = PrivateAttr(default="configs/prices/sagemaker-real-time-on-demand.yaml")
    _told: set[tuple[str, str]] | None = PrivateAttr(default=None)  # the missing prices `once` has named in full

    @property
    def origin(self) -> str:
        """The file the table was read from, as a message names it."""
        return self._origin

    def hourly(self, region: str, instance_type: str) -> Price | None:
        """The On-Demand price of one `instance_type` in `region`, or None where the table has none."""
        return self.prices.get(region, {}).get(instance_type)

    def once(self) -> PriceTable:
        """This table for one run's cost lines: `missing` names a missing price with its fix the first time only."""
        run = self.model_copy()
        run._told = set()
        return run

    def missing(self, region: str, instance_type: str) -> str:
        """What a report says instead of a number: the missing price and the command that fills it, or, where a
        `once` table has said so already, a pointer to that line."""
        if self._told is not None and (region, instance_type) in self._told:
            return f"no price ({instance_type} in {region}, as above)"
        if self._told is not None:
            self._told.add((region, instance_type))
        return (f"no price for {instance_type} in {region}; add it to {self.origin}: `shiplift prices refresh --region "
                f"{region} --types {instance_type}` reads it from the AWS Price List API (docs/cost.md)")


def prices_path(environ: dict[str, str] | None = None) -> Path:
    """The price file to read: `SHIPLIFT_PRICES` where it is set, else the checkout's configs/prices file."""
    environ = os.environ if environ is None else environ
    named = environ.get(PRICES_ENV, "").strip()
    return Path(named).expanduser() if named else DEFAULT_PRICES_PATH


def load_price_table(path: str | Path | None = None, *, environ: dict[str, str] | None = None) -> PriceTable:
    """Read and check a price file (default: `prices_path()`); ConfigError names the file, the entry and the fix."""
    chosen = Path(path) if path is not None else prices_path(environ)
    named_by = f" (named by {PRICES_ENV})" if path is None and chosen != DEFAULT_PRICES_PATH else ""
    if not chosen.is_file():
        raise ConfigError(f"price table {chosen}{named_by} does not exist",
                          fix=f"point {PRICES_ENV} at a price file, or unset it to use {_shown(DEFAULT_PRICES_PATH)}")
    tree = read_yaml_file(chosen, "price table")
    fix = f"correct the entries listed above; the header of {_shown(DEFAULT_PRICES_PATH)} shows the format"
    if not isinstance(tree, dict):
        raise ConfigError(f"{chosen}: a price table is a mapping (version, offer, currency, unit, prices), got "
                          f"{type(tree).__name__}", fix=fix)
    try:
        table = PriceTable.model_validate(tree)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(step) for step in err['loc']) or '(top level)'}: {err['msg']}{_got(err)}"
                 for err in exc.errors()]
        raise ConfigError(f"{chosen}: invalid price table\n" + "\n".join(lines), fix=fix) from None
    table._origin = _shown(chosen)
    return table


def _got(err: dict) -> str:
    value = err.get("input")
    return "" if isinstance(value, (dict, list)) else f" (got {value!r})"


def _usd(amount: float) -> str:
    """Two decimals; small amounts with three significant digits, so they do not print as 0.00."""
    return f"{amount:.2f}" if abs(amount) >= 0.1 or amount == 0 else f"{amount:.3g}"


def price_dict(price: Price | None) -> dict[str, Any] | None:
    return None if price is None else {**price.model_dump(), "as_of": price.as_of.isoformat()}


def _shown(path: Path) -> str:
    """A path under the checkout relative to it (as the user would type it), any other path as given."""
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)
