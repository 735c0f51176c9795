"""`make bench-gate`: the gate's measured error rates on seeded candidates with known truth (issue 45 item 3).

    .venv/bin/python -m bench.gate_error_rates [--candidates 200] [--seed 0] [--base gemma] [--json]
        [--configs PATH ...] [--extension/--no-extension] [--batch N] [--reserve N] [--cross-check 1]
        [--ece-margin 0.05] [--p95-ratio 1.5] [--margins gemma-decision.yaml=0.08 ...] [--suggest]

For every example config (configs/releases/*.yaml, loaded with `tasks.config`; configs whose gate is the same, the
same tasks and champion rule, are judged once), each candidate of `bench.gate_corpus` is judged by the champion checks
exactly as `validation.gates` judges them, and, where the accuracy check ends inconclusive and the config extends
(`validation.inconclusive.choice: extend`), by `validation.sequential.sequential_champion_check` over paired tasks drawn
from the reserve pool, as many as the config's extension may score (its `max_tasks`, capped by its reserve's size: 120
JevBench tasks for the decision configs, the NLI set's 75 reserve pairs for the NLI ones) in its batches; a config
that does not extend is judged without (its extended column is its fixed one). Per check and candidate it
prints the share of pass / inconclusive / fail at the fixed size and after the extension, the false-promotion rate
(truly worse than the margin, promoted) or false-block rate (not worse, blocked or inconclusive), the mean tasks used,
and `validation.gate_power`'s exact P(pass) for the fixed-size accuracy check beside it.

Speed: the accuracy check's interval (`validation.metrics.paired_score_interval`, the one the gate takes) depends on a
candidate's discordant counts only, so it is computed once per distinct table; the ECE check's paired bootstraps are
computed for all candidates at once, from the same resamples `validation.metrics.paired_bootstrap` draws (its seeded
index stream as a count matrix); the checks' statuses come from `validation.gates` itself. `--cross-check K` runs
the real `validation.gates.evaluate_gates` on K candidates of every cell and counts any check whose status differs.
The absolute checks (`validation.thresholds`) are not run: they judge the candidate alone, and the recorded base
(Gemma-3-270M) is not the model every config ships.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from functools import lru_cache, partial
from pathlib import Path

import numpy as np

from bench.gate_corpus import DATA, Base, Draws, Pool, Spec, Truth, draw, load_base, standard_specs, truth
from shiplift.tasks.cli.gate_commands import gate_tasks
from shiplift.tasks.config import load_release_config
from shiplift.tasks.console import print_table
from shiplift.tasks.pipeline.stages.validate import run_settings
from shiplift.validation.gate_power import score_outcomes
from shiplift.validation.gates import Check, _champion_check, decide, evaluate_gates, ratio_check
from shiplift.validation.metrics import N_BINS, bin_index, paired_latency_ratio, paired_score_interval
from shiplift.validation.sequential import extension_looks, sequential_champion_check

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs" / "releases"
ECE_MARGIN, P95_RATIO = 0.05, 1.5  # judged where a config sets none (labelled so), so every check has numbers
MAX_FALSE_PROMOTION, MAX_FALSE_BLOCK = 0.05, 0.10  # the goal, with the extension on
INDIFFERENT = 0.1  # a true difference within this share of the margin counts as not worse
COLUMNS = ["candidate", "check", "truth", "fixed p/i/f", "fixed rate", "plan pass", "extended p/i/f", "extended rate",
           "tasks"]


@dataclass(frozen=True)
class Extension:
    """How a gate extends an inconclusive accuracy check: paired tasks per look, and the most reserve tasks it
    scores."""

    batch: int
    reserve: int


@dataclass(frozen=True)
class Setting:
    """One gate to measure: the configs that share it, its tasks, champion rule (with the bench's ECE margin and p95
    ratio where the config sets none), what it set itself, and its extension (None: its config does not extend)."""

    configs: tuple[str, ...]
    n: int
    rule: object  # validation.thresholds.ChampionRule
    ece_from_config: bool
    ratio_from_config: bool
    extension: Extension | None = None

    def describe(self) -> str:
        rule = self.rule
        parts = [f"{', '.join(self.configs)}: {self.n} tasks, margin {rule.margin:g}, min_samples {rule.min_samples}"]
        for label, value, own in (("ECE margin", rule.also_ece_margin, self.ece_from_config),
                                  ("p95 ratio", getattr(rule, "max_p95_ratio", None), self.ratio_from_config)):
            parts.append(f"no {label}" if value is None else
                         f"{label} {value:g}" + ("" if own else " (bench: the config sets none)"))
        ext = self.extension
        parts.append("no extension" if ext is None else
                     f"extends onto {ext.reserve} reserve tasks in batches of {ext.batch}")
        return ", ".join(parts)


def config_extension(config, config_dir: Path) -> Extension | None:
    """The config's own extension: its batch, and its `max_tasks` capped by the tasks its reserve holds (the family
    loads them, as the validate stage does); None when its inconclusive choice is not extend."""
    validation = config.validation
    if validation.inconclusive.choice != "extend":
        return None
    extend_settings = validation.inconclusive.extend
    reserve = config.family.reserve(validation, config_dir, run_settings(validation))
    return Extension(extend_settings.batch, min(extend_settings.max_tasks, len(reserve.tasks)))


def config_settings(paths: Sequence[Path], *, ece_margin: float | None, p95_ratio: float | None,
                    margins: dict[str, float]) -> list[Setting]:
    """Each config's gate (its test tasks as `shiplift gate plan` counts them, its champion rule), equal ones merged."""
    grouped: dict[tuple, list[str]] = {}
    for path in paths:
        config = load_release_config(path)
        rule = config.validation.champion
        if rule is None:
            continue
        updates = {}
        if path.name in margins:
            updates["margin"] = margins[path.name]
        if rule.also_ece_margin is None and ece_margin is not None:
            updates["also_ece_margin"] = ece_margin
        if (getattr(rule, "max_p95_ratio", None) is None and p95_ratio is not None
                and "max_p95_ratio" in type(rule).model_fields):
            updates["max_p95_ratio"] = p95_ratio
        key = (gate_tasks(config, path.parent), rule.model_copy(update=updates), rule.also_ece_margin is not None,
               getattr(rule, "max_p95_ratio", None) is not None, config_extension(config, path.parent))
        grouped.setdefault(key, []).append(path.name)

    def own(name: str) -> bool:
        """A config that extends none names its group."""
        lines = (CONFIGS / name).read_text(encoding="utf-8").splitlines()
        return not any(line.startswith("extends:") for line in lines)

    return [Setting(tuple(sorted(names, key=lambda name: (not (CONFIGS / name).is_file() or not own(name), name))),
                    n, rule, ece, ratio, extension) for (n, rule, ece, ratio, extension), names in grouped.items()]


