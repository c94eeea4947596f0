"""The tree's shape (issue 44): the root is the core, and nothing else.

The core is every Python file at the top of the repository and effectdrill/: what `make starter`
copies byte for byte. The lessons' code lives in labs/, the tools in tools/. The arrows point one
way: labs/ imports the core, tools/ imports both, the core imports neither and names no lab file.
Each core file stays short enough to read (workflow.py, the first a learner reads, shortest), and
no two classes or functions of the product code share a name. Plain AST walks: no import runs.
"""

import ast
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tools import starter
from tools.local import ROOT

pytestmark = pytest.mark.fast

CACHES = {"__pycache__", ".ruff_cache", ".pytest_cache"}  # made by running things, never copied

# The issue's limits, "about" each, with 5% slack: 450 -> 472, 500 -> 525. workflow.py's "about
# 200" is 220, the figure the redesign was briefed with.
CORE_LINES = 472
WORKFLOW_LINES = 220
LESSON_LINES = 525

# Names more than one module may define: each program's entry point, and the names a drill
# adapter module is pointed at (`effectdrill MODULE:GRAPH --observe MODULE:observe --context
# MODULE:context`; GRAPH a compiled graph, or a function that builds one). A drill example's
# graphs are typed by name too (lab 16 `classify:naive`, lab 20 `assistant:fixed`), and each
# example's `connect` opens its own database.
SHARED_NAMES = {"main", "graph", "build", "observe", "context", "naive", "fixed", "connect"}

# Commit subjects at most 72 characters, from this commit on (the last before issue 44's work).
SUBJECT_BASE = "09f559f"
SUBJECT_LIMIT = 72


def files_under(folder):
    """Every file under folder, relative, sorted, caches left out."""
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and not CACHES & set(p.relative_to(folder).parts)
    )


def the_core():
    """The core, read off the tree (not from tools/starter.py): the top's Python files and
    every file of effectdrill/."""
    top = [p.name for p in ROOT.iterdir() if p.is_file() and p.suffix == ".py"]
    return sorted(top + [f"effectdrill/{name}" for name in files_under(ROOT / "effectdrill")])


def python_files(*folders):
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py") if p.is_file())


def core_python():
    return [ROOT / name for name in the_core() if name.endswith(".py")]


def lesson_python():
    return python_files("labs")


def tool_python():
    return python_files("tools")


def rel(path):
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def imports(path):
    """(line, module) for each module path imports, absolute: a relative import within
    effectdrill/ or labs/ is resolved against its package."""
    package = path.relative_to(ROOT).parent.parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
    return found


def lab_module_names():
    """Top-level names under which the lab's non-core code imports: its packages (labs, tools,
    tests, ...) and the modules tests/ puts on sys.path (conftest, the helpers, the test
    graphs)."""
    names = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and any(p.rglob("*.py"))
    }
    tests = ROOT / "tests"
    names |= {p.stem for p in tests.glob("*.py")}
    names |= {p.name for p in tests.iterdir() if (p / "__init__.py").is_file()}
    return names - {"effectdrill"}


def offending_imports(paths, forbidden):
    return [
        f"{rel(path)}:{line}: imports {module}"
        for path in paths
        for line, module in imports(path)
        if module.split(".")[0] in forbidden
    ]


# (a) `make starter` copies the core, and nothing else of the lab


def test_the_starter_is_exactly_the_core_and_its_own_files(tmp_path):
    """tools/starter.py's CORE is the tree's core; a starter written holds the core byte for
    byte and the starter's own files (tools/starter/), no other file of the lab."""
    core, own = the_core(), files_under(starter.OWN)
    assert list(starter.CORE) == core
    assert not set(core) & set(own), "a starter's own file would overwrite a core file"
    dest = tmp_path / "starter"
    written = starter.write_starter(dest)
    assert written == files_under(dest) == sorted(core + own)
    changed = [n for n in core if (dest / n).read_bytes() != (ROOT / n).read_bytes()]
    changed += [n for n in own if (dest / n).read_bytes() != (starter.OWN / n).read_bytes()]
    assert not changed, f"not copied byte for byte: {changed}"


def test_the_core_has_the_receiver_and_the_graph_at_the_top():
    assert {"api.py", "workflow.py", "effects.py", "effectdrill/__init__.py"} <= set(the_core())
    names = {p.stem for p in core_python() if p.parent == ROOT}
    vague = names & {"plumbing", "utils", "helpers", "misc", "common"}
    assert not vague, f"core files whose names say nothing of what they hold: {sorted(vague)}"


# (b) no core file imports or names a lab file

PATH = re.compile(  # a file or folder name as written in text: a/b/c.py, name.md, a/b/
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:py|md|ya?ml|toml|txt|in|sh|json|html))\b"
    r"|(?<![\w/.-])((?:[\w-][\w.-]*/)+)"
)
MODULE = re.compile(r"\b(?:labs|tools|tests)\.[a-z_]\w*|\blab\.py\b")


