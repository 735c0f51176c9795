"""Release configs: the shipped ones validate; every bad one fails with file, field path and fix."""

from pathlib import Path

import pytest
import yaml

from shiplift.tasks.config import load_release_config
from shiplift.tasks.config_types import DatasetRef
from shiplift.tasks.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "configs" / "releases" / "gemma-decision.yaml"


def write_variant(tmp_path: Path, mutate, source: Path = GEMMA) -> Path:
    """A copy of a shipped config (gemma-decision by default) changed by `mutate`, written into tmp_path."""
    tree = yaml.safe_load(source.read_text())
    mutate(tree)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs" / "releases").glob("*.yaml")))
def test_shipped_configs_validate(name):
    config = load_release_config(ROOT / "configs" / "releases" / name, environ={})
    assert len(config.config_hash()) == 64


def test_production_example_pins_qwen_and_the_gpu_pool():
    config = load_release_config(ROOT / "configs" / "releases" / "qwen35-4b-semif.yaml", environ={})
    assert config.artifact.source.file == "Qwen_Qwen3.5-4B-Q4_K_M.gguf"
    assert config.artifact.source.sha256 == "13c16f426047e2de38cd075bdade4a7bcbc8c774384876f677740cda65f8a983"
    assert [p.instance_type for p in sorted(config.placement.pools, key=lambda p: p.priority)] == [
        "ml.g6e.xlarge", "ml.g6.2xlarge", "ml.g5.2xlarge", "ml.g4dn.2xlarge"]


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda t: t.update(colour="blue"), "colour", "Extra inputs are not permitted"),
        (lambda t: t["image"].update(threads="many"), "image.threads", "valid integer"),
        (lambda t: t["image"].update(base_image="public.ecr.aws/x/llama-cpp:latest"), "image.base_image", "pattern"),
        (lambda t: t["artifact"]["source"].update(sha256="abc"), "artifact.source.sha256", "pattern"),
        (lambda t: t["artifact"]["source"].update(kind="ftp"), "artifact.source", "tag 'ftp'"),
        (lambda t: t["image"].update(max_request_tokens=9999), "image", "exceeds max_tokens"),
        (lambda t: t["artifact"].update(quantization="Q3_XYZ"), "artifact.quantization", "Input should be"),
        (lambda t: t["rollout"].update(strategy="yolo"), "rollout", "tag 'yolo'"),
        (lambda t: t.update(placement={"kind": "instance_pool", "pools": [
            {"instance_type": "ml.g5.xlarge", "priority": 1}, {"instance_type": "ml.g5.xlarge", "priority": 2}]}),
         "placement.pools", "unique"),
        (lambda t: t.update(placement={"kind": "instance_pool", "pools": [
            {"instance_type": f"ml.g5.{n}xlarge", "priority": 1} for n in range(2, 8)]}),
         "placement.pools", "at most 5"),
        (lambda t: t.update(name="Bad_Name"), "name", "pattern"),
        (lambda t: t.update(name="a" * 40, resource_prefix="b" * 16), "(top level)", "shorten resource_prefix or name"),
    ],
)
def test_bad_config_names_file_field_and_problem(tmp_path, mutate, field, words):
    path = write_variant(tmp_path, mutate)
    with pytest.raises(ConfigError) as caught:
        load_release_config(path, environ={})
    message = str(caught.value)
    assert str(path) in message
    assert field in message
    assert words in message
    assert "fix:" in message


def test_secret_looking_keys_are_refused(tmp_path):
    path = write_variant(tmp_path, lambda t: t["backend"].update(aws_secret_access_key="AKIA..."))
    with pytest.raises(ConfigError, match="backend.aws_secret_access_key"):
        load_release_config(path, environ={})


def test_layering_file_then_environment_then_flags():
    env = {"SHIPLIFT_CONFIG__image__threads": "3", "SHIPLIFT_CONFIG__validation__concurrency": "5"}
    config = load_release_config(GEMMA, environ=env, overrides=["validation.concurrency=7"])
    assert config.image.threads == 3
    assert config.validation.concurrency == 7
    assert load_release_config(GEMMA, environ={}).image.threads == 2


