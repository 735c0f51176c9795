"""Generate the project's NLI set (validation/data/nli.jsonl) in the answer-verification style.

The premise is a retrieved passage; the hypothesis is a claim an LLM might make from it:
entailed (stated or directly implied), neutral (an extra detail the passage does not give) or
contradicted (a wrong number, date, time or entity, or a negation). Each scenario of each
domain yields one pair of every label, so labels are balanced. Scenarios (never single pairs)
are split train / calibration / test 15 / 4 / 6 per domain, so one passage never sits in two
splits and every split is balanced by label and domain. Then 5 more scenarios of each domain,
drawn after all of those from the same generator, make the `reserve` split (75 pairs, balanced the
same way): what an inconclusive champion check extends onto (`validation.inconclusive.extend`),
read by no gate's first look and no training. Drawn last, they left the first 375 pairs (train,
calibration, test) byte-identical, so the demo model trains on what it trained on before.
Templates and a fixed seed make the output byte-identical on every run:

    python -m shiplift.validation.nli.builtin_set [--out validation/data/nli.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from datetime import date, timedelta
from functools import partial
from pathlib import Path

from shiplift.validation.nli.pairs import RESERVE_SPLIT

SEED = 20260401
NEWLINE = b"\n"
SCENARIOS_PER_DOMAIN = 25
SPLIT_PLAN = (("train", 15), ("calibration", 4), ("test", 6))
RESERVE_SCENARIOS = 5  # a domain, drawn after every domain's SCENARIOS_PER_DOMAIN: the reserve split
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "nli.jsonl"
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
FIRST_NAMES = ("Alice", "Bruno", "Chen", "Dara", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kaori",
               "Luca", "Maya", "Nils", "Olga", "Priya", "Quentin", "Rosa", "Samir", "Tessa")
SURNAMES = ("Novak", "Okafor", "Lindqvist", "Moreau", "Tanaka", "Fischer", "Silva", "Kowalski", "Haddad",
            "Byrne", "Costa", "Weber")
CITIES = ("Lyon", "Porto", "Gdansk", "Leipzig", "Bilbao", "Turin", "Ghent", "Aarhus", "Brno", "Cork", "Graz",
          "Utrecht", "Malmo", "Bergen", "Split", "Tartu")
CARRIERS = ("DHL", "UPS", "FedEx", "GLS", "DPD")
ITEMS = (("desk lamp", "desk lamps"), ("office chair", "office chairs"), ("water bottle", "water bottles"),
         ("backpack", "backpacks"), ("coffee grinder", "coffee grinders"), ("yoga mat", "yoga mats"),
         ("monitor stand", "monitor stands"), ("kettle", "kettles"))
PRODUCTS = (("laptop", (1090, 1250, 1490, 1720)), ("pair of headphones", (180, 240, 310)),
            ("tablet", (450, 520, 620)), ("e-reader", (170, 195, 230)), ("smartwatch", (32, 41, 56)),
            ("portable speaker", (540, 760, 980)))
BRANDS = ("Norvik", "Altima", "Pelion", "Quasar", "Bravo", "Kestrel")
COLOURS = ("black", "silver", "blue", "green", "red", "white", "graphite", "sand")
COUNTRIES = ("Vietnam", "Mexico", "Poland", "Taiwan", "Portugal")
STORES = ("Northwind Outfitters", "Copperleaf Home", "Bluefin Sports", "Maple & Co", "Orbit Electronics",
          "Tidewater Books")
ORGS = ("Helix Labs", "the city library", "Orion Logistics", "St. Mary's Hospital", "Vantage Bank",
        "the regional newspaper", "Greenway Energy", "Atlas Architects")
JOBS = ("nurse", "data analyst", "architect", "teacher", "software engineer", "accountant", "journalist",
        "electrician")
RIVERS = ("Alder", "Wensum", "Lysa", "Morva", "Tarn", "Eske", "Brenna")
TOWNS = ("Kellmoor", "Avonby", "Stennick", "Dulverham", "Rosslare Vale", "Marwick", "Elsbrook", "Fenwold",
         "Halverton", "Ashcombe", "Brackley Down", "Corrin")
FEATURES = ("Gothic cathedral", "cheese market", "glass museum", "medieval bridge", "spring flower festival",
            "old salt mines")
SERVICES = ("InterCity", "regional express", "night train", "coastal line", "morning shuttle")
DAY_RULES = (
    ("only on weekdays", "The train runs on Wednesdays.", "The train also runs on Sundays."),
    ("every day of the week", "The train runs on Sundays.", "The train does not run on Saturdays."),
    ("only on weekends", "The train runs on Saturdays.", "The train runs on Mondays."),
)

Claims = dict[str, list[tuple[str, str]]]  # label -> [(phenomenon, hypothesis)]


def _day(d: date) -> str:
    return f"{d.day} {MONTHS[d.month - 1]} {d.year}"


def _clock(minutes: int) -> str:
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"


def _count(delta: timedelta) -> str:
    return f"{delta.days} day{'s' if delta.days != 1 else ''}"


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _other(rng: random.Random, choices: tuple, *taken) -> object:
    return rng.choice([c for c in choices if c not in taken])


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"


def orders(rng: random.Random) -> tuple[str, Claims]:
    """An order confirmation: quantity, total, placed and shipped dates, carrier, destination."""
    name, number = _person(rng), rng.randint(10000, 99999)
    item, items = rng.choice(ITEMS)
    qty = rng.randint(2, 9)
    unit = rng.choice((12, 19, 24, 35, 48, 59, 75))
    placed = date(2025, 1, 1) + timedelta(days=rng.randint(0, 330))
    shipped = placed + timedelta(days=rng.randint(1, 4))
    carrier, city = rng.choice(CARRIERS), rng.choice(CITIES)
    premise = (
        f"Order #{number} was placed by {name} on {_day(placed)} for {qty} {items} at {unit} EUR each, "
        f"{qty * unit} EUR in total. It shipped on {_day(shipped)} with {carrier} to an address in {city}."
    )
    first = name.split()[0]
    return premise, {
        "entailment": [
            ("paraphrase", f"{first} ordered {qty} {items}."),
            ("paraphrase", f"Order #{number} was sent with {carrier}."),
            ("paraphrase", f"The order is going to {city}."),
            ("arithmetic", f"The {items} in order #{number} cost {qty * unit} EUR altogether."),
            ("temporal inference", f"Order #{number} shipped {_count(shipped - placed)} after it was placed."),
        ],
        "neutral": [
            ("unsupported detail", f"Order #{number} was delivered on {_day(shipped + timedelta(days=2))}."),
            ("unsupported detail", f"{first} paid for order #{number} by credit card."),
            ("unsupported detail", f"Order #{number} qualified for free shipping."),
            ("unsupported detail", f"{first} has ordered from this shop before."),
            ("unsupported detail", f"The {item} in order #{number} was gift-wrapped."),
        ],
        "contradiction": [
            ("number", f"{first} ordered {qty + rng.randint(1, 3)} {items}."),
            ("date", f"Order #{number} shipped on {_day(shipped + timedelta(days=rng.randint(3, 20)))}."),
            ("swapped entity", f"Order #{number} was sent with {_other(rng, CARRIERS, carrier)}."),
            ("negation", f"Order #{number} has not shipped yet."),
            ("number", f"Order #{number} cost {qty * unit + rng.choice((10, 25, 40))} EUR in total."),
        ],
    }


def products(rng: random.Random) -> tuple[str, Claims]:
    """A product spec sheet: weight, battery life, warranty, colours."""
    brand, (product, weights) = rng.choice(BRANDS), rng.choice(PRODUCTS)
    model = f"{brand} {rng.choice('ABCDEFGHKMXZ')}{rng.randint(2, 9)}{rng.choice(('', ' Pro', ' Air', ' Lite'))}"
    grams = rng.choice(weights)
    hours = rng.choice((8, 10, 12, 15, 18, 20, 24, 30))
    years = rng.randint(1, 3)
    colour1, colour2 = rng.sample(COLOURS, 2)
    premise = (
        f"The {model} is a {product} that weighs {grams} g. Its battery lasts up to {hours} hours on a "
        f"single charge. It comes with a {years}-year warranty and is sold in {colour1} and {colour2}."
    )
    plural = "s" if years > 1 else ""
    return premise, {
        "entailment": [
            ("paraphrase", f"The {model} weighs {grams} grams."),
            ("paraphrase", f"One charge of the {model} gives up to {hours} hours of use."),
            ("paraphrase", f"You can buy the {model} in {colour2}."),
            ("paraphrase", f"The {model} is covered by a warranty of {years} year{plural}."),
            ("comparison", f"The {model} weighs less than {grams + 10 * rng.randint(1, 9)} g."),
        ],
        "neutral": [
            ("unsupported detail", f"The {model} is waterproof."),
            ("unsupported detail", f"The {model} is made in {rng.choice(COUNTRIES)}."),
            ("unsupported detail", f"The {model} charges fully in {rng.choice((45, 60, 90))} minutes."),
            ("unsupported detail", f"The {model} comes with a carrying case."),
            ("unsupported detail", f"The {model} is the lightest {product} {brand} makes."),
        ],
        "contradiction": [
            ("number", f"The {model} weighs {grams * 2 + rng.choice((15, 40, 90))} g."),
            ("number", f"The battery of the {model} lasts up to {hours + rng.choice((6, 10, 16))} hours."),
            ("negation", f"The {model} is sold without any warranty."),
            ("swapped entity", f"The {model} is only available in {_other(rng, COLOURS, colour1, colour2)}."),
            ("number", f"The {model} has a warranty of {years + 2} years."),
        ],
    }


def schedules(rng: random.Random) -> tuple[str, Claims]:
    """A timetable entry: departure, arrival, platform, days of operation."""
    service = rng.choice(SERVICES)
    origin, destination = rng.sample(CITIES, 2)
    depart = rng.randint(5 * 60, 20 * 60) // 5 * 5
    duration = rng.choice((45, 70, 95, 130, 165, 210))
    platform = rng.randint(1, 12)
    days, runs, not_runs = rng.choice(DAY_RULES)
    premise = (
        f"The {service} from {origin} to {destination} leaves at {_clock(depart)} from platform {platform} "
        f"and arrives at {_clock(depart + duration)}. It runs {days}."
    )
    hours, minutes = divmod(duration, 60)
    length = f"{hours} h {minutes:02d} min" if hours else f"{minutes} minutes"
    return premise, {
        "entailment": [
            ("paraphrase", f"The train to {destination} departs at {_clock(depart)}."),
            ("paraphrase", f"The {service} reaches {destination} at {_clock(depart + duration)}."),
            ("arithmetic", f"The trip from {origin} to {destination} takes {length}."),
            ("paraphrase", f"The train to {destination} leaves from platform {platform}."),
            ("inference", runs),
        ],
        "neutral": [
            ("unsupported detail", f"The {service} to {destination} has a dining car."),
            ("unsupported detail", f"A ticket from {origin} to {destination} costs {rng.randint(9, 60)} EUR."),
            ("unsupported detail", f"The {service} to {destination} is usually on time."),
            ("unsupported detail", f"The train stops in {_other(rng, CITIES, origin, destination)} on the way."),
            ("unsupported detail", f"Seat reservations are required on the {service} to {destination}."),
        ],
        "contradiction": [
            ("time", f"The train to {destination} departs at {_clock(depart + rng.choice((20, 45, 90)))}."),
            ("number", f"The train to {destination} leaves from platform {platform + rng.randint(1, 4)}."),
            ("time", f"The {service} reaches {destination} at {_clock(depart + duration + rng.choice((25, 60)))}."),
            ("negation", not_runs),
            ("arithmetic", f"The trip from {origin} to {destination} takes {duration + 60} minutes."),
        ],
    }


def policies(rng: random.Random) -> tuple[str, Claims]:
    """A store's return policy: window, restocking fee, refund method, sale items."""
    store = rng.choice(STORES)
    window = rng.choice((14, 21, 30, 45, 60))
    fee = rng.choice((5, 10, 15, 20))
    sale_final = rng.random() < 0.5
    sale = (
        "Items bought on sale are final and cannot be returned." if sale_final
        else "Items bought on sale can be returned for store credit only."
    )
    premise = (
        f"{store} accepts returns only within {window} days of delivery. Refunds for full-price items go back "
        f"to the original payment method, and a restocking fee of {fee}% applies to opened items. {sale}"
    )
    sale_true = "Sale items cannot be returned." if sale_final else "Sale items are refunded only as store credit."
    sale_false = (
        "Sale items can be returned for store credit." if sale_final
        else "Sale items are refunded to the original payment method."
    )
    return premise, {
        "entailment": [
            ("paraphrase", f"At {store} you have {window} days after delivery to return an item."),
            ("paraphrase", f"{store} charges {fee}% to restock an opened item."),
            ("inference",
             f"An unopened item returned to {store} {window - 5} days after delivery is within the window."),
            ("paraphrase", f"A full-price item returned to {store} is refunded to the payment method used."),
            ("paraphrase", sale_true),
        ],
        "neutral": [
            ("unsupported detail", f"{store} requires returns to be in the original packaging."),
            ("unsupported detail", f"{store} pays for return shipping."),
            ("unsupported detail", f"{store} processes refunds within five business days."),
            ("unsupported detail", f"{store} allows exchanges for a different size."),
            ("unsupported detail", f"{store} does not accept returns of gift cards."),
        ],
        "contradiction": [
            ("number", f"At {store} you have {window + rng.choice((15, 30))} days after delivery to return an item."),
            ("negation", f"{store} takes back opened items without any fee."),
            ("inference", f"{store} accepts a return made {window + 10} days after delivery."),
            ("swapped entity", f"{store} refunds full-price items as store credit only."),
            ("negation", sale_false),
        ],
    }


