"""YAML read within bounds (foundation/configfile.py): aliases, however they nest or repeat, are measured before
anything is built from them, so a few hundred kilobytes that describe gigabytes are one line at once; ordinary
anchors and merges still load."""

from __future__ import annotations

import contextlib
import re
import signal

import pytest
import yaml

from foundation.configfile import MAX_TEXT, MAX_VALUES, expanded_size, safe_yaml
from foundation.errors import ConfigError

LONG = "x" * 400_000


@contextlib.contextmanager
def no_hang(seconds: int = 30):
    """Fail instead of waiting when the body does not return: the expansions below would run for hours."""

    def stop(*_):
        raise TimeoutError(f"no answer in {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def aliases(n: int, value: str = LONG) -> str:
    """A list of ``n`` aliases of one anchored string (the issue's case: 99,000 of 400 kB, 40 GB once expanded)."""
    return f"anchor: &a {value}\nlist: [{', '.join(['*a'] * n)}]\n"


def aliases_of_aliases(value: str = LONG, levels: int = 4, fan: int = 10) -> str:
    """Each level a list of ``fan`` aliases of the level below: ``fan ** levels`` copies of ``value``."""
    lines = [f"l0: &l0 {value}"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def mapping_aliases(value: str = LONG, n: int = 50) -> str:
    """The long string as a mapping's value, the mapping aliased under many keys and merged into another."""
    return (
        f"base: &base {{text: {value}}}\n"
        + "".join(f"k{i}: *base\n" for i in range(n))
        + "merged: {<<: *base, other: 1}\n"
    )


@pytest.mark.parametrize(
    "text, limit",
    [
        pytest.param(aliases(99_000), "characters", id="99,000 aliases of a 400 kB string"),
        pytest.param(aliases(6), "characters", id="6 aliases of a 400 kB string"),
        pytest.param(aliases_of_aliases(), "characters", id="aliases of aliases of a long string"),
        pytest.param(aliases_of_aliases("x", levels=6), "values", id="aliases of aliases of a short string"),
        pytest.param(mapping_aliases(), "characters", id="a mapping holding it, aliased and merged"),
        pytest.param(aliases(20_000, "x"), "values", id="20,000 aliases of a short string"),
        pytest.param(
            f"a: &a {'k' * 300_000}\nb: {{*a : 1}}\nc: [*a, *a, *a, *a, *a, *a, *a]\n",
            "characters",
            id="a long key aliased",
        ),
    ],
)
def test_yaml_aliases_past_the_bounds_are_refused_in_one_line_without_being_expanded(text, limit):
    with no_hang(), pytest.raises(ConfigError) as refused:
        safe_yaml(text, "config file x.yaml")
    message = str(refused.value)
    assert message.startswith("config file x.yaml: expands to more than ") and limit in message
    assert "\n" not in message


def test_a_recursive_alias_is_refused_not_followed():
    with no_hang(), pytest.raises(ConfigError, match="expands to more than"):
        safe_yaml("a: &a [1, *a]\n", "x")


def test_an_anchor_given_twice_is_malformed_yaml_naming_both_lines():
    with pytest.raises(ConfigError, match=r"x: malformed YAML at line 2 \(found duplicate anchor.* at line 1"):
        safe_yaml("a: &a [1]\nb: &a [2]\nc: *a\n", "x")


@pytest.mark.parametrize(
    "text", ["a: " + "1" * 5000, "a: 2001-02-30"], ids=["an int of 5,000 digits", "a date that does not exist"]
)
def test_a_value_yaml_cannot_construct_is_one_line(text):
    with pytest.raises(ConfigError, match="x: a value YAML cannot read"):
        safe_yaml(text, "x")


def test_ordinary_anchors_aliases_and_merges_load_as_yaml_says():
    text = (
        "defaults: &d {lr: 0.001, warmup: 10}\n"
        "long: &long " + "y" * 100_000 + "\n"
        "a: {<<: *d, lr: 0.01}\n"
        "b: *d\n"
        "names: [*long, *long]\n"
    )
    loaded = safe_yaml(text, "x")
    assert loaded == yaml.safe_load(text)
    assert loaded["a"] == {"lr": 0.01, "warmup": 10} and loaded["b"] == {"lr": 0.001, "warmup": 10}


def test_the_measure_counts_every_alias_as_its_expansion():
    """Three copies of a mapping of two strings: 1 + 3 · (1 + 2) values; each copy's keys and values counted."""
    shared = {"ab": "cde", "f": "g"}
    assert expanded_size([shared, shared, shared]) == (10, 3 * 7)
    assert expanded_size([LONG] * 100)[1] == MAX_TEXT + 1  # counting stopped at the bound
    assert expanded_size(list(range(MAX_VALUES * 2)))[0] == MAX_VALUES + 1


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda path: path.mkdir(), "a folder, not a file"),
        (
            lambda path: path.write_bytes(b"model:\n  d_model: 32\nexperiment: caf\xe9\n"),
            "line 3 is not UTF-8 text (byte 0xe9)",
        ),
    ],
    ids=["a folder", "Latin-1"],
)
def test_a_config_file_that_is_a_folder_or_not_utf8_is_one_line_naming_it(tmp_path, build, words):
    from foundation.configfile import read_yaml

    build(tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match=f"^config file {tmp_path / 'x.yaml'}: {re.escape(words)}$"):
        read_yaml(tmp_path / "x.yaml")