def judged_extension(setting: Setting, *, on: bool, batch: int | None, reserve: int | None) -> Extension | None:
    """The extension the bench judges a gate with: its config's, with `batch` / `reserve` in its place where given;
    none when `on` is false or the config does not extend."""
    ext = setting.extension if on else None
    if ext is None:
        return None
    return Extension(batch or ext.batch, reserve or ext.reserve)


@lru_cache(maxsize=16)
def resample_counts(n: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """(n_bootstrap, n) times each of n rows is drawn in each resample of `validation.metrics.paired_bootstrap`
    (the same seeded stream: one `integers(0, n, size=n)` per resample)."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((n_bootstrap, n))
    for b in range(n_bootstrap):
        counts[b] = np.bincount(rng.integers(0, n, size=n), minlength=n)
    return counts


def _interval(samples: np.ndarray, confidence: float) -> np.ndarray:
    """Each row's percentile interval, as `validation.metrics._percentile_interval` takes it."""
    tail = (1.0 - confidence) / 2.0 * 100.0
    return np.percentile(samples, [tail, 100.0 - tail], axis=1).T


@lru_cache(maxsize=65536)
def score_interval(gained: int, lost: int, n: int, confidence: float) -> tuple[float, float]:
    """`validation.metrics.paired_score_interval` of one table, kept: candidates share tables."""
    low, high = paired_score_interval(gained, lost, n, confidence=confidence)
    return low, high


def paired_accuracy(draws: Draws, rule) -> list[dict]:
    """Every candidate's `paired_accuracy_difference` (n, difference, ci)."""
    cand, champ = draws.candidate_correct.astype(bool), draws.champion_correct.astype(bool)
    n = cand.shape[1]
    gained, lost = (cand & ~champ).sum(axis=1).tolist(), (champ & ~cand).sum(axis=1).tolist()
    return [{"n": n, "difference": (g - lost_k) / n, "ci": list(score_interval(g, lost_k, n, rule.confidence))}
            for g, lost_k in zip(gained, lost, strict=True)]


def ece_samples(confidence: np.ndarray, correct: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ECE of each candidate's tasks (rows of `confidence`, `correct`) and of each of its resamples:
    `expected_calibration_error` is Σ_bins |Σ correct − Σ confidence| / n, and a resample's per-bin sums are its
    counts times the tasks' values, so one product serves every candidate and resample."""
    k, n = confidence.shape
    gaps = np.zeros((k, n, N_BINS))
    np.put_along_axis(gaps, bin_index(confidence)[..., None], (correct - confidence)[..., None], axis=2)
    point = np.abs(gaps.sum(axis=1)).sum(axis=1) / n
    resampled = (counts @ gaps.transpose(1, 0, 2).reshape(n, k * N_BINS)).reshape(-1, k, N_BINS)
    return point, np.abs(resampled).sum(axis=2).T / n


def paired_ece(draws: Draws, rule) -> list[dict]:
    """Every candidate's `paired_ece_difference` (n, difference, ci) at once."""
    n = draws.tasks.shape[1]
    counts = resample_counts(n, rule.n_bootstrap, rule.seed)
    cand_point, cand = ece_samples(draws.candidate_confidence, draws.candidate_correct.astype(float), counts)
    champ_point, champ = ece_samples(draws.champion_confidence, draws.champion_correct.astype(float), counts)
    ci = _interval(cand - champ, rule.confidence)
    return [{"n": n, "difference": float(cand_point[i] - champ_point[i]), "ci": [float(ci[i, 0]), float(ci[i, 1])]}
            for i in range(len(ci))]


def latency_ratios(draws: Draws, rule) -> list[dict]:
    """Every candidate's `paired_latency_ratio` (the real function, on the rows' latencies and start times)."""
    pool, ratio = draws.pool, draws.spec.latency_ratio
    results = []
    for tasks in draws.tasks:
        idents = [f"t{j:05d}" for j in range(len(tasks))]
        champion = [{**pool.rows_a[t], "id": i} for i, t in zip(idents, tasks, strict=True)]
        candidate = [{**pool.rows_b[t], "id": i,
                      "latency_ms": pool.rows_b[t]["latency_ms"] * ratio * pool.latency_scale}
                     for i, t in zip(idents, tasks, strict=True)]
        results.append(paired_latency_ratio(candidate, champion, n_bootstrap=rule.n_bootstrap, seed=rule.seed,
                                            confidence=rule.confidence))
    return results


def judge(draws: Draws, rule) -> list[dict[str, str]]:
    """Each candidate's champion checks' statuses, by `validation.gates`' own rules, and the decision."""
    columns = {"champion_accuracy": [_champion_check("champion_accuracy", d, margin=rule.margin,
                                                     min_samples=rule.min_samples, higher_is_better=True)
                                     for d in paired_accuracy(draws, rule)]}
    if rule.also_ece_margin is not None:
        columns["champion_ece"] = [_champion_check("champion_ece", d, margin=rule.also_ece_margin,
                                                   min_samples=rule.min_samples, higher_is_better=False)
                                   for d in paired_ece(draws, rule)]
    if getattr(rule, "max_p95_ratio", None) is not None:
        columns["champion_p95_ratio"] = [ratio_check(r, max_ratio=rule.max_p95_ratio, min_samples=rule.min_samples)
                                         for r in latency_ratios(draws, rule)]
    judged = []
    for checks in zip(*columns.values(), strict=True):
        judged.append({**{c.name: c.status for c in checks}, "decision": decide(checks)})
    return judged


def extend(draws: Draws, reserve: Pool, judged: list[dict], rule, *, batch: int, max_tasks: int,
           rng: np.random.Generator) -> tuple[list[dict], list[int]]:
    """The way out of an inconclusive accuracy check: more paired tasks from the reserve, judged by the confidence
    sequence over every task so far (`validation.sequential`); the statuses after it and the tasks each gate used."""
    n = draws.tasks.shape[1]
    extra = draw(reserve, draws.spec, candidates=len(judged), n=max_tasks, rng=rng)
    first = draws.candidate_correct.astype(float) - draws.champion_correct.astype(float)
    more = extra.candidate_correct.astype(float) - extra.champion_correct.astype(float)
    looks = extension_looks(n, batch=batch, max_tasks=max_tasks)
    extended, used = [], []
    for k, statuses in enumerate(judged):
        if statuses["champion_accuracy"] != "inconclusive":
            extended.append(statuses)
            used.append(n)
            continue
        result = sequential_champion_check(np.concatenate([first[k], more[k]]), margin=rule.margin,
                                           confidence=rule.confidence, looks=looks)
        after = {**statuses, "champion_accuracy": result.status}
        checks = [Check(name=name, status=status, observed=None, threshold=None, comparator="", ci=None, n=0,
                        reason="") for name, status in after.items() if name != "decision"]
        extended.append({**after, "decision": decide(checks)})
        used.append(result.n)
    return extended, used


def check_truth(check: str, value: Truth, rule) -> tuple[str, str]:
    """("worse" | "not worse" | "between", the truth in words) of one candidate for one check: worse at or past the
    margin, not worse within a tenth of it (`INDIFFERENT`: flipping answers moves the ECE a little), else between."""
    if check == "champion_accuracy":
        gap, margin, text = value.shortfall, rule.margin, f"acc {-value.shortfall:+.3f}"
    elif check == "champion_ece":
        gap, margin, text = value.ece_difference, rule.also_ece_margin, f"ECE {value.ece_difference:+.3f}"
    else:
        gap, margin, text = value.p95_ratio - 1.0, rule.max_p95_ratio - 1.0, f"p95 x{value.p95_ratio:.2f}"
    eps = 1e-9
    verdict = "worse" if gap >= margin - eps else "not worse" if gap <= INDIFFERENT * margin + eps else "between"
    return verdict, text


def _rate(verdict: str, statuses: list[str]) -> str:
    """False promotion (worse, passed) or false block (not worse, not passed) of one column of statuses."""
    if verdict == "worse":
        return f"FP {statuses.count('pass') / len(statuses):.3f}"
    if verdict == "not worse":
        return f"FB {1 - statuses.count('pass') / len(statuses):.3f}"
    return "-"


def _shares(statuses: list[str]) -> str:
    total = len(statuses)
    return "/".join(f"{statuses.count(s) / total:.2f}" for s in ("pass", "inconclusive", "fail"))


def plan_pass(check: str, spec: Spec, n: int, rule) -> str:
    """`validation.gate_power`'s exact P(pass) of the fixed-size accuracy check for this candidate."""
    if check != "champion_accuracy":
        return ""
    if n < rule.min_samples:
        return "0.00"
    odds = score_outcomes(n=n, margin=rule.margin, disagreement=spec.disagreement, shortfall=spec.shortfall,
                          confidence=rule.confidence)
    return f"{odds['pass']:.2f}"


def measure(setting: Setting, base: Base, *, candidates: int, seed: int, extension: Extension | None,
            cross_check: int, index: int = 0, pool: Executor | None = None) -> dict:
    """Every corpus candidate of one gate, judged with `extension` (None: without), its cells on `pool`'s processes
    when given: per check its truth, the statuses' shares, rates, tasks used."""
    rule = setting.rule
    specs = standard_specs(rule.margin, ece_margin=rule.also_ece_margin, pool=base.main,
                           max_p95_ratio=getattr(rule, "max_p95_ratio", None))
    cell = partial(measure_cell, setting, base, candidates=candidates, extension=extension is not None,
                   batch=extension.batch if extension else 0, reserve=extension.reserve if extension else 0,
                   cross_check=cross_check)
    seeds = [[seed, index, s] for s in range(len(specs))]
    cells = list((pool.map if pool else map)(cell, specs, seeds))
    return {"setting": setting.describe(), "configs": list(setting.configs), "n": setting.n,
            "margin": rule.margin, "extension": None if extension is None else asdict(extension),
            "rows": [row for rows, _, _ in cells for row in rows],
            "cross_checked": sum(c for _, c, _ in cells), "cross_check_mismatches": sum(m for _, _, m in cells)}


def measure_cell(setting: Setting, base: Base, spec: Spec, seed: list[int], *, candidates: int, extension: bool,
                 batch: int, reserve: int, cross_check: int) -> tuple[list[dict], int, int]:
    """`candidates` gates of one spec: the rows of its checks and decision, and how many of its candidates the real
    `evaluate_gates` judged and judged differently."""
    rule = setting.rule
    rng = np.random.default_rng(seed)
    draws = draw(base.main, spec, candidates=candidates, n=setting.n, rng=rng)
    judged = judge(draws, rule)
    if extension:
        extended, used = extend(draws, base.reserve, judged, rule, batch=batch, max_tasks=reserve, rng=rng)
    else:
        extended, used = judged, [setting.n] * len(judged)
    checked = min(cross_check, candidates)
    mismatches = sum(cross_checked(draws, k, rule) != judged[k] for k in range(checked))
    value = truth(base.main, spec)
    rows, verdicts = [], {}
    for check in [c for c in judged[0] if c != "decision"]:
        verdict, text = check_truth(check, value, rule)
        verdicts[check] = verdict
        rows.append(_row(spec.label, check, verdict, text, judged, extended, used,
                         plan_pass(check, spec, setting.n, rule)))
    overall = ("worse" if "worse" in verdicts.values() else
               "not worse" if set(verdicts.values()) == {"not worse"} else "between")
    rows.append(_row(spec.label, "decision", overall, "", judged, extended, used, ""))
    return rows, checked, mismatches


def _row(label: str, check: str, verdict: str, text: str, judged: list[dict], extended: list[dict],
         used: list[int], plan: str) -> dict:
    fixed, after = [j[check] for j in judged], [e[check] for e in extended]
    return {"candidate": label, "check": check, "verdict": verdict, "truth": text or verdict,
            "fixed": {s: fixed.count(s) / len(fixed) for s in ("pass", "inconclusive", "fail")},
            "extended": {s: after.count(s) / len(after) for s in ("pass", "inconclusive", "fail")},
            "fixed p/i/f": _shares(fixed), "fixed rate": _rate(verdict, fixed), "plan pass": plan,
            "extended p/i/f": _shares(after), "extended rate": _rate(verdict, after),
            "tasks": f"{np.mean(used):.0f}", "mean_tasks": float(np.mean(used))}


def cross_checked(draws: Draws, k: int, rule) -> dict[str, str]:
    """Candidate k judged by the real `validation.gates.evaluate_gates` (no absolute thresholds)."""
    candidate, champion = draws.rows(k)
    report = evaluate_gates(candidate, thresholds=None, champion_preds=champion, champion_rule=rule)
    return {**{c.name: c.status for c in report.checks}, "decision": report.decision}


def worst(result: dict, column: str) -> dict[str, float]:
    """The largest false-promotion and false-block rate of the gate's decision over its candidates."""
    rows = [r for r in result["rows"] if r["check"] == "decision"]
    promoted = [r[column]["pass"] for r in rows if r["verdict"] == "worse"]
    blocked = [1 - r[column]["pass"] for r in rows if r["verdict"] == "not worse"]
    return {"false_promotion": max(promoted, default=0.0), "false_block": max(blocked, default=0.0)}


def suggest_margin(setting: Setting, base: Base, *, candidates: int, seed: int, extension: Extension | None,
                   grid: Sequence[float], pool: Executor | None = None) -> float | None:
    """The narrowest accuracy margin of `grid` whose gate, with `extension` (its own, or None), promotes a candidate
    worse by the margin (or twice it) at most 5 % of the time and blocks an equal one at the prior's 8 % disagreement
    (and 3 %) at most 10 %."""
    for margin in grid:
        rule = setting.rule.model_copy(update={"margin": margin, "also_ece_margin": None, "max_p95_ratio": None}
                                       if "max_p95_ratio" in type(setting.rule).model_fields else
                                       {"margin": margin, "also_ece_margin": None})
        trial = replace(setting, rule=rule)
        result = measure(trial, base, candidates=candidates, seed=seed, extension=extension, cross_check=0,
                         pool=pool)
        rates = worst(result, "extended")
        if rates["false_promotion"] <= MAX_FALSE_PROMOTION and rates["false_block"] <= MAX_FALSE_BLOCK:
            return margin
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gate_error_rates", description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=200, help="candidates per corpus cell (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    parser.add_argument("--base", default="gemma", help="recorded base model: gemma (default) or tiny")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="folder of the recorded outcomes (default: the committed ones)")
    parser.add_argument("--configs", nargs="*", type=Path, help="release configs (default: configs/releases/*.yaml)")
    parser.add_argument("--extension", action=argparse.BooleanOptionalAction, default=True,
                        help="extend an inconclusive accuracy check from the reserve where the config extends "
                             "(default on)")
    parser.add_argument("--batch", type=int,
                        help="reserve tasks per look of the extension (default: each config's extend.batch)")
    parser.add_argument("--reserve", type=int,
                        help="reserve tasks the extension may use (default: each config's extend.max_tasks, at most "
                             "its reserve's size)")
    parser.add_argument("--cross-check", type=int, default=1,
                        help="candidates per cell also judged by the real evaluate_gates (default 1)")
    parser.add_argument("--ece-margin", type=float, default=ECE_MARGIN,
                        help=f"ECE margin where a config sets none (default {ECE_MARGIN}; 0 turns it off)")
    parser.add_argument("--p95-ratio", type=float, default=P95_RATIO,
                        help=f"p95 ratio where a config sets none (default {P95_RATIO}; 0 turns it off)")
    parser.add_argument("--margins", nargs="*", default=[], metavar="CONFIG=MARGIN",
                        help="accuracy margins to judge instead of the configs' (e.g. gemma-decision.yaml=0.08)")
    parser.add_argument("--suggest", action="store_true",
                        help="also find each gate's narrowest margin meeting <= 5 %% false promotions and <= 10 %% "
                             "false blocks with the extension")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes judging the corpus cells (default 2, or 1 on a 1-core machine)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    try:
        margins = {name: float(value) for name, value in (item.split("=", 1) for item in args.margins)}
    except ValueError:
        parser.error("--margins takes CONFIG=MARGIN items, e.g. gemma-decision.yaml=0.08")
    started = time.perf_counter()
    base = load_base(args.base, args.data)
    paths = args.configs or sorted(CONFIGS.glob("*.yaml"))
    settings = config_settings(paths, ece_margin=args.ece_margin or None, p95_ratio=args.p95_ratio or None,
                               margins=margins)
    results = []
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        for index, setting in enumerate(settings):
            extension = judged_extension(setting, on=args.extension, batch=args.batch, reserve=args.reserve)
            result = measure(setting, base, candidates=args.candidates, seed=args.seed, extension=extension,
                             cross_check=args.cross_check, index=index, pool=pool)
            result["worst"] = {"fixed": worst(result, "fixed"), "extended": worst(result, "extended")}
            if args.suggest:
                result["suggested_margin"] = suggest_margin(
                    setting, base, candidates=args.candidates, seed=args.seed, extension=extension,
                    grid=[round(0.01 * k, 2) for k in range(1, 21)], pool=pool)
            results.append(result)
    summary = {"base": args.base, "provenance": base.provenance, "candidates": args.candidates, "seed": args.seed,
               "extension": {"on": args.extension, "batch": args.batch, "reserve": args.reserve},  # None: each config's
               "seconds": time.perf_counter() - started, "gates": results}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print_report(summary)
    return 0


def print_report(summary: dict) -> None:
    """The tables for people: per gate, per candidate and check; then the worst rates per gate."""
    ext = summary["extension"]
    sizes = ", ".join(f"{name} {ext[key]}" for name, key in (("reserve", "reserve"), ("batches of", "batch"))
                      if ext[key] is not None)
    print(f"gate error rates: {summary['candidates']} candidates per row, seed {summary['seed']}, base "
          f"{summary['base']}; extension {'on' if ext['on'] else 'off'} (each config's own"
          f"{'; all gates: ' + sizes if sizes else ''}); p/i/f = pass/inconclusive/fail; FP = false promotion (truly "
          f"worse, passed), FB = false block (not worse, not passed); plan pass = validation.gate_power's exact "
          f"P(pass)\n")
    for gate in summary["gates"]:
        print(gate["setting"])
        print_table(gate["rows"], COLUMNS)
        if gate["cross_checked"]:
            print(f"cross-check with validation.gates.evaluate_gates: {gate['cross_check_mismatches']} of "
                  f"{gate['cross_checked']} candidates judged differently")
        print()
    print_table([{"gate": g["configs"][0] + ("" if len(g["configs"]) == 1 else f" +{len(g['configs']) - 1}"),
                  "tasks": g["n"], "margin": f"{g['margin']:g}",
                  "FP fixed": f"{g['worst']['fixed']['false_promotion']:.3f}",
                  "FB fixed": f"{g['worst']['fixed']['false_block']:.3f}",
                  "FP extended": f"{g['worst']['extended']['false_promotion']:.3f}",
                  "FB extended": f"{g['worst']['extended']['false_block']:.3f}",
                  **({"suggested margin": g["suggested_margin"]} if "suggested_margin" in g else {})}
                 for g in summary["gates"]],
                ["gate", "tasks", "margin", "FP fixed", "FB fixed", "FP extended", "FB extended"]
                + (["suggested margin"] if any("suggested_margin" in g for g in summary["gates"]) else []))
    print(f"\n(worst decision over the gate's candidates; goal: FP <= {MAX_FALSE_PROMOTION:.0%}, FB <= "
          f"{MAX_FALSE_BLOCK:.0%} with the extension) {summary['seconds']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
