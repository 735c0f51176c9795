"""Hostile release configs: every input is a ConfigError naming file, place and fix, or a valid config; never a
traceback, a hang, an echoed secret or a limit that the server would refuse at start."""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families.gguf_decisions import SemifImage
from shiplift.tasks.families.onnx_nli import EncoderImage
from shiplift.tasks.secret_keys import looks_secret
from shiplift.tasks.yamlfile import MAX_DEPTH, MAX_EXPANDED_NODES, MAX_FILE_BYTES

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "configs" / "releases" / "gemma-decision.yaml"
GEMMA_TEXT = GEMMA.read_text(encoding="utf-8")
SECRET_VALUE = "hunter2-Zq8xW"


def write(tmp_path: Path, text: str | bytes, name: str = "hostile.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def refusal(path: Path, **kwargs) -> str:
    """The ConfigError message for a config that must be refused."""
    with pytest.raises(ConfigError) as caught:
        load_release_config(path, environ=kwargs.pop("environ", {}), **kwargs)
    message = str(caught.value)
    assert "fix:" in message
    return message


def with_line(text: str, after: str, line: str) -> str:
    """GEMMA-like text with `line` inserted after the first line starting with `after`."""
    lines = text.splitlines()
    index = next(i for i, current in enumerate(lines) if current.startswith(after))
    return "\n".join(lines[: index + 1] + [line] + lines[index + 1 :]) + "\n"


# --- bytes and size ---------------------------------------------------------------------


def test_a_non_utf8_byte_is_named_by_offset(tmp_path):
    raw = GEMMA_TEXT.encode("utf-8").replace(b"manual", b"man\xffual")
    path = write(tmp_path, raw)
    offset = raw.index(b"\xff")
    message = refusal(path)
    assert str(path) in message and "0xff" in message and f"offset {offset}" in message


def test_a_control_character_is_refused_with_its_position(tmp_path):
    message = refusal(write(tmp_path, GEMMA_TEXT.replace("manual", "man\x07ual")))
    assert "#x0007" in message


def test_a_file_over_the_size_limit_is_refused_before_parsing(tmp_path):
    path = write(tmp_path, GEMMA_TEXT + "#" * MAX_FILE_BYTES)
    assert "over the limit" in refusal(path)


# --- structure: nesting, aliases, duplicates ---------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "description: " + "[" * 5000 + "]" * 5000,
        "description:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(1200)) + " " * 1201 + "x\n",
        "description: " + "{a: " * 3000 + "1" + "}" * 3000,
    ],
    ids=["flow-lists", "block-mappings", "flow-mappings"],
)
def test_nesting_thousands_deep_is_refused_with_a_line(tmp_path, body):
    message = refusal(write(tmp_path, GEMMA_TEXT.replace("description:", "old_description:") + body + "\n"))
    assert f"nesting deeper than {MAX_DEPTH} levels" in message and "line " in message


@pytest.mark.timeout(10)
def test_billion_laughs_is_refused_by_counting_not_by_expanding(tmp_path):
    levels = ["a: &a [" + ",".join(["lol"] * 9) + "]"]
    for level in range(1, 9):
        previous, current = chr(ord("a") + level - 1), chr(ord("a") + level)
        levels.append(f"{current}: &{current} [" + ",".join([f"*{previous}"] * 9) + "]")
    body = "\n".join(levels) + "\n"
    assert len(body.encode()) < 2048, "the document of the issue: 2 KB, 9**9 values once expanded"
    message = refusal(write(tmp_path, "description: x\nname: y\n" + body))
    assert f"expand to more than {MAX_EXPANDED_NODES} values" in message


def test_an_alias_cycle_is_refused(tmp_path):
    message = refusal(write(tmp_path, GEMMA_TEXT + "loop: &loop [*loop]\n"))
    assert "loop[0] contains itself" in message


def test_shared_aliases_within_the_budget_are_fine(tmp_path):
    text = GEMMA_TEXT.replace("  dataset: {path: \"builtin:decisions\", splits: [calibration]}",
                              "  dataset: &calibration {path: \"builtin:decisions\", splits: [calibration]}")
    text = text.replace("    - path: \"builtin:decisions\"\n      splits: [test]", "    - *calibration")
    config = load_release_config(write(tmp_path, text), environ={})
    assert config.validation.datasets[0].splits == ["calibration"]


@pytest.mark.parametrize(
    "text, key",
    [
        (with_line(GEMMA_TEXT, "name:", "name: other"), "'name'"),
        (with_line(GEMMA_TEXT, "  threads:", "  threads: 8"), "'threads'"),
        (GEMMA_TEXT.replace("splits: [calibration]}", "splits: [calibration], path: x}"), "'path'"),
    ],
    ids=["top-level", "nested", "flow-mapping"],
)
def test_duplicate_keys_are_refused_not_last_wins(tmp_path, text, key):
    message = refusal(write(tmp_path, text))
    assert f"duplicate key {key}" in message and "line " in message


def test_a_merge_key_may_be_overridden_by_an_explicit_key(tmp_path):
    text = GEMMA_TEXT.replace("image:\n  kind: semif\n", "image:\n  <<: {kind: semif, threads: 1}\n  kind: semif\n")
    assert load_release_config(write(tmp_path, text), environ={}).image.threads == 2


