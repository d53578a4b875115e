"""What stoker treats as a secret, and how it keeps one out of what it writes and shows.

A secret is:

- the value of a free-mapping entry (`job.env`, `tracking.tags`) whose name has a word
  such as TOKEN, SECRET, PASSWORD or KEY in it: HF_TOKEN, AWS_SECRET_ACCESS_KEY,
  WANDB_API_KEY, DB_PASSWORD, apiKey (schema keys such as `checkpoint.keep_last` are
  not names a user chooses and never count);
- the value of any AWS_* variable (credentials, and the endpoint and profile that go
  with them);
- the password of a URL, `https://user:PASSWORD@host`.

The config refuses them (stoker/config/unsafe_values.py): a value written there would be copied into
the frozen config, the job script, the MLflow params and the console. `job.pass_env`
hands a variable from the submitting environment to the job by name instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# Whole words of a name (split at '_', '-', '.', digits and camelCase) that mark a secret.
SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "passphrase", "key", "credential", "auth"}
)
# One-word spellings of the same (APIKEY, accessToken is already two words).
_COMPOUNDS = frozenset(
    {"apikey", "accesskey", "secretkey", "privatekey", "authkey", "passkey", "authtoken"}
    | {"accesstoken", "apitoken", "refreshtoken", "sessiontoken", "bearertoken"}
)
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+")
# scheme://user:password@host: the password is group 2.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)([^/\s@]+)(@)")
# A shell assignment, `NAME=value` or `export NAME=value`, at the start of a command.
_ASSIGNMENT = re.compile(r"(?:^|[\s;&|(])([A-Za-z_][A-Za-z0-9_]*)=(\S*)")


def secret_word(name: str) -> str | None:
    """The word that makes `name` a secret's name (`TOKEN` for HF_TOKEN, `AWS_` for
    AWS_REGION), or None: KEEP_LAST, MONKEY and AUTHOR are not secrets' names."""
    if name.upper().startswith("AWS_"):
        return "AWS_"
    for word in map(str, _WORD.findall(name)):
        lower = word.lower()
        if lower in _COMPOUNDS or lower.removesuffix("s") in SECRET_WORDS:
            return word
    return None


def is_secret_name(name: str) -> bool:
    return secret_word(name) is not None


def has_url_password(text: str) -> bool:
    return _URL_PASSWORD.search(text) is not None


def hide_url_passwords(text: str) -> str:
    """`https://me:hunter2@host` -> `https://me:***@host`."""
    return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


def secret_assignments(line: str) -> list[str]:
    """Secrets' names a shell line sets to a literal (`export HF_TOKEN=hf_...`);
    a reference such as `HF_TOKEN=$(cat ~/.hf_token)` or `"$OTHER"` is not one."""
    return [
        name
        for name, value in _ASSIGNMENT.findall(line)
        if is_secret_name(name) and value.lstrip("\"'") and not value.lstrip("\"'").startswith("$")
    ]


def redact_mapping(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with the value of every secret's name replaced by REDACTED."""
    return {k: (REDACTED if is_secret_name(str(k)) else v) for k, v in mapping.items()}


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def printable_line(text: str) -> str:
    """`text` on one printable line, for a message, a comment or `--explain`: control
    characters as escapes (`\\n`), bytes that are not UTF-8 as `\\udcff`."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
