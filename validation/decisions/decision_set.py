"""The project's own JevBench-format decision set, written deterministically from templates.

Run `python -m shiplift.validation.decisions.decision_set --out validation/data/decisions.jsonl`. Every task has
one answer a careful reader would agree with; slot values and option order come from an RNG
seeded per task id, so regenerating gives identical bytes. About 40 % of each
(family, expected label) stratum is the `calibration` split, the rest `test`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from shiplift.validation.decisions.jevbench import parse_task

SEED = "shiplift-decisions-v1"
CALIBRATION_SHARE = 0.4
DEFAULT_OUT = Path(__file__).parents[1] / "data" / "decisions.jsonl"

SLOTS: dict[str, list[str]] = {
    "name": ["Anna", "Ben", "Carla", "David", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko", "Luis"],
    "item": ["lamp", "kettle", "backpack", "blender", "jacket", "headset", "toaster", "desk chair", "camera",
             "speaker"],
    "service": ["StreamBox", "FitLife", "NewsDaily", "CloudNotes", "MusicGo"],
    "card": ["Visa", "Mastercard", "Amex"],
    "order": ["#4821", "#7730", "#1094", "#5562", "#3317", "#9048"],
    "day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "city": ["Lisbon", "Oslo", "Vienna", "Dublin", "Madrid", "Prague", "Warsaw", "Athens"],
    "color": ["red", "blue", "green", "white", "black", "yellow"],
    "pet": ["dog", "cat", "rabbit", "parrot", "hamster"],
    "job": ["teacher", "nurse", "baker", "pilot", "lawyer", "plumber"],
    "language": ["English", "French", "German", "Spanish", "Italian", "Japanese"],
}

CHOICE_FAMILIES: list[dict[str, Any]] = [
    {
        "family": "intent",
        "instructions": "Which request is the customer making?",
        "criteria": {
            "password_reset": "Cannot log in or wants to reset or change the account password",
            "cancel_subscription": "Wants to end a subscription or membership",
            "refund": "Wants money back for a purchase or a charge",
            "delivery_status": "Asks where a shipment is or when it will arrive",
            "update_payment_method": "Wants to change the card or payment method on file",
        },
        "states": {
            "password_reset": [
                "I forgot my password and can't log in. How do I reset it?",
                "The login page says my password is wrong. Please help me set a new password.",
                "Can you send me a password reset link? I'm locked out of my account.",
                "I need to change my password, I think someone else knows it.",
                "My account got locked after too many wrong password attempts. How do I get back in?",
                "The password reset email never arrived. Can you resend it so I can log in?",
                "How do I reset my password for the {service} app?",
                "I can't remember the password for my account, please help me reset it.",
            ],
            "cancel_subscription": [
                "Please cancel my {service} subscription, I don't use it anymore.",
                "How do I end my membership? I don't want to be billed next month.",
                "I'd like to stop my monthly plan starting today.",
                "Cancel my premium plan, please. I'm done with it.",
                "I want to unsubscribe from {service} and close my membership.",
                "Please end my subscription before the next renewal date.",
                "I no longer need the yearly membership. Please cancel it.",
                "Stop my subscription now, I'm switching to another provider.",
            ],
            "refund": [
                "The {item} I bought doesn't fit. I want my money back.",
                "I was charged twice for order {order}. Please refund the extra charge.",
                "I returned the {item} last week. When will I get my money back?",
                "The concert was cancelled, so I'd like a refund for my tickets.",
                "Please give me a refund for the {item}; I sent it back yesterday.",
                "I was billed for a product I never ordered. Please return my money.",
                "I want a full refund for order {order}.",
                "Refund the {item} please; I changed my mind and returned it.",
            ],
            "delivery_status": [
                "Where is my {item}? I ordered it on {day}.",
                "When will order {order} arrive?",
                "Can you tell me the tracking status of my parcel?",
                "My package hasn't shown up yet. Where is it now?",
                "Has order {order} been shipped yet?",
                "What's the expected delivery date for my {item}?",
                "The tracking page hasn't updated in three days. Where is my shipment?",
                "Is my {item} still on its way? It was supposed to come on {day}.",
            ],
            "update_payment_method": [
                "My credit card expired. How do I add the new one to my account?",
                "I want to pay with PayPal instead of my card from now on.",
                "Please replace the card on file with my new {card} card.",
                "How can I change the payment method for my future orders?",
                "I got a new bank card; I need to update my billing details.",
                "Remove my old debit card and use my {card} card for payments.",
                "Can I switch my payment method from card to bank transfer?",
                "Update the card number saved in my account, please.",
            ],
        },
    },
    {
        "family": "sentiment",
        "instructions": "What is the overall sentiment of this product review?",
        "criteria": {
            "positive": "The reviewer is pleased or happy with the product",
            "negative": "The reviewer is unhappy or disappointed with the product",
            "neutral": "The reviewer only states facts and expresses no feeling either way",
        },
        "states": {
            "positive": [
                "I love this {item}! It works perfectly and arrived early.",
                "Absolutely fantastic quality. Best purchase I've made this year.",
                "Great value for the price, I'm very happy with it.",
                "The {item} is excellent. I would definitely buy it again.",
                "Wonderful! My kids adore it and it's so easy to use.",
                "Superb build quality and it looks beautiful in my home.",
                "Five stars. It does exactly what I wanted and more.",
                "Really impressed: fast, quiet and reliable. Highly recommended.",
                "This {item} made my mornings so much better. Love it.",
                "Brilliant product, friendly seller, perfect condition. Thank you!",
            ],
            "negative": [
                "Terrible. The {item} broke after two days.",
                "Complete waste of money, I regret buying it.",
                "Very disappointed: it's flimsy and doesn't work as described.",
                "Awful quality. It stopped charging within a week.",
                "The worst {item} I have ever owned. Avoid it.",
                "It arrived dirty and scratched, and the seller ignored me. Horrible.",
                "Poorly made and far too loud. I hate using it.",
                "One star. It never worked, not even once.",
                "Cheap plastic that cracked the first time I used it. So frustrating.",
                "I'm really unhappy with this {item}; it's slow and keeps failing.",
            ],
            "neutral": [
                "The {item} is {color} and comes in a cardboard box.",
                "It arrived on {day}. I have not used it yet.",
                "The package contains the {item}, a cable and a manual.",
                "It weighs about two kilograms and is 30 centimetres tall.",
                "The {item} is made of plastic and runs on two AA batteries.",
                "I bought this for my office. It is the standard size.",
                "The box says it is made in Portugal. The colour is grey.",
                "It comes with a one-year warranty and a user guide.",
                "The {item} has two buttons and a small display.",
                "Delivered in one package. Assembly instructions are included.",
            ],
        },
    },
    {
        "family": "topic",
        "instructions": "Which topic is this text mainly about?",
        "criteria": {
            "sports": "Games, athletes, teams or competitions",
            "weather": "Rain, temperature, storms or forecasts",
            "cooking": "Recipes, food preparation or kitchen techniques",
            "technology": "Computers, phones, software or gadgets",
        },
        "states": {
            "sports": [
                "The home team won the final 3-1 after a late goal in the second half.",
                "She set a new national record in the 400 metre race on {day}.",
                "The tennis match went to five sets before the champion finally won.",
                "Our basketball team has won six games in a row this season.",
                "The marathon in {city} starts at 8 am and ten thousand runners have registered.",
                "The striker was transferred to a rival club for a record fee.",
                "The cyclist crossed the finish line first and took the yellow jersey.",
                "The coach praised the goalkeeper after the penalty shootout.",
            ],
            "weather": [
                "Heavy rain is expected tomorrow with strong winds along the coast.",
                "Temperatures will drop below freezing tonight, so expect ice on the roads.",
                "A heat wave will bring highs of 38 degrees to {city} this week.",
                "Snow is forecast for the mountains on {day}, up to 30 centimetres.",
                "The storm brought thunder and hail to the city last night.",
                "Skies will be sunny and clear all weekend with light winds.",
                "Thick fog will make visibility poor in the early morning hours.",
                "The forecast says showers in the morning and sunshine later.",
            ],
            "cooking": [
                "Whisk the eggs with sugar, fold in the flour and bake for 25 minutes.",
                "Fry the onions in olive oil until golden, then add the garlic.",
                "Let the bread dough rise for an hour before shaping it.",
                "Simmer the tomato sauce for twenty minutes and season it with basil.",
                "Marinate the chicken overnight, then grill it over high heat.",
                "Boil the pasta in salted water until it is al dente.",
                "Chop the vegetables finely and stir-fry them in a hot wok.",
                "Melt the butter, add the chocolate and stir until smooth.",
            ],
            "technology": [
                "The new phone has a faster processor and a bigger battery.",
                "Update your laptop's operating system to fix the security bug.",
                "The app crashes when I upload a photo from my tablet.",
                "This software backs up your computer files to the cloud.",
                "The company released a new graphics card for gaming PCs.",
                "Restart the router if your Wi-Fi keeps disconnecting.",
                "The smartwatch syncs with your phone over Bluetooth.",
                "Programmers fixed a bug in the latest version of the web browser.",
            ],
        },
    },
]

FACT_CRITERIA = {
    "true": "The text clearly states that this is the case.",
    "false": "The text clearly states something different.",
}

# Each fact template: a state with a slot, the question about that slot, and the slot's pool.
# A "yes" task asks about the value the state holds; a "no" task asks about a different one.
FACT_TEMPLATES: list[dict[str, str]] = [
    {"key": "meeting", "slot": "day", "state": "The meeting with {name} is on {day} at 10 am.",
     "question": "Based only on the text, is the meeting on {ask}?"},
    {"key": "price", "slot": "price", "state": "The {item} costs {price} euros.",
     "question": "Based only on the text, does the {item} cost {ask} euros?"},
    {"key": "car", "slot": "color", "state": "{name} drives a {color} car.",
     "question": "Based only on the text, is {name}'s car {ask}?"},
    {"key": "home", "slot": "city", "state": "{name} lives in {city} and works as a {job}.",
     "question": "Based only on the text, does {name} live in {ask}?"},
    {"key": "pet", "slot": "pet", "state": "{name}'s only pet is a {pet}.",
     "question": "Based only on the text, is {name}'s only pet a {ask}?"},
    {"key": "platform", "slot": "platform", "state": "The train to {city} leaves from platform {platform}.",
     "question": "Based only on the text, does the train to {city} leave from platform {ask}?"},
    {"key": "delivery", "slot": "day", "state": "Order {order} was delivered on {day}.",
     "question": "Based only on the text, was order {order} delivered on {ask}?"},
    {"key": "book", "slot": "language", "state": "The book {name} is reading is written in {language}.",
     "question": "Based only on the text, is the book written in {ask}?"},
    {"key": "job", "slot": "job", "state": "{name} has worked as a {job} for ten years.",
     "question": "Based only on the text, does {name} work as a {ask}?"},
    {"key": "closing", "slot": "hour", "state": "The pharmacy opens at 8 am and closes at {hour} pm.",
     "question": "Based only on the text, does the pharmacy close at {ask} pm?"},
]
FACT_NUMBER_SLOTS = {"price": ["12", "25", "40", "75", "150"], "platform": ["1", "3", "5", "7", "9"],
                     "hour": ["5", "6", "7", "8", "9"]}
FACT_PATTERN = ("yes", "no", "no", "yes")  # per template: 2 yes + 2 no

URGENCY = {
    "instructions": "How urgent is this IT support ticket?",
    "criteria": [
        "Not urgent: a question, wish or thanks; nothing is broken",
        "Low: a minor problem with an easy workaround; it can wait a few days",
        "High: one person or one team cannot do their work; fix it today",
        "Critical: a system is down for everyone, or data or safety is at risk; fix it now",
    ],
    "states": [
        [
            "Just wanted to say thanks for fixing my printer last week!",
            "Could you tell me how to change my desktop background?",
            "Suggestion: it would be nice to have a dark theme on the intranet.",
            "Where can I find the guide for the new expense tool? No rush.",
            "Is there a spreadsheet training session next month?",
            "What is the name of the guest Wi-Fi network?",
            "Which keyboard models can we order next quarter? Just planning ahead.",
            "Thanks, the laptop you set up for me works great.",
            "Could I get a second monitor some day? Mine works fine, it's just a wish.",
            "How do I add a signature to my email? Whenever you have time.",
        ],
        [
            "The printer on floor 2 is jammed; I'm using the one on floor 3 for now.",
            "My mouse is a bit laggy sometimes, but I can still work.",
            "One key on my keyboard sticks now and then. Not a big deal.",
            "The spell checker in my email stopped working; I can still send emails.",
            "The meeting room screen flickers a little, but presentations still work.",
            "My calendar shows holidays in the wrong colour.",
            "The shared drive is a little slow today, but files still open.",
            "My second monitor sometimes goes dark for a second, then comes back.",
            "The intranet font looks odd in my browser, but I can read everything.",
            "My laptop fan is louder than usual; everything else works.",
        ],
        [
            "I can't log in to my computer at all, so I can't do any work today.",
            "Our team's shared drive is not accessible and we have a deadline this afternoon.",
            "My laptop won't turn on and I have a client presentation in two hours.",
            "The accounting team cannot open the invoicing software since this morning.",
            "My email stopped sending and receiving messages; I need it for work today.",
            "The VPN fails for our whole sales team, so they cannot reach customer files.",
            "The only printer in the shipping office is broken and we can't print today's labels.",
            "My account is locked and I can't access any work systems.",
            "The design team's software licence expired and nobody on the team can open their projects.",
            "My computer crashes every few minutes, so I cannot finish today's report.",
        ],
        [
            "The entire company website is down and no customer can place an order.",
            "All servers in the data centre are offline; nobody in the company can work.",
            "Ransomware is encrypting files on the shared server right now!",
            "The payment system is down in all stores and no sale can go through.",
            "Smoke is coming out of the server rack in the basement!",
            "The main database was deleted and the backups are failing; we are losing customer data.",
            "Every employee is locked out of every system after a security breach.",
            "The hospital's patient record system is offline for all doctors.",
            "Customer passwords have leaked online and attackers are logging in now.",
            "The production control system crashed and every factory has stopped.",
        ],
    ],
}


def _rng(task_id: str) -> random.Random:
    return random.Random(f"{SEED}:{task_id}")


def _fill(template: str, rng: random.Random) -> str:
    values = {name: rng.choice(pool) for name, pool in SLOTS.items()}
    return template.format(**values)


def _choice_tasks(spec: dict[str, Any]) -> list[dict[str, Any]]:
    family = spec["family"]
    tasks = []
    per_label = [(label, states) for label, states in spec["states"].items()]
    count = max(len(states) for _, states in per_label)
    for index in range(count):  # interleave labels so ids do not group by answer
        for label, states in per_label:
            task_id = f"shiplift-{family}-{len(tasks):03d}"
            rng = _rng(task_id)
            labels = list(spec["criteria"])
            rng.shuffle(labels)
            tasks.append({
                "id": task_id, "family": family, "group": None,
                "state": _fill(states[index], rng),
                "question": {"type": "choice", "instructions": spec["instructions"],
                             "criteria": dict(sorted(spec["criteria"].items()))},
                "labels": labels, "expected": label,
            })
    return tasks


def _fact_tasks() -> list[dict[str, Any]]:
    tasks = []
    pools = {**SLOTS, **FACT_NUMBER_SLOTS}
    for answer in FACT_PATTERN:
        for template in FACT_TEMPLATES:
            task_id = f"shiplift-fact-{len(tasks):03d}"
            rng = _rng(task_id)
            values = {name: rng.choice(pool) for name, pool in pools.items()}
            truth = values[template["slot"]]
            ask = truth if answer == "yes" else rng.choice([v for v in pools[template["slot"]] if v != truth])
            tasks.append({
                "id": task_id, "family": "fact", "group": f"shiplift-fact-{template['key']}",
                "state": template["state"].format(**values),
                "question": {"type": "noul", "instructions": template["question"].format(ask=ask, **values),
                             "criteria": FACT_CRITERIA},
                "labels": ["no", "yes"], "expected": answer,
            })
    return tasks


def _urgency_tasks() -> list[dict[str, Any]]:
    tasks = []
    levels = URGENCY["states"]
    for index in range(len(levels[0])):
        for level, states in enumerate(levels):
            task_id = f"shiplift-urgency-{len(tasks):03d}"
            tasks.append({
                "id": task_id, "family": "urgency", "group": None, "state": states[index],
                "question": {"type": "score", "instructions": URGENCY["instructions"],
                             "criteria": URGENCY["criteria"]},
                "labels": [str(i) for i in range(len(levels))], "expected": level,
            })
    return tasks


def _assign_splits(tasks: list[dict[str, Any]]) -> None:
    strata: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for task in tasks:
        strata.setdefault((task["family"], str(task["expected"])), []).append(task)
    for (family, label), members in sorted(strata.items()):
        order = sorted(members, key=lambda t: t["id"])
        random.Random(f"{SEED}:split:{family}:{label}").shuffle(order)
        cut = round(CALIBRATION_SHARE * len(order))
        for position, task in enumerate(order):
            task["split"] = "calibration" if position < cut else "test"


def build_decision_set() -> list[dict[str, Any]]:
    """All tasks of the project decision set as JevBench records, validated, in a fixed order."""
    tasks = [t for spec in CHOICE_FAMILIES for t in _choice_tasks(spec)]
    tasks += _fact_tasks() + _urgency_tasks()
    _assign_splits(tasks)
    for task in tasks:
        parse_task(task, where=task["id"])
    return tasks


def render_jsonl(tasks: list[dict[str, Any]]) -> bytes:
    """The JSONL bytes of tasks: one key-sorted compact object per line."""
    lines = [json.dumps(t, sort_keys=True, separators=(",", ":"), ensure_ascii=False) for t in tasks]
    return ("\n".join(lines) + "\n").encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    """CLI: write the decision set to --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output JSONL path")
    args = parser.parse_args(argv)
    tasks = build_decision_set()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(render_jsonl(tasks))
    print(f"wrote {len(tasks)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