def lab_files_named(label, text, starter_files):
    """'label:line: names X' for each file or module of the lab (one the starter lacks) that
    text names."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATH.finditer(line):
            name = (match.group(1) or match.group(2)).rstrip("/")
            here = [name, str(Path(label).parent / name)]  # from the top, or beside label
            if name.startswith(".venv") or any(n in starter_files for n in here):
                continue
            if any(f.startswith(f"{n}/") for n in here for f in starter_files):
                continue  # a folder the starter has too (tests/, effectdrill/)
            if any((ROOT / n).exists() for n in here):
                found.append(f"{label}:{number}: names {name}")
        found += [f"{label}:{number}: names {m}" for m in MODULE.findall(line)]
    return found


def test_no_core_file_imports_the_lab():
    found = offending_imports(core_python(), lab_module_names())
    assert not found, "the core imports the lab:\n" + "\n".join(found)


def test_no_core_file_names_a_lab_file():
    """A core file's text (code, comments, effectdrill's README) names no file the starter
    lacks: a copier would look for it in vain."""
    starter_files = set(the_core()) | set(files_under(starter.OWN))
    found = [
        hit
        for name in the_core()
        for hit in lab_files_named(name, (ROOT / name).read_text(encoding="utf-8"), starter_files)
    ]
    assert not found, "core files name the lab's files:\n" + "\n".join(found)


def test_the_name_check_sees_a_lab_file_named():
    """The check above, on a text naming a lesson module, a tool, a test folder and a core
    file (which it lets be)."""
    text = "labs/receiver.py and effectdrill/api.py,\n`python -m tools.bench`, tests/effectdrill/"
    found = lab_files_named("x.py", text, {"effectdrill/api.py"})
    assert found == [
        "x.py:1: names labs/receiver.py",
        "x.py:2: names tests/effectdrill",
        "x.py:2: names tools.bench",
    ]


# (c) arrows one way


def test_the_lessons_import_the_core_and_the_lessons_never_the_tools():
    found = offending_imports(lesson_python(), lab_module_names() - {"labs"})
    assert not found, "labs/ imports what stands above it:\n" + "\n".join(found)


def test_the_tools_import_the_core_and_the_lessons_and_nothing_imports_the_tools():
    found = offending_imports(core_python() + lesson_python(), {"tools"})
    assert not found, "an arrow back to tools/:\n" + "\n".join(found)
    imported = {module.split(".")[0] for path in tool_python() for _, module in imports(path)}
    assert {"labs", "effectdrill", "workflow"} <= imported  # the tools stand on both


# (d) files short enough to read


def too_long(paths, limit):
    counts = {rel(p): len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {name: n for name, n in sorted(counts.items()) if n > limit}


def test_no_core_file_is_over_the_limit():
    over = too_long(core_python(), CORE_LINES)
    assert not over, f"core files over {CORE_LINES} lines: {over}"


def test_workflow_py_is_short():
    over = too_long([ROOT / "workflow.py"], WORKFLOW_LINES)
    assert not over, f"workflow.py, the first file a learner reads, over {WORKFLOW_LINES}: {over}"


def test_no_lesson_module_is_over_the_limit():
    over = too_long(lesson_python(), LESSON_LINES)
    assert not over, f"lesson modules over {LESSON_LINES} lines: {over}"


# (e) one name per thing


def product_python():
    """The product: the core, the lessons and the tools (the starter's own tests are a copier's
    tests, run in the starter)."""
    tools = [p for p in tool_python() if not p.is_relative_to(starter.OWN / "tests")]
    return core_python() + lesson_python() + tools


def defined_twice(paths):
    """Module-level class and function names defined in more than one file: name -> files."""
    where = defaultdict(list)
    for path in paths:
        for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                where[node.name].append(rel(path))
    return {name: files for name, files in sorted(where.items()) if len(set(files)) > 1}


def test_no_two_classes_or_functions_share_a_name():
    twice = {n: f for n, f in defined_twice(product_python()).items() if n not in SHARED_NAMES}
    lines = [f"{name}: {', '.join(files)}" for name, files in twice.items()]
    assert not twice, f"{len(twice)} names defined more than once:\n" + "\n".join(lines)


def test_the_name_check_finds_a_name_defined_twice(tmp_path):
    (tmp_path / "a.py").write_text("class Ledger: ...\ndef main(): ...\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("async def Ledger(): ...\ndef main(): ...\n", encoding="utf-8")
    found = defined_twice([tmp_path / "a.py", tmp_path / "b.py"])
    assert set(found) == {"Ledger", "main"}


# (f) commit subjects


def git(*args):
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60
    )


def test_no_commit_subject_is_over_72_characters():
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: no commits to read")
    if git("cat-file", "-e", f"{SUBJECT_BASE}^{{commit}}").returncode != 0:
        pytest.skip(f"{SUBJECT_BASE} is not in this clone (a shallow one?)")
    log = git("log", "--format=%H %s", f"{SUBJECT_BASE}..HEAD")
    assert log.returncode == 0, log.stderr
    long = [
        f"{line[:7]} ({len(line) - 41} characters): {line[41:]}"
        for line in log.stdout.splitlines()
        if len(line) - 41 > SUBJECT_LIMIT
    ]
    assert not long, "commit subjects over 72 characters:\n" + "\n".join(long)
