"""Values no config may hold, whatever its source: secrets (stoker/redact.py) and text
that no environment variable, argument or script line can carry (NUL, invalid UTF-8).

`resolve_config` drops such a value before validation, since pydantic's errors quote
what they reject, and reports it without the value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stoker.config.keys import KeyPath, field_at, is_free_mapping
from stoker.config.schema import ExperimentConfig
from stoker.redact import has_url_password, hide_url_passwords, secret_assignments, secret_word


def unsafe_reason(path: KeyPath, value: Any) -> str | None:
    """Why the value at `path` may not be in a config (worded without the value), or None."""
    copied = "would be copied into the frozen config, the job script, MLflow and the console"
    word = secret_word(path[-1])
    if len(path) > 1 and word and is_free_mapping(field_at(ExperimentConfig, path[:-1])):
        why = "an AWS_* variable" if word == "AWS_" else f"{word} in its name"
        if path[:-1] != ("job", "env"):
            return f"holds a secret ({why}), whose value {copied}: leave it out"
        return (
            f"holds a secret ({why}), whose value {copied}: remove it, export {path[-1]} "
            f"in the shell you submit from and list it in job.pass_env: [{path[-1]}]"
        )
    for text in _strings_in(value):
        if "\x00" in text:
            return "contains a NUL character, which no variable, argument or script line can hold"
        if not _is_utf8(text):
            return "is not UTF-8 text (bytes of another encoding, or a \\uD800-\\uDFFF escape)"
        if has_url_password(text):
            return (
                f"holds a password in a URL ({hide_url_passwords(text)!r}), which {copied}: "
                "drop it from the URL and give the credentials in variables listed in "
                "job.pass_env (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, AWS_*)"
            )
    if path == ("job", "setup"):
        lines = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for number, line in enumerate(lines, 1):
            names = secret_assignments(line) if isinstance(line, str) else []
            if names:
                return (
                    f"line {number} sets the secret {names[0]} to a value, which {copied}: "
                    f"export {names[0]} in the shell you submit from and list it in "
                    f"job.pass_env: [{names[0]}] instead"
                )
    return None


def _strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings_in(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings_in(item)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
