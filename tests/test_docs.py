"""The documentation runs: every shell and Python block of README.md and docs/*.md marked runnable
(an HTML comment ``<!-- runnable -->`` on the line before its fence) is executed, in a fresh temporary
directory per file, in the file's order (a block may use what an earlier block of the same file
wrote), with ``mucsc`` on PATH being this checkout's command.  A block fails the test on a non-zero
exit status.  Blocks must run in seconds; what cannot (downloads, GPU, long sweeps) stays unmarked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w*)\s*$")
LANGUAGES = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python"}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def runnable_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, language, code) of every block marked runnable, in file order."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == MARKER:
            m = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if not m or m.group(1) not in LANGUAGES:
                raise AssertionError(f"{path.name}:{i + 1}: {MARKER} must precede a ```sh or ```python fence")
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            blocks.append((i + 2, LANGUAGES[m.group(1)], "\n".join(lines[i + 2:end]) + "\n"))
            i = end
        i += 1
    return blocks


def test_marker_parser_takes_only_marked_blocks(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("```sh\nfalse\n```\n<!-- runnable -->\n```sh\necho one\n```\n"
                   "<!-- runnable -->\n```python\nprint(2)\n```\n")
    assert runnable_blocks(doc) == [(5, "sh", "echo one\n"), (9, "python", "print(2)\n")]
    doc.write_text("<!-- runnable -->\n```console\n$ true\n```\n")
    with pytest.raises(AssertionError, match="must precede"):
        runnable_blocks(doc)


def test_the_docs_have_runnable_blocks():
    marked = {p.name: len(runnable_blocks(p)) for p in doc_files()}
    assert marked["README.md"] >= 3, marked
    for tutorial in ("tutorial-updates.md", "tutorial-checkpoints.md", "tutorial-simulator.md"):
        assert marked[tutorial] >= 2, marked


def _environment(bin_dir: Path) -> dict[str, str]:
    bin_dir.mkdir()
    shim = bin_dir / "mucsc"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mucsc.cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["MPLBACKEND"] = "Agg"
    return env


@pytest.mark.parametrize("doc", [p for p in doc_files() if runnable_blocks(p)], ids=lambda p: p.name)
def test_runnable_blocks_run(doc, tmp_path):
    env = _environment(tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    for line, language, code in runnable_blocks(doc):
        cmd = ["bash", "-euo", "pipefail", "-c", code] if language == "sh" else [sys.executable, "-c", code]
        r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (f"{doc.name}:{line}: exit {r.returncode}\n--- code\n{code}--- stdout\n"
                                   f"{r.stdout[-3000:]}--- stderr\n{r.stderr[-3000:]}")


def test_reference_is_up_to_date():
    """docs/reference/*.md are what docs/make_reference.py writes from the code's help and docstrings."""
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "make_reference.py"), "--check"], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "37"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_reference_covers_every_command_and_public_function():
    cli_text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for command in ("compress", "decompress", "info", "test", "rate", "sim"):
        assert f"## `mucsc {command}`" in cli_text
    api_text = (ROOT / "docs" / "reference" / "api.md").read_text()
    import inspect

    import mucsc

    for name in mucsc.__all__:
        if inspect.isfunction(getattr(mucsc, name)) or inspect.isclass(getattr(mucsc, name)):
            assert f"### `mucsc.{name}`" in api_text, name


# Where measurement diaries live (commits measured, run-by-run history): every other page is reference.
DIARIES = ("performance.md", "changelog.md")
NOT_HASHES = {"ed25519"}  # hex-looking words that are names, not commits


def commit_hashes(text: str) -> list[str]:
    """Words of 7-40 hex digits with at least one digit and one letter: what a git commit id looks like."""
    return [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text)
            if re.search(r"\d", h) and re.search(r"[a-f]", h) and h not in NOT_HASHES]


def machine_paths(text: str, roots: str) -> list[str]:
    """Absolute paths under ``roots`` (a regex alternation): paths that exist only on one machine."""
    return re.findall(rf"(?:^|[\s`'\"(=])(/(?:{roots})/\S*)", text)


def test_bookkeeping_finders():
    assert commit_hashes("at fdba690, main at 9aa8399; ed25519 keys, 1000000 values, 0.0009602, cafebabe") == \
        ["fdba690", "9aa8399"]
    assert machine_paths("flock /work/bench.lock x; -o /tmp/x; see /work/shared/data", "work") == \
        ["/work/bench.lock", "/work/shared/data"]


def test_readme_is_a_users_page():
    """No commit hashes, no project-internal bookkeeping, no paths that exist only on one machine."""
    text = (ROOT / "README.md").read_text()
    assert not commit_hashes(text), commit_hashes(text)
    assert not re.search(r"\bissues?\b", text, re.IGNORECASE)
    absolute = machine_paths(text, "work|tmp|home|root|opt|srv|mnt")
    assert not absolute, absolute  # paths of one machine (the quick start's relative .venv is the reader's)
    for machine_specific in (".lock", "flock ", "nice -20", "autogroup"):
        assert machine_specific not in text, machine_specific


@pytest.mark.parametrize("doc", [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in DIARIES],
                         ids=lambda p: p.name)
def test_reference_pages_carry_no_diary(doc):
    """The reference pages state results with the machine named; which commit was measured, the
    tracker's issues and one machine's paths belong in the diaries (docs/performance.md)."""
    text = doc.read_text()
    assert not commit_hashes(text), commit_hashes(text)
    assert not re.findall(r".{0,40}\bissues?\b.{0,40}", text, re.IGNORECASE)
    absolute = machine_paths(text, "work|home|root|srv|mnt")  # /tmp/... is every reader's scratch
    assert not absolute, absolute
    for machine_specific in ("/bench.lock", "autogroup", "this branch", "this session", "engineers' jobs"):
        assert machine_specific not in text, machine_specific
