"""The documentation cannot rot: its shell blocks run as written, its links resolve, its results say where from.

Markers (docs/index.md, "Writing docs"): a ```sh block is runnable unless its first line is
``# not run: <reason>``. A block that must fail starts with ``# expect exit N``; each ``# error: TEXT``
line in it is the line ``error: TEXT`` that its stderr must hold (TEXT ending in ``...``: a prefix). A block runs under
``bash -e -o pipefail`` (its status is the first failing command's) with a hard timeout, two at a time,
each in a fresh temporary folder holding a copy of README.md, docs/ and experiments/ (what the commands read from the
repository root, where a user who cloned the repository runs them), with the venv's bin first on PATH and
the repository on PYTHONPATH: the commands run as written, and nothing is written into the repository.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages other branches add; a link to one is allowed while it is missing. Empty it once they are merged
# (test_pending_pages_are_still_missing fails as soon as one exists, to say so).
PENDING: set[str] = set()  # pages linked before they exist (a page being written on another branch); none now
COPIED = ("README.md", "docs", "experiments")  # what a block may read relative to the repository root
TIMEOUT_S = 120  # per block, with room for a busy 2-core machine
WORKERS = 2  # blocks run at a time, each in its own folder (torchrun --standalone picks a free port)
README_MAX_LINES = 250
HISTORY = ROOT / "docs" / "results" / "history.md"  # the frozen notebook: not written by an experiment

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_NOT_RUN = re.compile(r"^# not run: \S")
_EXPECT = re.compile(r"^# expect exit (\d+)$")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    lines: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    """Every fenced code block of a page, its lines without the fence's own indent."""
    out, lines, i = [], page.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, start, body = len(m.group(1)), i, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())  # the fence's indent off
            i += 1
        assert i < len(lines), f"{page.relative_to(ROOT)}:{start + 1}: a code block is never closed"
        out.append(Block(page, start + 1, m.group(2), tuple(body)))
        i += 1
    return out


def _sh_blocks() -> list[Block]:
    return [b for page in PAGES for b in _blocks(page) if b.lang == "sh"]


def _runnable() -> list[Block]:
    return [b for b in _sh_blocks() if not (b.lines and _NOT_RUN.match(b.lines[0]))]


def _prose(page: Path) -> str:
    """The page without its fenced blocks and inline code, where a link is text, not a link."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^(\s*)```.*?^\s*```\s*$", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def _links(page: Path) -> list[str]:
    prose = _prose(page)
    return _LINK.findall(prose) + _REF_LINK.findall(prose)


def _local_target(page: Path, link: str) -> str | None:
    """The repository-relative path a relative link points at; None for a URL or an anchor on the page."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", link) or link.startswith("#"):
        return None
    path = (page.parent / link.split("#", 1)[0]).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)  # outside the repository: reported as missing unless it exists


# -- fast checks: structure and links ------------------------------------------------------------------------


def test_readme_is_short_and_starts_with_the_two_setup_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, more than {README_MAX_LINES}"
    first = _blocks(ROOT / "README.md")[0]
    commands = [x for x in first.lines if x.strip() and not x.lstrip().startswith("#")]
    assert [c.split()[:2] for c in commands[:2]] == [["make", "demo"], ["make", "test"]]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    missing = []
    for link in _links(page):
        target = _local_target(page, link)
        if target is not None and target not in PENDING and not (ROOT / target).exists():
            missing.append(link)
    assert not missing, f"{page.relative_to(ROOT)}: links to missing files: {missing}"


def test_pending_pages_are_still_missing():
    present = sorted(p for p in PENDING if (ROOT / p).exists())
    assert not present, f"now in the repository, remove from PENDING in tests/test_docs.py: {present}"


def test_every_docs_page_is_listed_in_the_index():
    index = ROOT / "docs" / "index.md"
    linked = {_local_target(index, link) for link in _links(index)}
    pages = {p.relative_to(ROOT).as_posix() for p in PAGES if p.parent != ROOT and p != index}
    assert sorted(pages - linked) == []


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "results").glob("*.md")), ids=lambda p: p.name)
def test_results_page_says_which_command_wrote_it_when_and_where(page):
    if page == HISTORY:
        assert "frozen" in page.read_text(encoding="utf-8").split("\n\n", 2)[1]
        return
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# ") and lines[1] == ""
    m = re.fullmatch(r"- Command: `python (experiments/\S+\.py) (.*)`", lines[2])
    assert m, f"{page.name}: line 3 is not the command that wrote it: {lines[2]!r}"
    assert (ROOT / m.group(1)).is_file()
    assert f"--markdown docs/results/{page.name}" in m.group(2), "the command must rewrite this very page"
    assert re.fullmatch(r"- Date: \d{4}-\d\d-\d\d \d\d:\d\d UTC", lines[3])
    assert re.fullmatch(r"- Machine: .+ \d+ logical cores, .*Python 3\.\S+, torch .+, simpy .+", lines[4])


