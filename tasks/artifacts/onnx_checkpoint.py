"""Check a Hugging Face checkpoint before export (`check_checkpoint`): a 3-way NLI sequence classifier with a fast
tokenizer, its head read from the weights without loading the model, its files hashed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shiplift.tasks.artifacts.onnx_contract import ID2LABEL, LABELS
from shiplift.tasks.errors import BadInput
from shiplift.tasks.extras import needs_extra
from shiplift.tasks.hashing import sha256_file, sha256_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class CheckpointInfo:
    """What `check_checkpoint` found: the facts export and parity rely on."""

    path: str
    model_type: str
    architecture: str
    num_labels: int
    id2label: dict[str, str]
    hidden_size: int | None
    num_attention_heads: int | None
    max_position_embeddings: int | None
    weights_file: str
    tokenizer_files: list[str]
    sha256: str  # sha256 of the canonical JSON {relative path: file sha256} of every file

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return asdict(self)


def _tree_sha256(root: Path) -> str:
    """sha256 of {relative path: sha256} over every regular, non-hidden file under root."""
    files = {
        str(path.relative_to(root)): sha256_file(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)
    }
    return sha256_json(files)


def _weight_shapes(root: Path, weights_file: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the checkpoint weights, read without loading the model."""
    if weights_file.endswith(".index.json"):
        index = json.loads((root / weights_file).read_text(encoding="utf-8"))
        shards = sorted(set(index.get("weight_map", {}).values()))
    else:
        shards = [weights_file]
    shapes: dict[str, tuple[int, ...]] = {}
    for shard in shards:
        if shard.endswith(".safetensors"):
            with needs_extra("encoders"):
                from safetensors import safe_open

            with safe_open(str(root / shard), framework="np") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        else:
            with needs_extra("encoders"):
                import torch

            state = torch.load(root / shard, map_location="cpu", weights_only=True, mmap=True)
            shapes.update({key: tuple(value.shape) for key, value in state.items()})
    return shapes


def _read_config(root: Path) -> dict[str, Any]:
    """The checkpoint directory's config.json (BadInput where there is none, or it is no JSON)."""
    if not root.is_dir():
        raise BadInput(f"checkpoint {root} is not a directory", fix="pass a Hugging Face checkpoint directory")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise BadInput(f"checkpoint {root} has no config.json", fix="save the model with save_pretrained")
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInput(f"{config_path} is not valid JSON: {exc}", fix="save the model with save_pretrained") from exc


def check_checkpoint(checkpoint_dir: str | Path) -> CheckpointInfo:
    """Check that a directory is a 3-label HF sequence classifier with a fast tokenizer (else BadInput)."""
    root = Path(checkpoint_dir)
    config = _read_config(root)
    architectures = config.get("architectures") or []
    classifiers = [name for name in architectures if name.endswith("ForSequenceClassification")]
    fix_head = (
        "fine-tune a 3-way NLI head (python -m shiplift.tasks.artifacts.nli_train) and export the saved checkpoint"
    )
    if not classifiers:
        raise BadInput(
            f"checkpoint {root} is not a sequence classifier: architectures {architectures or 'missing'} "
            "has no *ForSequenceClassification",
            fix=fix_head,
        )
    id2label = {str(key): str(value) for key, value in (config.get("id2label") or {}).items()}
    num_labels = len(id2label) if id2label else int(config.get("num_labels", 2))
    if num_labels != len(LABELS):
        raise BadInput(
            f"checkpoint {root} has the wrong label count: {num_labels} labels {sorted(id2label.values())}, "
            f"need {len(LABELS)} ({', '.join(LABELS)})",
            fix="use a 3-way NLI checkpoint",
        )
    wanted = {str(index): label for index, label in ID2LABEL.items()}
    if {key: value.lower() for key, value in id2label.items()} != wanted:
        raise BadInput(
            f"checkpoint {root} has id2label {id2label}; the contract needs {wanted}",
            fix="set config.id2label / label2id to entailment, neutral, contradiction in that order "
            "(reorder the classifier rows if the head was trained in another order)",
        )
    weights = [name for name in WEIGHT_FILES if (root / name).is_file()]
    if not weights:
        raise BadInput(
            f"checkpoint {root} has no weights ({' / '.join(WEIGHT_FILES)})", fix="save the model with save_pretrained"
        )
    shapes = _weight_shapes(root, weights[0])
    head = {key: shape for key, shape in shapes.items() if "classifier" in key.split(".")}
    if not head:
        raise BadInput(
            f"checkpoint {root} is not a sequence classifier: no classifier head in {weights[0]} "
            f"(architectures says {classifiers[0]})",
            fix=fix_head,
        )
    for key in ("classifier.weight", "classifier.out_proj.weight"):
        if key in head and head[key][0] != len(LABELS):
            raise BadInput(
                f"checkpoint {root} has the wrong label count: {key} has {head[key][0]} rows, need {len(LABELS)}",
                fix="use a 3-way NLI checkpoint",
            )
    if not (root / "tokenizer.json").is_file():
        raise BadInput(
            f"checkpoint {root} is missing its tokenizer (tokenizer.json)",
            fix="save the fast tokenizer beside the model: AutoTokenizer.from_pretrained(...).save_pretrained(dir)",
        )
    return CheckpointInfo(
        path=str(root),
        model_type=str(config.get("model_type", "")),
        architecture=classifiers[0],
        num_labels=num_labels,
        id2label=id2label,
        hidden_size=config.get("hidden_size"),
        num_attention_heads=config.get("num_attention_heads"),
        max_position_embeddings=config.get("max_position_embeddings"),
        weights_file=weights[0],
        tokenizer_files=[name for name in TOKENIZER_FILES if (root / name).is_file()],
        sha256=_tree_sha256(root),
    )