def people_places(rng: random.Random) -> tuple[str, Claims]:
    """A short biography or a gazetteer entry (alternating by a coin flip)."""
    if rng.random() < 0.5:
        name, job, org = _person(rng), rng.choice(JOBS), rng.choice(ORGS)
        born, home, now = rng.randint(1955, 1998), rng.choice(CITIES), rng.choice(CITIES)
        since = born + rng.randint(22, 26)
        first = name.split()[0]
        premise = (
            f"{name} was born in {home} in {born}. {first} has worked as {_a(job)} at {org} since {since} "
            f"and lives in {now}."
        )
        return premise, {
            "entailment": [
                ("paraphrase", f"{first} was born in {born}."),
                ("paraphrase", f"{name} is employed by {org}."),
                ("comparison", f"{first} was born before {born + 3}."),
                ("paraphrase", f"{name}'s birthplace is {home}."),
                ("temporal inference", f"{first} joined {org} in {since} or earlier."),
            ],
            "neutral": [
                ("unsupported detail", f"{first} studied at a university in {home}."),
                ("unsupported detail", f"{name} is married."),
                ("unsupported detail", f"{first} speaks three languages."),
                ("unsupported detail", f"{first} was promoted at {org} last year."),
                ("unsupported detail", f"{name} plans to retire soon."),
            ],
            "contradiction": [
                ("date", f"{first} was born in {born + rng.randint(2, 9)}."),
                ("swapped entity", f"{name} was born in {_other(rng, CITIES, home)}."),
                ("temporal inference", f"{first} was born after {since}."),
                ("date", f"{first} started working at {org} in {since + rng.randint(2, 8)}."),
                ("negation", f"{first} has never worked at {org}."),
            ],
        }
    town, river, city = rng.choice(TOWNS), rng.choice(RIVERS), rng.choice(CITIES)
    km, people, feature = rng.randint(12, 80), rng.choice((4000, 9000, 15000, 27000, 42000)), rng.choice(FEATURES)
    premise = (
        f"{town} is a town on the river {river}, {km} km north of {city}. About {people:,} people live "
        f"there, and it is known for its {feature}."
    )
    return premise, {
        "entailment": [
            ("paraphrase", f"{town} lies north of {city}."),
            ("paraphrase", f"{town} lies on the river {river}."),
            ("comparison", f"{town} is less than {km + 20} km from {city}."),
            ("paraphrase", f"{town} has a population of roughly {people:,}."),
            ("paraphrase", f"{town} is famous for its {feature}."),
        ],
        "neutral": [
            ("unsupported detail", f"{town} has a railway station."),
            ("unsupported detail", f"{town} was founded in the twelfth century."),
            ("unsupported detail", f"{town} is the largest town on the {river}."),
            ("unsupported detail", f"Tourism is the main industry in {town}."),
            ("unsupported detail", f"{town} is twinned with {city}."),
        ],
        "contradiction": [
            ("swapped entity", f"{town} lies south of {city}."),
            ("number", f"{town} is {km * 2 + 15} km from {city}."),
            ("number", f"More than {people * 3:,} people live in {town}."),
            ("negation", f"{town} is not on a river."),
            ("number", f"{town} has fewer than {people // 4:,} inhabitants."),
        ],
    }