def test_overrides_change_the_config_hash_and_are_validated():
    base = load_release_config(GEMMA, environ={})
    calibrated = load_release_config(GEMMA, environ={}, overrides=["calibration.fit_temperature=true"])
    assert calibrated.calibration.fit_temperature and base.config_hash() != calibrated.config_hash()
    with pytest.raises(ConfigError, match="no '='"):
        load_release_config(GEMMA, environ={}, overrides=["image.threads"])
    with pytest.raises(ConfigError, match="image.thread"):
        load_release_config(GEMMA, environ={}, overrides=["image.thread=2"])


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_release_config(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_release_config(bad, environ={})


def test_builtin_and_relative_dataset_paths(tmp_path):
    assert DatasetRef(path="builtin:decisions").resolve(tmp_path).name == "decisions.jsonl"
    (tmp_path / "mine.jsonl").write_text("{}\n")
    assert DatasetRef(path="mine.jsonl").resolve(tmp_path) == tmp_path / "mine.jsonl"
    with pytest.raises(ConfigError, match="not found"):
        DatasetRef(path="absent.jsonl").resolve(tmp_path)


def test_extends_merges_the_parent_underneath(tmp_path):
    broken = load_release_config(ROOT / "configs" / "releases" / "demo-broken-model.yaml", environ={})
    gemma = load_release_config(GEMMA, environ={})
    assert broken.name == gemma.name and broken.validation == gemma.validation
    assert broken.artifact.source.kind == "generated"
    loop = tmp_path / "a.yaml"
    loop.write_text("extends: a.yaml\nname: x\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_release_config(loop, environ={})


def test_encoder_demo_pins_the_shipped_nli_data():
    from shiplift.validation.nli.pairs import load_nli

    config = load_release_config(ROOT / "configs" / "releases" / "minilm-nli.yaml", environ={})
    assert config.artifact.source.data_sha256 == load_nli(ROOT / "validation" / "data" / "nli.jsonl").sha256


MDEBERTA = ROOT / "configs" / "releases" / "mdeberta-nli.yaml"


def test_production_encoder_pins_mdeberta_at_a_commit_on_mig_partitions():
    config = load_release_config(MDEBERTA, environ={})
    source = config.artifact.source
    assert (source.kind, source.repo) == ("huggingface", "MoritzLaurer/mDeBERTa-v3-base-mnli-xnli")
    assert len(source.revision) == 40 and not config.artifact.int8
    assert (config.placement.kind, config.placement.instance_type) == ("mig_partition", "ml.p5.4xlarge")
    assert 2 * config.rollout.copies <= config.placement.partitions, \
        "one H100 holds the copies and an update's new ones"
    assert config.image.container_env()["ENCODER_DEVICE"] == "cuda"
    assert config.image.container_env(cpu_only=True)["ENCODER_DEVICE"] == "cpu", \
        "calibration scores on the worker's CPU"


@pytest.mark.parametrize(
    "placement, words",
    [
        ({"instance_type": "ml.g5.2xlarge"}, "MIG partitions are known for"),
        ({"partition_type": "mig-3g.40gb", "partitions": 3}, "9 compute slices and 120 GB"),
        ({"instance_type": "ml.g7e.48xlarge", "partition_type": "mig-2g.48gb", "partitions": 3}, "4 slices and 96 GB"),
        ({"partitions": 1}, "rollout.copies (2) do not fit 1 x ml.p5.4xlarge = 1 mig-1g.10gb partition"),
    ],
    ids=["no MIG family", "over the GPU", "over a G7e GPU", "more copies than partitions"],
)
def test_mig_layout_must_fit_one_gpu_and_the_copies(tmp_path, placement, words):
    path = write_variant(tmp_path, lambda t: t["placement"].update(placement), MDEBERTA)
    with pytest.raises(ConfigError, match="placement") as caught:
        load_release_config(path, environ={})
    assert words in str(caught.value)


def test_mig_partition_with_a_cpu_image_is_refused(tmp_path):
    path = write_variant(tmp_path, lambda t: t["image"].update(device="cpu"), MDEBERTA)
    with pytest.raises(ConfigError, match="set image.device: cuda"):
        load_release_config(path, environ={})


def test_model_family_must_be_consistent(tmp_path):
    path = write_variant(tmp_path, lambda t: t.update(validation={**t["validation"], "kind": "nli"}))
    with pytest.raises(ConfigError, match="validation"):
        load_release_config(path, environ={})
    mixed = write_variant(tmp_path,
                          lambda t: t.update(image={"kind": "encoder", "base_image": t["image"]["base_image"]}))
    with pytest.raises(ConfigError,
                       match="artifact.kind gguf is not served by image.kind 'encoder'.*semif or dlc-chat"):
        load_release_config(mixed, environ={})
    chat_gate = write_variant(tmp_path, lambda t: t["validation"].update(kind="chat-decisions"))
    with pytest.raises(ConfigError, match="gated by validation.kind decisions, got validation.kind chat-decisions"):
        load_release_config(chat_gate, environ={})


CHAT = ROOT / "configs" / "releases" / "gemma-chat.yaml"


def test_the_chat_config_becomes_the_dlcs_environment():
    """Issue 19: llama-server's options become SM_LLAMA_CPP_* variables (ctx_size: 2048 →
    SM_LLAMA_CPP_CTX_SIZE=2048)."""
    config = load_release_config(CHAT, environ={})
    assert (config.family.key, config.validation.kind) == (("gguf", "dlc-chat"), "chat-decisions")
    assert config.image.container_env() == {"SM_LLAMA_CPP_THREADS": "2", "SM_LLAMA_CPP_N_GPU_LAYERS": "0",
                                            "SM_LLAMA_CPP_CTX_SIZE": "2048", "SM_LLAMA_CPP_CHAT_TEMPLATE": "gemma"}
    flash = load_release_config(CHAT, overrides=("image.server.flash_attn=on", "image.server.batch_size=512"),
                                environ={})
    assert flash.image.container_env()["SM_LLAMA_CPP_FLASH_ATTN"] == "on"
    assert flash.image.container_env()["SM_LLAMA_CPP_BATCH_SIZE"] == "512"
    assert config.image.reference("eu-south-2") == ("503227376785.dkr.ecr.eu-south-2.amazonaws.com/"
                                                    "llama-cpp:server-sagemaker-cpu-v1")
    assert config.image.reference("us-east-1").startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/")


@pytest.mark.parametrize("overrides, needles", [
    (("image.server.hf_repo=ggml-org/gemma-3-270m-GGUF",), ("hf_repo", "network isolation", "artifact.source")),
    (("image.server.ctx_sise=2048",), ("image.server.ctx_sise", "Extra inputs")),
    (("image.server.ctx_size=lots",), ("image.server.ctx_size", "integer")),
    (("image.server.flash_attn=enabled",), ("image.server.flash_attn", "'on', 'off' or 'auto'")),
    (("image.server.chat_template=gemma2",), ("image.server.chat_template",)),
    (("image.tag=latest",), ("image.tag", "server-sagemaker-cpu-v1")),
    (("image.n_gpu_layers=-1",), ("CPU build", "server-sagemaker-cuda-v1")),
    (("image.digest=sha256:abc",), ("image.digest", "pattern")),
    (("image.base_image=public.ecr.aws/x@sha256:" + "0" * 64,), ("image.base_image", "Extra inputs")),
    (("calibration.fit_temperature=true",), ("fit_temperature", "cannot apply")),
    (("image.server.ubatch_size=1024", "image.server.batch_size=512"),
     ("ubatch_size (1024) exceeds batch_size (512)",)),
])
def test_chat_image_options_are_checked_with_the_fix(overrides, needles):
    with pytest.raises(ConfigError) as caught:
        load_release_config(CHAT, overrides=overrides, environ={})
    assert all(needle in str(caught.value) for needle in needles), str(caught.value)


QWEN = ROOT / "configs" / "releases" / "qwen35-4b-semif.yaml"


def test_copies_must_fit_the_gpus_of_the_instances():
    """Two copies of one GPU each do not fit one single-GPU instance: refused at load, naming the instance count
    needed."""
    assert load_release_config(QWEN, environ={}).placement.instance_count == 2
    with pytest.raises(ConfigError, match=r"rollout.copies \(2\) do not fit 1 x ml.g6e.xlarge = 1 GPU: one copy each; "
                                          r"set placement.instance_count to 2"):
        load_release_config(QWEN, overrides=("placement.instance_count=1", "placement.max_instance_count=1"),
                            environ={})
    four_gpus = "placement.pools=[{instance_type: ml.g5.12xlarge, priority: 1}]"
    assert load_release_config(QWEN, overrides=(four_gpus, "placement.instance_count=1"),
                               environ={}).rollout.copies == 2


def test_pool_priorities_are_exactly_one_to_n():
    for pools in ("[{instance_type: ml.g6e.xlarge, priority: 1}, {instance_type: ml.g6.2xlarge, priority: 1}]",
                  "[{instance_type: ml.g6e.xlarge, priority: 2}]"):
        with pytest.raises(ConfigError, match=r"priorities must be exactly 1\.\.\d"):
            load_release_config(QWEN, overrides=(f"placement.pools={pools}",), environ={})


def test_a_shared_endpoint_names_production_by_the_endpoint_and_its_layout_and_an_unset_one_hashes_as_before():
    """placement.endpoint (docs/fleet.md): production is `<prefix>-<endpoint>-<layout id>`, eight hex digits of the
    placement's content without the endpoint, and the component `<prefix>-<name>-<layout id>`; another layout names
    another endpoint and component, the same layout under the same group the same ones; a config without it keeps its
    release id and names; a name longer than 32 characters (so the endpoint's name stays within SageMaker's 63) or not
    a resource name is refused."""
    import hashlib

    from shiplift.tasks.errors import ConfigError
    from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint

    releases = ROOT / "configs" / "releases"
    plain = load_release_config(releases / "gemma-decision.yaml")
    shared = load_release_config(releases / "gemma-decision.yaml", overrides=("placement.endpoint=demo-cpu",))
    # set fields, endpoint apart
    written = '{"instance_count":1,"instance_type":"ml.c7i.xlarge","kind":"instance_type"}'
    digest = hashlib.sha256(written.encode()).hexdigest()[:8]
    assert production_endpoint(plain) == "shiplift-gemma-decision-prod"
    assert production_endpoint(shared) == f"shiplift-demo-cpu-{digest}"
    assert production_component(plain) == "shiplift-gemma-decision"
    assert production_component(shared) == f"shiplift-gemma-decision-{digest}"
    other_model = load_release_config(releases / "gemma-decision.yaml",
                                      overrides=("placement.endpoint=demo-cpu", "name=gemma-other"))
    assert production_endpoint(other_model) == production_endpoint(shared), "one layout, one endpoint for every model"
    relaid = load_release_config(releases / "gemma-decision.yaml",
                                 overrides=("placement.endpoint=demo-cpu", "placement.instance_count=2"))
    assert production_endpoint(relaid) != production_endpoint(shared)
    assert production_component(relaid) != production_component(shared)
    assert "endpoint" not in plain.model_dump(mode="json")["placement"] or plain.placement.endpoint is None
    assert plain.config_hash() == load_release_config(ROOT / "configs" / "releases" / "gemma-decision.yaml",
                                                      overrides=("placement.endpoint=null",)).config_hash()
    assert plain.config_hash() != shared.config_hash()
    with pytest.raises(ConfigError, match=r"placement\.(instance_type\.)?endpoint"):
        load_release_config(ROOT / "configs" / "releases" / "gemma-decision.yaml",
                            overrides=("placement.endpoint=" + "e" * 33,))
    with pytest.raises(ConfigError, match=r"placement\.(instance_type\.)?endpoint"):
        load_release_config(ROOT / "configs" / "releases" / "gemma-decision.yaml",
                            overrides=("placement.endpoint=Bad_Name",))



def test_scale_to_zero_is_checked_against_the_copies_and_the_endpoint_s_instances_and_unset_hashes_as_before():
    """scale_to_zero (docs/fleet.md, "Scale to zero"): on aws the endpoint must be allowed to give back its instances
    (ManagedInstanceScaling.MinInstanceCount 0, which needs MaxInstanceCount); max_copies holds the release's copies;
    the gate's bound is required; a config without the section keeps its release id."""
    scaling = "scale_to_zero={idle_s: 600, max_cold_start_p95_s: 900}"
    with pytest.raises(ConfigError, match="set placement.min_instance_count: 0"):
        load_release_config(QWEN, overrides=(scaling,), environ={})
    config = load_release_config(QWEN, overrides=(scaling, "placement.min_instance_count=0"), environ={})
    assert config.scale_to_zero.plan(config.rollout.copies).model_dump() == {
        "max_copies": 2, "idle_s": 600, "invocations_per_copy": 10.0}
    with pytest.raises(ConfigError, match=r"max_copies \(1\) is below rollout.copies \(2\)"):
        load_release_config(QWEN, overrides=("scale_to_zero={max_copies: 1, max_cold_start_p95_s: 900}",
                                             "placement.min_instance_count=0"), environ={})
    with pytest.raises(ConfigError, match="max_cold_start_p95_s"):
        load_release_config(QWEN, overrides=("scale_to_zero={idle_s: 600}", "placement.min_instance_count=0"),
                            environ={})
    with pytest.raises(ConfigError, match="needs placement.max_instance_count too"):
        load_release_config(QWEN, overrides=("placement.max_instance_count=null", "placement.min_instance_count=0"),
                            environ={})
    local = load_release_config(GEMMA, overrides=("scale_to_zero={max_cold_start_p95_s: 30}",), environ={})
    assert local.scale_to_zero.idle_s == 900  # locally the instances are this machine: no instance floor to set
    plain = load_release_config(GEMMA, environ={})
    assert plain.config_hash() == load_release_config(GEMMA, overrides=("scale_to_zero=null",),
                                                      environ={}).config_hash()
    assert plain.config_hash() != local.config_hash()


def test_asking_a_person_needs_someone_to_ask():
    """validation.inconclusive.choice ask without promotion.approval is refused at load, naming both fixes."""
    with pytest.raises(ConfigError, match="promotion.approval names nobody.*choose block or extend"):
        load_release_config(GEMMA,
                            overrides=["validation.inconclusive.choice=ask", "validation.inconclusive.extend=null"])
    config = load_release_config(GEMMA,
                                 overrides=["validation.inconclusive.choice=ask", "validation.inconclusive.extend=null",
                                                   "promotion.approval.required=true",
                                                   "promotion.approval.approvers=[release-manager]"])
    assert config.validation.inconclusive.choice == "ask"
