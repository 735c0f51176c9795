"""The one registry of model families: (`artifact.kind`, `image.kind`) → the family that owns them.

A family is known by what it builds and what serves it: a GGUF served by the SemIf adapter and the same GGUF served by
the llama.cpp DLC's chat path are two families that share an artifact. The shipped families are named by module and
imported on first use (their modules hold config classes at the top and import their heavy libraries only inside the
steps). `register` adds another family, a test's toy one for instance: the release config asks this registry while it
validates, so a registered family's configs load with nothing else changed. Every family class, shipped or added, is
admitted only whole: one that lacks a step (`base.missing_steps`) is refused here, naming what it lacks.
"""

from __future__ import annotations

from importlib import import_module

from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families.base import ModelFamily, missing_steps

BUILTIN = ("shiplift.tasks.families.gguf_decisions", "shiplift.tasks.families.gguf_chat",
           "shiplift.tasks.families.onnx_nli")
_families: dict[tuple[str, str], ModelFamily] = {}
_builtin_keys: set[tuple[str, str]] = set()


def families() -> tuple[ModelFamily, ...]:
    """Every known family, the shipped ones first."""
    if not _families:
        for module in BUILTIN:
            family = admit(import_module(module).FAMILY)
            _families[family.key] = family
            _builtin_keys.add(family.key)
    return tuple(_families.values())


def admit(family_class: type[ModelFamily]) -> ModelFamily:
    """The one instance of a whole family class; ConfigError naming every step it lacks."""
    if not (isinstance(family_class, type) and issubclass(family_class, ModelFamily)):
        raise ConfigError(f"{family_class!r} is not a model family class",
                          fix="register a subclass of tasks.families.base.ModelFamily (the class, not an instance)")
    missing = missing_steps(family_class)
    if missing:
        raise ConfigError(f"model family {family_class.__name__} lacks {', '.join(missing)}",
                          fix="define them (shiplift.tasks.families.base.ModelFamily says what each one does)")
    return family_class()


def family_of(artifact_kind: str, image_kind: str) -> ModelFamily:
    """The family of an (`artifact.kind`, `image.kind`) pair; ConfigError naming what is known."""
    for family in families():
        if family.key == (artifact_kind, image_kind):
            return family
    images = [f.image_kind for f in families() if f.artifact_kind == artifact_kind]
    if images:
        raise ConfigError(f"artifact.kind {artifact_kind} is not served by image.kind {image_kind!r}",
                          fix=f"use image.kind {' or '.join(images)}")
    known = ", ".join(sorted({f.artifact_kind for f in families()}))
    raise ConfigError(f"artifact.kind {artifact_kind!r} is not a model family shiplift knows",
                      fix=f"use one of {known}")


def artifact_models() -> dict[str, type]:
    """`artifact.kind` → its config class, over every family (families may share an artifact)."""
    return {family.artifact_kind: family.artifact_model for family in families()}


def image_models() -> dict[str, type]:
    """`image.kind` → its config class, over every family (families may share an image)."""
    return {family.image_kind: family.image_model for family in families()}


def validation_models() -> dict[str, type]:
    """`validation.kind` → its config class, over every family (families may share a gate)."""
    return {family.validation_kind: family.validation_model for family in families()}


def env_prefix(image_kind: str) -> str:
    """The environment prefix of an image's server (`<PREFIX>_MODEL_DIR`, `_HOST`, `_PORT`)."""
    for family in families():
        if family.image_kind == image_kind:
            return family.env_prefix
    raise ConfigError(f"no model family serves image {image_kind!r}", fix="use an image kind a family declares")


def register(family_class: type[ModelFamily]) -> ModelFamily:
    """Add a family class and return its instance; refuses a class that lacks a step (`admit`) and one whose
    (artifact, image) pair another family already owns."""
    families()
    family = admit(family_class)
    owner = _families.get(family.key)
    if owner is not None:
        raise ConfigError(f"artifact.kind {family.artifact_kind!r} on image.kind {family.image_kind!r} already belongs "
                          f"to {type(owner).__name__}", fix="give the new family its own artifact or image kind")
    _families[family.key] = family
    return family


def unregister(artifact_kind: str, image_kind: str) -> None:
    """Remove a family added with `register` (the shipped ones stay)."""
    families()
    if (artifact_kind, image_kind) in _builtin_keys:
        raise ConfigError(f"{artifact_kind!r} on {image_kind!r} is a shipped family",
                          fix="only families added with register() can be removed")
    _families.pop((artifact_kind, image_kind), None)