DOMAINS: tuple[tuple[str, Callable[[random.Random], tuple[str, Claims]]], ...] = (
    ("orders", orders),
    ("products", products),
    ("schedules", schedules),
    ("policies", policies),
    ("people_places", people_places),
)


def _scenario(rng: random.Random, domain: str, make: Callable, index: int, offsets: dict[str, int], split: str,
              seen: set) -> list[dict]:
    """One scenario of `domain`: a passage and one claim of every label, the claims' templates rotated by `index`."""
    premise, claims = make(rng)
    records = []
    for label, short in (("entailment", "ent"), ("neutral", "neu"), ("contradiction", "con")):
        options = claims[label]
        phenomenon, hypothesis = options[(index + offsets[label]) % len(options)]
        key = (premise, hypothesis)
        if key in seen:
            raise AssertionError(f"duplicate pair generated: {key}")
        seen.add(key)
        records.append({
            "id": f"nli-{domain}-{index:03d}-{short}", "domain": domain, "phenomenon": phenomenon,
            "premise": premise, "hypothesis": hypothesis, "label": label, "split": split,
        })
    return records


def build_records(seed: int = SEED) -> list[dict]:
    """Every pair of the set as a JSON-able record, in a fixed order: each domain's train, calibration and test
    scenarios, then each domain's reserve ones."""
    rng = random.Random(seed)
    records, seen, offsets = [], set(), {}
    for domain, make in DOMAINS:
        splits = [name for name, count in SPLIT_PLAN for _ in range(count)]  # one per scenario
        rng.shuffle(splits)
        offsets[domain] = {label: rng.randrange(5) for label in ("entailment", "neutral", "contradiction")}
        for index in range(SCENARIOS_PER_DOMAIN):
            records += _scenario(rng, domain, make, index, offsets[domain], splits[index], seen)
    passages = {record["premise"] for record in records}
    for domain, make in DOMAINS:  # last, so that drawing them changed none of the pairs before
        for index in range(SCENARIOS_PER_DOMAIN, SCENARIOS_PER_DOMAIN + RESERVE_SCENARIOS):
            drawn = _scenario(rng, domain, partial(_new_passage, make, passages), index, offsets[domain],
                              RESERVE_SPLIT, seen)
            passages.add(drawn[0]["premise"])
            records += drawn
    return records


def _new_passage(make: Callable, passages: set[str], rng: random.Random) -> tuple[str, Claims]:
    """A scenario of `make` whose passage is none of `passages` (drawn again until it is): no passage of the reserve
    appears in another split."""
    while True:
        premise, claims = make(rng)
        if premise not in passages:
            return premise, claims


def render(records: list[dict]) -> bytes:
    """The JSONL bytes: one sorted-key object per line, UTF-8, trailing newline."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def main(argv: list[str] | None = None) -> None:
    """Write the set to --out (default validation/data/nli.jsonl)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    data = render(build_records())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"wrote {data.count(NEWLINE)} pairs to {args.out}")


if __name__ == "__main__":
    main()
