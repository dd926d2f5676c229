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


# No page is a diary: the history of the measurements is in the commit messages and CHANGELOG.md.
USER_PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md"]
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


@pytest.mark.parametrize("doc", USER_PAGES, ids=lambda p: p.name)
def test_reference_pages_carry_no_diary(doc):
    """The pages state results with the machine named; which commit was measured and the tracker's
    issues belong in the commit messages, and one machine's paths nowhere."""
    text = doc.read_text()
    assert not commit_hashes(text), commit_hashes(text)
    assert not re.findall(r".{0,40}\bissues?\b.{0,40}", text, re.IGNORECASE)
    absolute = machine_paths(text, "work|home|root|srv|mnt")  # /tmp/... is every reader's scratch
    assert not absolute, absolute
    for machine_specific in ("/bench.lock", "autogroup", "this branch", "this session", "engineers' jobs"):
        assert machine_specific not in text, machine_specific


def test_performance_page_is_current_numbers_not_a_diary():
    text = (ROOT / "docs" / "performance.md").read_text()
    assert len(text.splitlines()) <= 400
    dated = [h for h in re.findall(r"^#+ .*$", text, re.M) if re.search(r"\b20\d\d-\d\d-\d\d\b", h)]
    assert not dated, dated  # dates belong to each row, not to section headings


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation but '-' and '_' dropped,
    each space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # no headings inside code
    return {anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_anchor():
    assert anchor("The simulator's `--workers` on a shared 2-core machine") == \
        "the-simulators---workers-on-a-shared-2-core-machine"
    assert anchor("Device (GPU)") == "device-gpu" and anchor("The README's table") == "the-readmes-table"


@pytest.mark.parametrize("doc", [ROOT / "README.md", *USER_PAGES], ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(doc):
    """Every relative link of the page names a file of the checkout, and a #section of a Markdown
    file one of its headings (a page rewritten must not leave other pages pointing at nothing)."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, _, section = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif section and dest.suffix == ".md" and section not in anchors(dest):
            broken.append(target)
    assert not broken, broken
