"""README.md and the pages under docs/ cannot rot unnoticed.

Four checks, each over every page, each failure naming the page, the line and the bad item:

* every relative link resolves to a file of the repository, and its `#anchor` to a heading of
  the target page (GitHub's slugs: lower case, spaces to '-', punctuation other than '-' and
  '_' dropped, '-1', '-2' ... for repeated headings);
* every `credit ...` command in a shell code block (```bash, ```sh, ```console or a bare
  ```) goes through the CLI's own argument parsing and config composition (`credit.cli.main`
  with the parts that would train, convert, trace or write replaced by stubs): a real
  subcommand, only options it accepts, overrides naming keys that exist, values the
  validation accepts. A command followed by an `error: ...` output line must fail with that
  line. Nothing is trained or written;
* every config key in the first column of a `| key | ...` table exists in the composed config
  (of some model type);
* every repository path a page names (`credit/...`, `tests/...`, `docs/...`,
  `benchmarks/...`, `manual_tests/...`, `applications/...`, `.ci/...`; globs and `{a,b}`
  alternatives expanded) exists, and so does every benchmark result file named bare.

`test_each_check_catches_what_it_should` feeds each check a page with one fault of each kind.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shlex
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# Paths of NCAR CREDIT's own repository that the pages name as CREDIT's (its package is also
# called `credit`): not files of this one.
CREDIT_REPOSITORY_PATHS = {"credit/parser.py", "credit/forecast.py", "credit/metadata/total_solar_irradiance_CMIP6_49r1.nc",
                           "credit/metadata/ERA5_Lev_Info.nc"}

# A command's `--credit-config FILE` that is no file here (the user's CREDIT config) is read as
# this one, the `model:` section of a CREDIT nextgen_wxformer made with CREDIT's code (small:
# CREDIT's parameter count is computed on the meta device for every such command), so the
# rest of the command is composed as the CLI composes it.
CREDIT_CONFIG_STAND_IN = "tests/fixtures/credit_reference/wxformer_next_linear/model.yml"

# Tokens that stand for "more of the same" in a command: dropped before it is parsed.
PLACEHOLDER_TOKENS = {"...", "KEY=VALUE"}

# Shell lines with a `credit` command that cannot be parsed as a command (an `<...>` placeholder
# or an optional `[...]` group): listed by the command test, and at most this many.
MAX_SKIPPED_COMMANDS = 0


# ----------------------------------------------------------------------------- reading pages

@dataclass
class Page:
    name: str  # as failures print it, relative to the repository
    base: Path  # the folder its relative links start from
    lines: list[str]


def load(path: Path) -> Page:
    return Page(str(path.relative_to(REPO)), path.parent, path.read_text().splitlines())


FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


@dataclass
class Block:
    info: str  # the fence's language, "" for a bare fence
    start: int  # line number (1-based) of its first content line
    lines: list[str]


def split_page(page: Page) -> tuple[list[tuple[int, str]], list[Block]]:
    """(numbered prose lines, fenced code blocks)."""
    prose, blocks, block, fence = [], [], None, ""
    for number, line in enumerate(page.lines, 1):
        match = FENCE.match(line)
        if block is None and match:
            fence, block = match.group(1), Block(match.group(2).lower(), number + 1, [])
        elif block is not None and line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            blocks.append(block)
            block = None
        elif block is not None:
            block.lines.append(line)
        else:
            prose.append((number, line))
    return prose, blocks


CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Page) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in split_page(page)[0]:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


# ----------------------------------------------------------------------------- links

LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def link_problems(page: Page) -> list[str]:
    problems = []
    for number, line in split_page(page)[0]:
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path_part, _, anchor = target.partition("#")
            where = f"{page.name}:{number}: link ({target})"
            if path_part:
                path = (page.base / path_part).resolve()
                if not path.exists():
                    problems.append(f"{where}: no file {path_part} relative to {page.name}")
                    continue
                if REPO not in path.parents and path != REPO:
                    problems.append(f"{where}: {path_part} lies outside the repository")
                    continue
                target_page = load(path) if anchor and path.suffix == ".md" else None
            else:
                target_page = page
            if anchor and target_page is not None and anchor not in anchors(target_page):
                problems.append(f"{where}: no heading with anchor #{anchor} in {target_page.name}")
    return problems


# ----------------------------------------------------------------------------- paths

PATH = re.compile(r"(?<![\w./-])((?:credit|tests|docs|benchmarks|manual_tests|applications|\.ci)/[\w.*{},/-]*)")
RESULT_NAME = re.compile(r"`(_?[\w.-]+_[\w.-]+\.(?:md|log))`")  # a results file named without its folder


def _expand(pattern: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [alt for choice in match.group(1).split(",")
            for alt in _expand(pattern[:match.start()] + choice + pattern[match.end():])]


def _exists(root: Path, pattern: str) -> bool:
    if any(c in pattern for c in "*?["):
        return any(root.glob(pattern))
    return (root / pattern).exists()


def path_problems(page: Page, root: Path = REPO) -> list[str]:
    problems = []
    results = {p.name for p in (root / "benchmarks" / "results").iterdir()}
    families = {name.split("_")[0] for name in results}  # gemm_..., determinism_..., kit_...
    pages = {p.name for p in (root / "docs").glob("*.md")}
    for number, line in enumerate(page.lines, 1):
        line = re.sub(r"\]\([^)]*\)", "]", line)  # a link's target is relative to the page: checked as a link
        for found in PATH.findall(line):
            path = found.rstrip(".,;:")
            if path.rstrip("/") in ("credit", "tests", "docs", "benchmarks") or path in CREDIT_REPOSITORY_PATHS:
                continue
            for one in _expand(path):
                if not _exists(root, one.rstrip("/")):
                    problems.append(f"{page.name}:{number}: path {one} does not exist in the repository")
        for name in RESULT_NAME.findall(line):
            if name.startswith("_"):  # the end of one: `_bf16.md` after `plan_wxformer_0.25deg_fp32.md`
                ok = any(result.endswith(name) for result in results)
            elif name.split("_")[0] in families:
                ok = name in results or name in pages
            else:
                continue  # not a benchmark result's name
            if not ok:
                problems.append(f"{page.name}:{number}: results file {name} is not in benchmarks/results/")
    return problems


# ----------------------------------------------------------------------------- key tables

ROOTS = ("run_dir", "model", "data", "trainer", "rollout", "diagnostics")


def table_keys(page: Page) -> Iterator[tuple[int, str]]:
    """The config keys in the first column of every `| key | ...` table: `{a,b}` expanded, a
    leading `.x` relative to the key before it, `.*` kept as a prefix; `+key=value` examples
    and keys of other roots (relative ones, CREDIT's) left out."""
    in_table = False
    for number, line in split_page(page)[0]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if not cells:
            in_table = False
            continue
        if cells[0] == "key":
            in_table = True
            continue
        if not in_table or set(cells[0]) <= set("-: "):
            continue
        previous = ""
        for entry in re.findall(r"`([^`]+)`", cells[0]):
            if entry.startswith("+") or "=" in entry:
                continue
            if entry.startswith(".") and previous:
                entry = previous.rsplit(".", 1)[0] + entry
            for key in _expand(entry):
                previous = key
                if key.split(".")[0] in ROOTS:
                    yield number, key


def key_problems(page: Page, configs) -> list[str]:
    """`configs`: the composed config of every model type (a key of any one exists)."""
    from omegaconf import OmegaConf

    missing = object()
    problems = []
    for number, key in table_keys(page):
        path = key.removesuffix(".*")
        if all(OmegaConf.select(cfg, path, default=missing) is missing for cfg in configs):
            problems.append(f"{page.name}:{number}: config key {key} is in no model's composed config")
    return problems


@pytest.fixture(scope="module")
def model_configs():
    from credit.config import compose_config
    from credit.config.schema import MODEL_SCHEMAS

    return [compose_config([f"model={name}"]) for name in MODEL_SCHEMAS]


# ----------------------------------------------------------------------------- commands

SHELL = {"", "bash", "sh", "shell", "console"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
ERROR_LINE = re.compile(r"^(credit [\w -]+: )?error:")  # `error: ...`, or argparse's `credit data generate: error: ...`


@dataclass
class Command:
    line: int
    text: str  # the command as written (continuations joined, comment dropped)
    argv: list[str] | None  # the arguments of `credit`; None: skipped, `why` says why
    expect_error: str | None = None  # the `error: ...` line the page shows after it
    why: str = ""


def _logical_lines(block: Block) -> Iterator[tuple[int, str]]:
    pending, start = "", 0
    for offset, line in enumerate(block.lines):
        if not pending:
            start = block.start + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def _credit_argv(tokens: list[str]) -> list[str] | None:
    """The arguments to `credit` of one simple command, or None if it runs something else."""
    while tokens and (ENV_ASSIGNMENT.match(tokens[0]) or tokens[0] == "time"):
        tokens = tokens[1:]
    if not tokens:
        return None
    head, rest = tokens[0], tokens[1:]
    if head == "credit" or head.endswith("/credit"):
        return rest
    if head == "torchrun" or re.fullmatch(r"(\S*/)?python3?", head):
        while rest and rest[0].startswith("--") and head == "torchrun":  # torchrun's own options
            rest = rest[1:] if "=" in rest[0] or rest[0] == "--standalone" else rest[2:]
        if rest[:2] == ["-m", "credit.cli"]:
            return rest[2:]
        if rest and rest[0] in ("applications/train.py", "applications/rollout.py"):
            return ["check", *rest[1:]]  # a @hydra.main script: the same overrides, composed
    return None


def shell_commands(page: Page) -> list[Command]:
    """Every `credit` command in the page's shell blocks. In a block with `$ ` prompts only
    the prompted lines are commands and the rest is their output."""
    found = []
    for block in split_page(page)[1]:
        if block.info not in SHELL:
            continue
        prompted = any(line.lstrip().startswith("$ ") for line in block.lines)
        last: Command | None = None
        for number, line in _logical_lines(block):
            stripped = line.strip()
            if prompted and not stripped.startswith("$ "):
                if last is not None and last.expect_error is None and stripped:
                    last.expect_error = stripped if ERROR_LINE.match(stripped) else ""
                continue
            stripped = stripped.removeprefix("$ ")
            last = None
            for part in re.split(r"\s(?:&&|\|\||;|\|)\s", re.sub(r"\$\([^)]*\)", " ", stripped)):
                try:
                    tokens = shlex.split(part, comments=True)
                except ValueError as error:
                    tokens = part.split()
                    if _credit_argv(tokens) is not None:
                        found.append(Command(number, part, None, why=f"cannot split: {error}"))
                    continue
                argv = _credit_argv(tokens)
                if argv is None:
                    continue
                text = " ".join(tokens)
                if any(t.startswith(("<", "[")) or t.endswith((">", "]")) and "=" not in t for t in argv):
                    found.append(Command(number, text, None, why="a <placeholder> or an optional [group]"))
                    continue
                last = Command(number, text, [t for t in argv if t not in PLACEHOLDER_TOKENS])
                found.append(last)
    return found


@pytest.fixture(scope="module")
def run_cli():
    """`credit.cli.main` with everything after parsing and composition stubbed out: returns
    (exit code, the `error:` line or "")."""
    import credit.interop.checkpoint_import as from_credit
    import credit.checkpoint.weights as weights
    import credit.cli as cli
    import credit.config.load as load
    import credit.interop.generate_gen2 as gen2
    import credit.interop.generate_gen1 as gen1
    import credit.interop.generate_like as like
    import credit.data.generate_command as generate  # the command, with the generator it calls
    import credit.data.stats as stats
    import credit.diagnostics.probe as probe
    import credit.plan.cli as plan_cli
    import credit.plan.report as plan_report
    import credit.rollout as rollout
    import credit.train as train
    import torch
    from credit.config import compose_config

    def written(out):  # what a conversion writes, for the page's later commands to read
        if Path.cwd() in Path(out).resolve().parents:
            Path(out).mkdir(parents=True)

    def convert_credit(credit_config, source, out, extra=()):
        _, refused, overrides = from_credit.describe_credit_model(credit_config)
        if refused:
            raise ValueError(refused[0])
        compose_config([*overrides, *extra])
        written(out)
        return overrides

    load.register_configs()  # the schema is stored once; composing need not store it again
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # convert-checkpoint and sdc-probe set up logging
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load, "register_configs", lambda: None)
        mp.setattr(cli, "_launch", lambda *args, **kwargs: None)
        mp.setattr(train, "run_training", lambda cfg: None)
        mp.setattr(rollout, "run_rollout", lambda cfg: None)
        mp.setattr(from_credit, "convert_credit_checkpoint", convert_credit)
        mp.setattr(weights, "convert_checkpoint", lambda source, out, cfg: written(out))
        mp.setattr(probe, "run_probe", lambda *args: 0)
        # the model is built (on the meta device) and traced per layout: slow, and past parsing
        mp.setattr(plan_report, "build_model", lambda *args, **kwargs: torch.nn.Linear(1, 1))
        mp.setattr(plan_report, "_row", lambda overrides, shapes, world, layout, batch, accum:
                   plan_report.Row(layout))
        mp.setattr(plan_cli, "render", lambda *args: "")
        for module, name in ((generate, "generate_dataset"), (gen1, "generate_credit_gen1"),
                             (gen2, "generate_credit_gen2")):
            mp.setattr(module, name, lambda out, **kwargs: Path(out))
        mp.setattr(like, "generate_like", lambda config_file, out, **kwargs: Path(out) / Path(config_file).name)
        mp.setattr(stats, "write_statistics", lambda data, **kwargs: dict(
            mean="mean.nc", std="std.nc", variables=0, period="", files=[], skipped={}))

        def run(argv: list[str]) -> tuple[int, str]:
            if "--credit-config" in argv[:-1]:
                at = argv.index("--credit-config") + 1
                if not Path(argv[at]).is_file():
                    argv = [*argv[:at], CREDIT_CONFIG_STAND_IN, *argv[at + 1:]]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = cli.main(argv)
                except SystemExit as exit_:  # argparse's --help and usage errors
                    code = exit_.code if isinstance(exit_.code, int) else 2
            errors = [line for line in err.getvalue().splitlines() if ERROR_LINE.match(line)]
            return code, errors[0] if errors else ""

        yield run
    root.handlers[:], root.level = handlers, level


def _matches(shown: str, printed: str) -> bool:
    """`printed` is the line the page shows, where the page's `...` stands for anything."""
    pattern = ".*".join(re.escape(piece) for piece in shown.split("..."))
    return re.fullmatch(pattern, printed) is not None


@contextlib.contextmanager
def page_folder() -> Iterator[None]:
    """Run a page's commands in a fresh folder that shows the repository's files: what a
    command writes (a converted checkpoint) is there for the page's later commands only."""
    back = Path.cwd()
    with tempfile.TemporaryDirectory() as folder:
        for entry in REPO.iterdir():
            if entry.name not in (".git", ".venv"):
                (Path(folder) / entry.name).symlink_to(entry)
        os.chdir(folder)
        try:
            yield
        finally:
            os.chdir(back)


def command_problems(page: Page, run) -> tuple[list[str], list[str]]:
    """(problems, skipped lines)."""
    with page_folder():
        return _command_problems(page, run)


def _command_problems(page: Page, run) -> tuple[list[str], list[str]]:
    problems, skipped = [], []
    for command in shell_commands(page):
        where = f"{page.name}:{command.line}: `{command.text}`"
        if command.argv is None:
            skipped.append(f"{where}: {command.why}")
            continue
        code, error = run(command.argv)
        if command.expect_error:
            if code == 0:
                problems.append(f"{where}: the page shows `{command.expect_error}`, the command succeeds")
            elif not _matches(command.expect_error, error):
                problems.append(f"{where}: the page shows `{command.expect_error}`, the command prints `{error}`")
        elif code != 0:
            problems.append(f"{where}: exit {code}: {error or '(no error line)'}")
    return problems, skipped


# ----------------------------------------------------------------------------- the tests

def test_every_page_is_checked():
    names = [load(p).name for p in PAGES]
    assert "README.md" in names and "docs/README.md" in names, names
    index = load(REPO / "docs" / "README.md")
    listed = {target.partition("#")[0] for _, line in split_page(index)[0] for target in LINK.findall(line)}
    missing = [p.name for p in PAGES if p.parent == REPO / "docs" and p.name != "README.md" and p.name not in listed]
    assert not missing, f"docs/README.md does not list: {missing}"


def test_links_and_anchors_resolve():
    problems = [p for path in PAGES for p in link_problems(load(path))]
    assert not problems, "\n".join(problems)


def test_repository_paths_exist():
    problems = [p for path in PAGES for p in path_problems(load(path))]
    assert not problems, "\n".join(problems)


def test_config_key_tables_name_existing_keys(model_configs):
    problems = [p for path in PAGES for p in key_problems(load(path), model_configs)]
    assert not problems, "\n".join(problems)


def test_credit_commands_parse_and_compose(run_cli):
    problems, skipped = [], []
    for path in PAGES:
        found, left = command_problems(load(path), run_cli)
        problems += found
        skipped += left
    assert not problems, "\n".join(problems)
    assert len(skipped) <= MAX_SKIPPED_COMMANDS, "commands that could not be checked:\n" + "\n".join(skipped)


BROKEN = """# A page

## Set up, run: `make`

[fine](#set-up-run-make) [no such anchor](#set-up) [no file](docs/nothing.md)
[no heading there](README.md#no-such-heading) [fine](https://example.org/x#y)

`credit/no_such_module.py`, `benchmarks/results/determinism_{single,nowhere}_cpu.md`,
`benchmarks/results/nothing_*.md` and `gemm_nowhere_cpu.md`; `credit/cli.py` is fine.

```bash
credit train trainer.max_steps=5 \\
    trainer.max_stepz=5          # a key that does not exist
credit trian                     # no such command
credit plan --gpu 4              # no such option
credit data generate --out /tmp/x --grid 32by64
credit check model.dim_head=7
credit check trainer.max_steps=5 ...
```

```
$ credit check trainer.max_steps=3
error: a failure that does not happen
$ credit check model.dim_head=7
error: model.dim_head=7 is invalid: ... (model.dim[0]=1024)
```

| key | meaning |
| --- | --- |
| `trainer.max_stepz` | a key that does not exist |
| `trainer.checkpoint.every_n_steps`, `.keep_latest_k` | fine |
| `trainer.optimizer.{lr,betaz}` | one of two does not exist |
| `model.post_conf.*`, `+trainer.loss.variable_weights.T=2` | fine |

```sh
credit train [--nproc N] trainer.max_steps=5   # a synopsis, not a command: counted as skipped
```
"""


def test_each_check_catches_what_it_should(run_cli, model_configs):
    page = Page("broken.md", REPO, BROKEN.splitlines())
    keys = key_problems(page, model_configs)
    assert [p.split(": ", 1)[0] for p in keys] == ["broken.md:30", "broken.md:32"], keys
    assert "trainer.max_stepz" in keys[0] and "trainer.optimizer.betaz" in keys[1], keys

    links = link_problems(page)
    assert [p.split(": link ")[1].split(")")[0] for p in links] == \
        ["(#set-up", "(docs/nothing.md", "(README.md#no-such-heading"], links
    assert all(p.startswith("broken.md:5:") or p.startswith("broken.md:6:") for p in links), links

    paths = path_problems(page)
    assert len(paths) == 4 and all(p.startswith("broken.md:8:") or p.startswith("broken.md:9:") for p in paths), paths
    assert any("credit/no_such_module.py" in p for p in paths)
    assert any("determinism_nowhere_cpu.md" in p for p in paths)
    assert any("nothing_*.md" in p for p in paths)
    assert any("gemm_nowhere_cpu.md" in p for p in paths)

    problems, skipped = command_problems(page, run_cli)
    assert len(skipped) == 1 and skipped[0].startswith("broken.md:36:") and "[--nproc" in skipped[0], skipped
    expected = {12: "max_stepz", 14: "trian", 15: "--gpu", 16: "32by64", 17: "model.dim_head=7",
                22: "succeeds", 24: "model.dim[0]=32"}
    assert len(problems) == len(expected), "\n".join(problems)
    for problem, (line, word) in zip(problems, expected.items()):
        assert problem.startswith(f"broken.md:{line}:") and word in problem, problem
