"""What the pages claim, checked against what was measured (the helpers of tests/test_pages.py).

* **One number per fact** (:func:`fact_offenders`): docs/facts.yaml states each cited number once, with its study,
  Holm family and source; a page's statement of a fact (found by the words before or after the number) must give
  that value to the digits it shows, and its [CI] the fact's CI. A number within 5 % of the value that disagrees is a
  contradiction; another run's value is accepted only on a line that names that run.
* **Claims no larger than their evidence** (:func:`claim_offenders`): "match(es)" with no equivalence test named in
  its sentence; a "trend" or a slope "per tenfold" without three or more points named in its sentence; one seed, or
  an undecided effect, called a finding ("helps", "rewards", "shows that") in its sentence, or one seed and a finding
  in a section that says "no claim" nowhere; "whatever the budget" (budgets are measured one at a time).
* **A table that agrees with its sections** (:func:`table_offenders`): every number of a row of answers.md's table
  appears, to the digits the row shows, in the section the row links to.
* **Trial folders as the code names them** (:func:`trial_path_offenders`): a page's ``runs/<study>_<preset>/…trial…``
  path matches a folder the sweep would make, derived from the study file and :func:`sweeps.run.trials.trial_folder`.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FACTS = ROOT / "docs" / "facts.yaml"
MINUS = str.maketrans({"−": "-", "+": ""})
NUMBER = r"[+−-]?\d+(?:,\d{3})*(?:\.\d+)?"
STATED = re.compile(
    rf"(?<![\w.,])(?P<num>{NUMBER})(?![\d.]\d)(?:,? (?:95 % CI |90 % CI |CI )?\[(?P<lo>{NUMBER}), (?P<hi>{NUMBER})\])?"
)
GAP = r"[^\d|]{0,12}"
NEAR = 0.05  # a stated number within 5 % of a fact's value is a statement of it


# ---------------------------------------------------------------------------------------------- one number per fact
def load_facts(path: Path = FACTS) -> dict:
    return yaml.safe_load(path.read_text())


def _decimal(text: str) -> Decimal:
    return Decimal(text.translate(MINUS).replace(",", ""))


def agrees(stated: str, value: float) -> bool:
    """A page's number agrees with a fact's value: the same digits where it shows as many or more, the value rounded
    (either way at a half) where it shows fewer."""
    x, v = _decimal(stated), Decimal(str(value))
    shown, known = -x.as_tuple().exponent, -v.as_tuple().exponent
    if shown >= known:
        return x == v
    return abs(x - v) <= Decimal(5) / Decimal(10) ** (shown + 1)


def _agrees_with(m: re.Match, value: float, ci) -> bool:
    if not agrees(m["num"], value):
        return False
    return m["lo"] is None or ci is None or (agrees(m["lo"], ci[0]) and agrees(m["hi"], ci[1]))


def _states(fact: dict, line: str, m: re.Match) -> bool:
    before, after = fact.get("before"), fact.get("after")
    return bool(
        (before and re.search(f"(?:{before}){GAP}$", line[: m.start()]))
        or (after and re.match(f"{GAP}(?:{after})", line[m.end() :]))
    )


def fact_offenders(pages: dict[str, str], facts: dict) -> list[str]:
    """(page:line: …) for every statement of a fact that disagrees with it, and every fact no page states."""
    found, stated = [], set()
    for name, text in pages.items():
        for number, line in paragraphs(text):
            for m in STATED.finditer(line):
                for key, fact in facts.items():
                    if not _states(fact, line, m):
                        continue
                    x, v = float(_decimal(m["num"])), fact["value"]
                    if abs(abs(x) - v) > NEAR * abs(v):
                        continue
                    runs = [fact] + [o for o in fact.get("others", []) if re.search(o["marker"], line)]
                    if any(_agrees_with(m, run["value"], run.get("ci")) for run in runs):
                        stated.add(key)
                    else:
                        found.append(f"{name}:{number}: {m.group(0)} states {key}, which is {v} {fact.get('ci', '')}")
    return found + [f"no page states {key}" for key in facts if key not in stated]


# ---------------------------------------------------------------------------------------------- claims and evidence
EQUIVALENCE = re.compile(r"on par|TOST|equivalen|within ±|within δ", re.IGNORECASE)
THREE_POINTS = re.compile(r"\b(?:three|four|five|six|[3-9]) (?:n|rungs|sizes|lengths|points|budgets)\b")
FINDING = re.compile(r"\b(?:helps|hurts|rewards?|shows that|proves)\b")
ONE_SEED = re.compile(r"\b(?:one|a single|1) seed\b(?! (?:of|in|per)\b)", re.IGNORECASE)
NO_CLAIM = re.compile(r"no claim|no verdict|what that seed did|answers nothing", re.IGNORECASE)


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, list item, table row or heading of a page, its lines joined."""
    out: list[tuple[int, str]] = []
    joined = False
    for number, line in enumerate(text.splitlines(), 1):
        starts = not line.strip() or re.match(r"\s*(?:[|#>]|[-*] |\d+\. |```)", line)
        if joined and not starts:
            out[-1] = (out[-1][0], out[-1][1] + " " + line.strip())
        elif line.strip():
            out.append((number, line.strip()))
        joined = bool(line.strip()) and not line.lstrip().startswith(("|", "#", "```"))
    return out


