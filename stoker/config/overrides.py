"""`a.b=c` command-line overrides, typed as YAML reads them."""

from __future__ import annotations

import re
from typing import Any

import yaml

from stoker.config.keys import KeyPath
from stoker.config.yaml_source import parse_yaml_value
from stoker.errors import StokerError
from stoker.redact import (
    REDACTED,
    hide_url_passwords,
    printable_line,
    secret_assignments,
    secret_word,
)

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")


def parse_override(text: str) -> tuple[KeyPath, Any, str]:
    """`train.steps=10` -> (("train", "steps"), 10, "10"): key, typed value, text as written.

    Values are YAML: `10` an int, `3e-4` a float, `true` a bool, `null` None,
    `[a, b]` a list; `key=` is the empty string. A value YAML cannot read stays a string.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise StokerError(
            f"override {text!r} is not KEY=VALUE",
            fix="write overrides as dotted keys with a value, e.g. train.steps=10 optim.lr=3e-4",
        )
    if not _KEY.fullmatch(key):
        raise StokerError(
            f"override {shown_override(text)!r}: {key!r} is not a dotted key",
            fix="use section.key, e.g. job.nodes=2 (see `stoker config show` for every key)",
        )
    if raw == "":
        return tuple(key.split(".")), "", raw
    try:
        value = parse_yaml_value(raw)
    except yaml.YAMLError:
        value = raw
    return tuple(key.split(".")), value, raw


def shown_override(text: str) -> str:
    """An override as messages and `--explain` show it: a secret's value (job.env.HF_TOKEN=...,
    a URL's password, `export API_KEY=...` in a setup line) is replaced by ***."""
    key, sep, raw = text.partition("=")
    if sep and (secret_word(key.rsplit(".", 1)[-1]) or secret_assignments(raw)):
        text = f"{key}={REDACTED}"
    # On one line: a newline here would split a message or an --explain line.
    return printable_line(hide_url_passwords(text))
