"""Which HTTP/2 engine runs (edge.h2_engine): nghttp2 wherever its binding is
built and current, h2 when pure Python is asked for or the binding is
missing or stale, and an explicit choice that cannot run is an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge.config import EdgeConfig
from edge.h2_engine import (
    CHOICES,
    ENGINES,
    EngineUnavailable,
    engine_description,
    new_server_connection,
    resolve_engine,
)
from geoedge.config import ConfigError, load_config
from tests.compiled import compiler_available, copy_checkout, run_in_checkout
from tests.h2_engines import H2_ENGINES, NGHTTP2_HEADERS, nghttp2_expected
from tunnel.build_mode import NO_EXTENSIONS_VARIABLE, extension_path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json
from edge.h2_engine import EngineUnavailable, nghttp2_problem, resolve_engine
try:
    explicit = resolve_engine("nghttp2")
except EngineUnavailable as exc:
    explicit = "unavailable: " + str(exc)
print(json.dumps([resolve_engine("auto"), explicit, nghttp2_problem()]))
"""


def _probe(cwd: Path, **env: str) -> tuple[str, str, str]:
    """(what "auto" runs, what "nghttp2" gives, why not nghttp2) in a fresh
    interpreter importing the packages found in ``cwd``."""
    result = run_in_checkout(cwd, PROBE, **env)
    auto, explicit, problem = json.loads(result.stdout)
    return auto, explicit, problem


def test_this_run_tests_every_engine_it_can() -> None:
    """``make test`` fails here when libnghttp2's headers and a compiler are
    present but the binding did not come out of the build (make venv)."""
    assert ("nghttp2" in H2_ENGINES) == nghttp2_expected()
    assert "h2" in H2_ENGINES


def test_auto_runs_nghttp2_where_it_is_built_and_h2_runs_when_named() -> None:
    assert resolve_engine("auto") == H2_ENGINES[0]
    assert resolve_engine("h2") == "h2"
    assert set(CHOICES) == {"auto", *ENGINES}
    with pytest.raises(ValueError, match="h2_engine must be one of"):
        resolve_engine("quic")


@pytest.mark.parametrize("engine", H2_ENGINES)
def test_each_engine_says_its_version_and_makes_a_connection(engine: str) -> None:
    name, version = engine_description(engine).split()
    assert name == engine and version[0].isdigit()
    conn = new_server_connection(
        engine, max_concurrent_streams=7, max_header_list_size=8192, stream_window=1 << 20
    )
    conn.initiate_connection()
    settings = conn.data_to_send()
    assert settings[3] == 0x04  # a SETTINGS frame first
    assert b"\x00\x03\x00\x00\x00\x07" in settings  # MAX_CONCURRENT_STREAMS = 7


def test_pure_python_runs_h2_and_refuses_to_run_nghttp2_by_name() -> None:
    auto, explicit, problem = _probe(ROOT, **{NO_EXTENSIONS_VARIABLE: "1"})
    assert auto == "h2"
    assert explicit.startswith("unavailable: h2_engine = 'nghttp2' cannot run here")
    assert NO_EXTENSIONS_VARIABLE in problem


@pytest.fixture
def built_copy(tmp_path: Path) -> Path:
    """The three packages with the nghttp2 binding built, copied elsewhere (in
    the pure run too: ``GEOEDGE_NO_EXTENSIONS`` only chooses, the files are there)."""
    if extension_path("edge.h2_nghttp2") is None:
        if compiler_available() and any(path.exists() for path in NGHTTP2_HEADERS):
            pytest.fail("libnghttp2's headers are here but the binding is not built: make venv")
        pytest.skip("no C compiler or libnghttp2 headers on this machine: no binding")
    return copy_checkout(tmp_path)


def test_the_copy_runs_nghttp2(built_copy: Path) -> None:
    assert _probe(built_copy) == ("nghttp2", "nghttp2", "")


def test_without_the_binding_auto_runs_h2_and_says_why(built_copy: Path) -> None:
    built = extension_path("edge.h2_nghttp2")
    assert built is not None
    (built_copy / built.relative_to(ROOT)).unlink()
    auto, explicit, problem = _probe(built_copy)
    assert auto == "h2" and explicit.startswith("unavailable:")
    assert "edge.h2_nghttp2 is not built" in problem and "libnghttp2" in problem


@pytest.mark.parametrize("edited", ["h2_nghttp2.pyx", "libnghttp2.pxd"])
def test_a_binding_older_than_its_source_is_not_used(built_copy: Path, edited: str) -> None:
    built = next((built_copy / "edge").glob("h2_nghttp2.*.so"))
    later = built.stat().st_mtime + 60
    os.utime(built_copy / "edge" / edited, (later, later))
    auto, _explicit, problem = _probe(built_copy)
    assert auto == "h2" and "older than its source" in problem


def test_the_config_names_the_key_and_file_of_an_unknown_engine(tmp_path: Path) -> None:
    config = tmp_path / "edge.toml"
    config.write_text('[http]\nh2_engine = "quic"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(config, EdgeConfig)
    assert f'{config}: [http] h2_engine: expected one of "auto", "nghttp2", "h2", found' in str(
        caught.value
    )


def test_an_engine_named_that_cannot_run_is_an_error_not_a_fallback() -> None:
    if "nghttp2" in H2_ENGINES:
        assert resolve_engine("nghttp2") == "nghttp2"
        return
    with pytest.raises(EngineUnavailable, match="cannot run here"):
        resolve_engine("nghttp2")


def test_an_engine_that_cannot_run_stops_the_edge_at_its_check_naming_key_and_file(
    tmp_path: Path,
) -> None:
    """``edge --check`` (and start-up, which runs the same preflight) refuses
    ``h2_engine = "nghttp2"`` where the binding cannot run: the pure-Python
    run here, whatever this run's build."""
    example = (ROOT / "deploy" / "config" / "edge.example.toml").read_text()
    assert 'h2_engine = "auto"' in example
    config = tmp_path / "edge.toml"
    config.write_text(example.replace('h2_engine = "auto"', 'h2_engine = "nghttp2"'))
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-m", "edge", "--check", "--config", str(config)],
        cwd=ROOT,
        env=environ | {NO_EXTENSIONS_VARIABLE: "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"{config}: [http] h2_engine = 'nghttp2' cannot run here" in result.stderr