# --- numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize("digits", [40, 5000])
def test_an_integer_with_many_digits_names_its_field(tmp_path, digits):
    message = refusal(write(tmp_path, GEMMA_TEXT.replace("  threads: 2", "  threads: " + "7" * digits)))
    assert f"image.threads is an integer of {digits} digits" in message


@pytest.mark.parametrize("literal", [".inf", "-.inf", ".nan", "1.0e+999"])
@pytest.mark.parametrize("field, line", [
    ("validation.thresholds.max_ece", "    max_ece: 0.30"),
    ("validation.concurrency", "  concurrency: 2"),
    ("description", "description: Gemma-3-270M Q4_K_M decision model, local backend demo"),
])
def test_non_finite_numbers_are_refused_by_field(tmp_path, literal, field, line):
    name = line.split(":")[0]
    message = refusal(write(tmp_path, GEMMA_TEXT.replace(line, f"{name}: {literal}")))
    assert f"{field} is " in message and "not a finite number" in message


@pytest.mark.parametrize("how", ["set", "environ"])
def test_non_finite_and_huge_override_values_are_refused_by_field(how):
    for value, words in ((".inf", "validation.thresholds.max_ece is inf"), ("9" * 5000, "integer of 5000 digits")):
        dotted = "validation.thresholds.max_ece"
        kwargs = ({"overrides": [f"{dotted}={value}"]} if how == "set"
                  else {"environ": {"SHIPLIFT_CONFIG__" + dotted.replace(".", "__"): value}})
        assert words in refusal(GEMMA, **kwargs)


@pytest.mark.parametrize(
    "line, replacement, field",
    [
        ("  threads: 2", "  threads: true", "image.threads"),
        ("  threads: 2", "  threads: '2'", "image.threads"),
        ("  threads: 2", "  threads: 2.0", "image.threads"),
        ("    max_ece: 0.30", "    max_ece: false", "validation.thresholds.max_ece"),
        ("  copies: 1", "  copies: yes", "rollout.copies"),
        ("  fit_temperature: false ", "  fit_temperature: 1 ", "calibration.fit_temperature"),
    ],
)
def test_no_coercion_between_booleans_numbers_and_strings(tmp_path, line, replacement, field):
    assert line in GEMMA_TEXT
    message = refusal(write(tmp_path, GEMMA_TEXT.replace(line, replacement)))
    assert field in message


# --- limits the server enforces at start -------------------------------------------------


def _bounds(model, name: str) -> tuple[int | None, int | None]:
    low = high = None
    for rule in model.model_fields[name].metadata:
        low = getattr(rule, "ge", low)
        high = getattr(rule, "le", high)
    return low, high


def _int_fields(model) -> list[str]:
    return [name for name, field in model.model_fields.items() if field.annotation is int]


@pytest.mark.parametrize("model", [SemifImage, EncoderImage], ids=["semif", "encoder"])
def test_every_integer_limit_is_bounded_on_both_sides(model):
    unbounded = [name for name in _int_fields(model) if None in _bounds(model, name)]
    assert unbounded == (["max_request_tokens"] if model is SemifImage else []), "bounded by max_tokens instead"


def _semif_model_env(tmp_path: Path) -> dict[str, str]:
    return {"SEMIF_GGUF_PATH": str(write(tmp_path, b"GGUF", "model.gguf"))}


def _encoder_model_env(tmp_path: Path) -> dict[str, str]:
    for name in ("model.onnx", "tokenizer.json"):
        write(tmp_path, b"", name)
    labels = {"0": "entailment", "1": "neutral", "2": "contradiction"}
    write(tmp_path, json.dumps({"id2label": labels, "max_position_embeddings": 1 << 20}), "config.json")
    return {"ENCODER_MODEL_DIR": str(tmp_path)}


@pytest.mark.parametrize("end", [0, 1], ids=["lowest", "highest"])
@pytest.mark.parametrize("model, model_env", [(SemifImage, _semif_model_env), (EncoderImage, _encoder_model_env)],
                         ids=["semif", "encoder"])
def test_the_server_starts_with_every_limit_the_config_accepts(tmp_path, server_modules, model, model_env, end):
    """Each integer at the end of its config range is accepted by the server's own start-up checks."""
    values = {name: _bounds(model, name)[end] for name in _int_fields(model) if _bounds(model, name)[end] is not None}
    if model is SemifImage:
        values["max_request_tokens"] = values["max_tokens"] if end else _bounds(model, "max_request_tokens")[0]
    image = model.model_validate({"kind": model.model_fields["kind"].annotation.__args__[0],
                                  "base_image": "base@sha256:" + "a" * 64, **values})
    server = server_modules[image.kind]
    settings_ = server.load_settings({**image.container_env(cpu_only=True), **model_env(tmp_path)})
    for name in ("max_body_bytes", "max_in_flight"):
        assert getattr(settings_.http, name) == values[name]


