"""The toy family's server: says whether a number is even or odd, with the confidence its toy model holds.

The image of `tests/e2e/test_third_family.py`'s third family, which proves that a family with its own image and gate
touches only its own files. It speaks the SageMaker container contract (``GET /ping``, ``POST /invocations``) through
the shared ``images/common/sagemaker_http.py`` and is configured only by ``TOY_*`` variables. Standard library only.

Model directory: ``toy-model.json`` {"seed": int, "confidence": float in (0.5, 1)}. A request ``{"x": int}`` is
answered ``{"options": ["even", "odd"], "probabilities": [p, 1 - p], "model_sha256": …}``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if not (_HERE / "sagemaker_http.py").is_file():
    sys.path.insert(0, str(_HERE.parent / "common"))

from sagemaker_http import (  # noqa: E402 — needs sys.path above
    EXIT_MODEL,
    HttpSettings,
    ModelService,
    StartupError,
    bad,
    parse_json_object,
    read_http_settings,
    serve,
    sha256_file,
)

MODEL_FILE = "toy-model.json"
OPTIONS = ["even", "odd"]


@dataclass(frozen=True)
class Settings:
    """The server's validated TOY_* settings."""

    http: HttpSettings
    model_path: Path


@dataclass(frozen=True)
class ToyModel:
    """The loaded toy model: how sure it is of each answer, and the digest of its file."""

    confidence: float
    sha256: str


def load_settings(env: Mapping[str, str]) -> Settings:
    """TOY_MODEL_DIR (holding toy-model.json) and the shared HTTP settings."""
    model_dir = Path(env.get("TOY_MODEL_DIR", "/opt/ml/model"))
    if not (model_dir / MODEL_FILE).is_file():
        raise StartupError(f"TOY_MODEL_DIR={model_dir} holds no {MODEL_FILE}; point it at the extracted model.tar.gz")
    return Settings(read_http_settings(env, "TOY"), model_dir / MODEL_FILE)


def load_model(settings: Settings) -> ToyModel:
    """Read toy-model.json; its confidence must lie strictly between 0.5 and 1."""
    confidence = json.loads(settings.model_path.read_text(encoding="utf-8")).get("confidence")
    if not isinstance(confidence, float) or not 0.5 < confidence < 1:
        raise StartupError(f"{settings.model_path}: confidence {confidence!r} is not a number in (0.5, 1)", EXIT_MODEL)
    return ToyModel(confidence, sha256_file(settings.model_path))


def answer(settings: Settings, model: ToyModel, body: bytes, received: float) -> dict[str, Any]:
    """{"x": int} → the two options' probabilities, the likelier one the number's parity."""
    x = parse_json_object(body).get("x")
    if not isinstance(x, int) or isinstance(x, bool):
        raise bad("x", f"must be an integer, got {x!r}")
    sure = [model.confidence, 1 - model.confidence]
    return {"options": OPTIONS, "probabilities": sure if x % 2 == 0 else sure[::-1], "model_sha256": model.sha256}


SERVICE = ModelService(
    name="toy",
    prefix="TOY",
    server_version="shiplift-toy/1",
    empty_body='is empty; send {"x": <an integer>}',
    load_settings=load_settings,
    load_engine=load_model,
    loaded=lambda settings, model, seconds: f"loaded {settings.model_path} (confidence {model.confidence})",
    answer=answer,
)


if __name__ == "__main__":
    sys.exit(serve(SERVICE, sys.argv[1:]))