def test_markers_are_well_formed():
    """A `# not run:` block gives its reason; `# expect exit` is a number; no other fence language runs."""
    bad = []
    for b in _sh_blocks():
        first = b.lines[0] if b.lines else ""
        if first.startswith("# not run") and not _NOT_RUN.match(first):
            bad.append(f"{b.name}: {first!r} (write '# not run: <reason>')")
        if first.startswith("# expect") and not _EXPECT.match(first):
            bad.append(f"{b.name}: {first!r} (write '# expect exit N')")
        if not [x for x in b.lines if x.strip() and not x.lstrip().startswith("#")]:
            bad.append(f"{b.name}: no command")
    for page in PAGES:  # a shell block under another name would escape this test
        bad += [f"{b.name}: ```{b.lang} (use ```sh)" for b in _blocks(page) if b.lang in ("bash", "shell", "console")]
    assert bad == []


# -- slow: every runnable block runs ------------------------------------------------------------------------


def _repo_state() -> list[str]:
    """What git sees in the working tree, the ignored files included (less the venv and caches)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    skip = (".venv/", ".pytest_cache/", ".hypothesis/", ".ruff_cache/", "schedlab.egg-info/")
    return [x for x in out.splitlines() if not x[3:].startswith(skip) and "__pycache__/" not in x]


@dataclass(frozen=True)
class Ran:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str


def _run(block: Block, folder: Path) -> Ran:
    for name in COPIED:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, folder / name)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", "\n".join(block.lines)], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # something outside the tree still holds the pipes: stop reading
            proc.kill()
            out, err = "", ""
        return Ran(None, out, err)
    return Ran(proc.returncode, out, err)


def _kill_tree(pid: int) -> None:
    """SIGKILL a block's processes: its session, and every descendant (torchrun starts each worker in a session
    of its own, so killing the session alone would leave the workers holding the block's output pipes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@pytest.fixture(scope="session")
def block_runs(request, tmp_path_factory) -> tuple[dict[Block, Ran], list[str]]:
    """Every selected block, run two at a time (each in its own folder), and what they wrote into the repository."""
    selected = [item.callspec.params["block"] for item in request.session.items
                if hasattr(item, "callspec") and "block" in item.callspec.params] or _runnable()
    folders = [tmp_path_factory.mktemp("block") for _ in selected]
    before = _repo_state()
    with ThreadPoolExecutor(WORKERS) as pool:
        ran = dict(zip(selected, pool.map(_run, selected, folders), strict=True))
    return ran, sorted(set(_repo_state()) ^ set(before))


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first one's set-up runs every block (TIMEOUT_S each at most), two at a time
@pytest.mark.parametrize("block", _runnable(), ids=lambda b: b.name)
def test_shell_block_runs_as_documented(block, block_runs):
    done = block_runs[0][block]
    m = _EXPECT.match(block.lines[0]) if block.lines else None
    expected = int(m.group(1)) if m else 0
    errors = [x[len("# "):] for x in block.lines if x.startswith("# error: ")]  # the line as printed
    assert done.returncode is not None, (f"{block.name}: no end within {TIMEOUT_S} s; mark it "
                                         f"'# not run: <reason>' or make it shorter")
    assert done.returncode == expected, (f"{block.name}: exit {done.returncode}, documented {expected}\n"
                                         f"stderr: {done.stderr[-3000:]}")
    assert "Traceback (most recent call last)" not in done.stderr, (f"{block.name}: a documented command printed a "
                                                                   f"traceback:\n{done.stderr[-3000:]}")
    got = done.stderr.splitlines()
    for want in errors:
        hit = [g for g in got if (g.startswith(want[:-3]) if want.endswith("...") else g == want)]
        assert hit, f"{block.name}: stderr lacks the documented line {want!r}; it was:\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_shell_blocks_write_nothing_into_the_repository(block_runs):
    _, written = block_runs
    assert written == [], f"the repository changed while the docs' blocks ran (a block wrote, or an edit): {written}"


# -- the checker itself, on pages written here -----------------------------------------------------------------


def test_blocks_keep_their_lines_less_the_fences_indent(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n\n```sh\n# not run: why\ncat <<'EOF'\n  two spaces\nEOF\n```\n\n"
                    "- item:\n\n  ```sh\n  # expect exit 2\n  false\n  ```\n\n```python\nx = 1\n```\n")
    assert [(b.line, b.lang, b.lines) for b in _blocks(page)] == [
        (3, "sh", ("# not run: why", "cat <<'EOF'", "  two spaces", "EOF")),
        (12, "sh", ("# expect exit 2", "false")),
        (17, "python", ("x = 1",)),
    ]


def test_links_in_code_are_not_links_and_urls_and_anchors_are_not_files(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[a](a.md) ![img](pics/b.png \"title\") `[c](c.md)` [d](https://x.org/d.md) [e](#here)\n"
                    "```\n[f](f.md)\n```\n[g]: g.md#part\n")
    assert _links(page) == ["a.md", "pics/b.png", "https://x.org/d.md", "#here", "g.md#part"]
    assert [_local_target(ROOT / "docs" / "index.md", x) for x in _links(page)] == [
        "docs/a.md", "docs/pics/b.png", None, None, "docs/g.md"]