def sentences(text: str) -> list[tuple[int, str]]:
    """(line, sentence) of a page: a sentence ends at '. ' before a capital, at '; ', at a table cell or at the end of
    its paragraph."""
    out = []
    for number, paragraph in paragraphs(text):
        for part in re.split(r"(?<=[.;:])\s+(?=[A-Z*`(])|\s\|\s|^\|\s|\s\|$", paragraph):
            if part.strip():
                out.append((number, part))
    return out


def sections(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each part of a page between headings."""
    parts, start, lines = [], 1, text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("#") and number > start:
            parts.append((start, "\n".join(lines[start - 1 : number - 1])))
            start = number
    return parts + [(start, "\n".join(lines[start - 1 :]))]


def claim_offenders(text: str) -> list[str]:
    """(line: why) for every claim larger than its evidence, by the module's three rules."""
    found = []
    for number, sentence in sentences(text):
        if re.search(r"\bmatch(?:es)?\b", sentence) and not EQUIVALENCE.search(sentence):
            found.append(f"{number}: 'match' with no equivalence test: {sentence[:80]}")
        if re.search(r"\btrend\b|per tenfold", sentence) and not THREE_POINTS.search(sentence):
            found.append(f"{number}: a trend without three points named: {sentence[:80]}")
        if re.search(r"\bundecided\b", sentence) and FINDING.search(sentence) and not NO_CLAIM.search(sentence):
            found.append(f"{number}: an undecided effect called a finding: {sentence[:80]}")
        if ONE_SEED.search(sentence) and FINDING.search(sentence) and not NO_CLAIM.search(sentence):
            found.append(f"{number}: one seed called a finding: {sentence[:80]}")
        if re.search(r"whatever the budget|regardless of (?:the )?budget", sentence):
            found.append(f"{number}: a claim for every budget: {sentence[:80]}")
    for start, section in sections(text):
        claim = FINDING.search(section)
        if ONE_SEED.search(section) and claim and not NO_CLAIM.search(section):
            found.append(f"{start}: one seed called a finding ('{claim.group(0)}')")
    return found


# ---------------------------------------------------------------------------------------------- the table and its sections
def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def table_offenders(markdown: str) -> list[str]:
    """(row: number) for every number of answers.md's first table that its row's linked section does not state to the
    row's digits (a section may show more: 0.414 for the row's 0.41)."""
    bodies = {_slug(h): body for h, body in re.findall(r"^### (.+)\n((?:(?!^##).*\n?)*)", markdown, re.MULTILINE)}
    found = []
    for row in re.findall(r"^\| \[[^\]]*\]\(#([\w-]+)\) \|(.*)$", markdown, re.MULTILINE):
        anchor, cells = row
        section = bodies.get(anchor, "")
        said = [m.group(0) for m in re.finditer(NUMBER, section)]
        for m in re.finditer(r"(?<![\w.])[+−-]?\d+\.\d+", cells):
            if not any(agrees(m.group(0).lstrip("+−-"), float(_decimal(s.lstrip("+−-")))) for s in said if "." in s):
                found.append(f"{anchor}: {m.group(0)} is not in its section")
    return found


# ---------------------------------------------------------------------------------------------- trial folders
TRIAL_PATH = re.compile(r"runs/(?P<folder>\w+?)_(?P<preset>cpu\w*|gpu\w*)/(?P<rest>[^\s`'\")]*trial[^\s`'\")]*)")


@functools.cache
def trial_folders(study: str, preset: str) -> tuple[str, ...]:
    """Every trial folder a sweep of the study at the preset makes, relative to its output folder, as the code names
    them (the control's under ``control/``), with each trial number written ``<n>``."""
    from sweeps.run.trials import trial_folder
    from sweeps.spec.study import load_study

    loaded = load_study(f"sweeps/{study}.yaml", preset)
    out = []
    for part in loaded.studies:
        for params in part.points or part.grid():
            folder = part.root / trial_folder(params, 0)
            out.append(re.sub(r"trial_0$", "trial_<n>", folder.as_posix()))
    return tuple(out)


def _as_pattern(path: str) -> str:
    """A page's path with each ``<placeholder>`` as one folder name's characters."""
    return "".join("[^/]+" if p.startswith("<") else re.escape(p) for p in re.split(r"(<[^<>]*>)", path))


def trial_path_offenders(text: str) -> list[str]:
    """(line: path) for every trial path of a page that no folder of its study's layout matches."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in TRIAL_PATH.finditer(line):
            study, preset = m["folder"], m["preset"]
            if not (ROOT / "sweeps" / f"{study}.yaml").exists():
                found.append(f"{number}: {m.group(0)}: no study {study}")
                continue
            pattern = _as_pattern(m.group(0).rstrip(".,:;"))
            folders = trial_folders(study, preset)
            if not any(re.fullmatch(pattern, f.replace("<n>", "0")) for f in folders):
                found.append(f"{number}: {m.group(0)} is no trial folder of {study} (e.g. {folders[0]})")
    return found


def unsourced_numbers(answers: str, results: str) -> list[str]:
    """(line: number) for every number answers.md states to three or more decimals (an effect, a CI end) that no
    number of results.md agrees with: answers quote results, never a number of their own."""
    measured = [m.group(0).lstrip("+−-") for m in re.finditer(NUMBER, results) if "." in m.group(0)]
    found = []
    for m in re.finditer(r"(?<![\w.])[+−-]?\d+\.\d{3,}(?![\d.])", answers):
        stated = m.group(0).lstrip("+−-")
        if not any(agrees(stated, float(_decimal(x))) for x in measured):
            found.append(f"{answers.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    return found