@pytest.mark.parametrize("line, replacement, field", [
    ("  max_in_flight: 4", "  max_in_flight: 4\n  max_body_bytes: 1073741825", "image.max_body_bytes"),
    ("  max_tokens: 2048", "  max_tokens: 2097152", "image.max_tokens"),
    ("  threads: 2", "  threads: 2\n  n_gpu_layers: 100001", "image.n_gpu_layers"),
])
def test_a_limit_the_server_would_refuse_is_refused_by_the_config(tmp_path, line, replacement, field):
    assert field in refusal(write(tmp_path, GEMMA_TEXT.replace(line, replacement)))


# --- secrets ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", [
    "aws_secret_access_key", "apiKey", "API-Key", "ApiKey", "dbPassword", "DB_PASSWORD", "SecretAccessKey",
    "x-auth-token", "sessionToken", "private.key", "github_pat_token", "pwd",
])
def test_secret_looking_keys_are_recognised_in_any_naming_style(tmp_path, key):
    assert looks_secret(key)
    path = write(tmp_path, GEMMA_TEXT.replace("backend:\n", f"backend:\n  {key}: {SECRET_VALUE}\n"))
    message = refusal(path)
    assert f"backend.{key}" in message and SECRET_VALUE not in message


@pytest.mark.parametrize("key", ["pass\u200bword", "api\u00adkey", "db\u2060Password", "tok\ufeffen",
                                 "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44"],
                         ids=["zero-width-space", "soft-hyphen", "word-joiner", "bom", "fullwidth"])
def test_invisible_characters_do_not_hide_a_secret_looking_key(tmp_path, key):
    """Issue 18: a format character (Unicode category Cf) between the letters, or a compatibility spelling, is removed
    or folded (NFKC) before the check, so the key is refused like its plain spelling and its value never echoed."""
    assert looks_secret(key)
    path = write(tmp_path, GEMMA_TEXT.replace("backend:\n", f"backend:\n  \"{key}\": {SECRET_VALUE}\n"))
    message = refusal(path)
    assert "keys that look like secrets are not allowed" in message and SECRET_VALUE not in message


@pytest.mark.parametrize("key",
                         ["max_request_tokens", "kms_key_id", "tokenizer", "key_prefix", "secretary",
                          "passwords_policy_url"])
def test_ordinary_keys_are_not_secrets(key):
    assert not looks_secret(key)


@pytest.mark.parametrize("how", ["set", "environ"])
@pytest.mark.parametrize("value", [SECRET_VALUE, f"[{SECRET_VALUE}", f"{{{SECRET_VALUE}: ]"],
                         ids=["plain", "bad-list", "bad-map"])
def test_a_secret_override_is_refused_by_key_and_never_echoed(how, value):
    kwargs = ({"overrides": [f"backend.apiToken={value}"]} if how == "set"
              else {"environ": {"SHIPLIFT_CONFIG__backend__apiToken": value}})
    message = refusal(GEMMA, **kwargs)
    assert "backend.apiToken" in message and SECRET_VALUE not in message


def test_a_yaml_error_does_not_quote_the_line_it_is_on(tmp_path):
    text = GEMMA_TEXT.replace("  kind: local", f"  kind: local\n  ledger_note: [{SECRET_VALUE}")
    message = refusal(write(tmp_path, text))
    assert "line " in message and SECRET_VALUE not in message


# --- property: whatever the text, a config or a ConfigError ---------------------------------

SCALARS = st.one_of(
    st.integers(min_value=-(10**60), max_value=10**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
)
VALUES = st.recursive(SCALARS,
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4), max_leaves=12)
GEMMA_TREE = yaml.safe_load(GEMMA_TEXT)


def _field_paths(tree, prefix=()):
    for key, value in tree.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _field_paths(value, prefix + (key,))


FIELD_PATHS = sorted(_field_paths(GEMMA_TREE))


def _load_text(text: str | bytes):
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), text)
        try:
            config = load_release_config(path, environ={})
        except ConfigError as exc:
            assert "fix:" in str(exc)
            return None
        assert len(config.config_hash()) == 64
        return config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELD_PATHS), value=VALUES)
def test_any_value_at_any_field_is_a_config_or_a_config_error(field, value):
    tree = json.loads(json.dumps(GEMMA_TREE))
    node = tree
    for key in field[:-1]:
        node = node[key]
    node[field[-1]] = value
    _load_text(yaml.safe_dump(tree, allow_unicode=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(position=st.integers(min_value=0, max_value=len(GEMMA_TEXT)),
       inserted=st.text(alphabet=string.printable + "&*!|>%@`\x00\x85\ufeff\u2028", max_size=12))
def test_any_text_spliced_into_a_config_is_a_config_or_a_config_error(position, inserted):
    _load_text(GEMMA_TEXT[:position] + inserted + GEMMA_TEXT[position:])


@settings(max_examples=100, deadline=None)
@given(position=st.integers(min_value=0, max_value=len(GEMMA_TEXT) - 1), byte=st.integers(min_value=0, max_value=255))
def test_any_byte_overwritten_is_a_config_or_a_config_error(position, byte):
    raw = bytearray(GEMMA_TEXT.encode("utf-8"))
    raw[position] = byte
    _load_text(bytes(raw))
