"""The encoder contract of `stoker data encode --encoder package.module:factory`.

    # mypkg/encoders.py
    import torch
    from torch import nn

    class MyVAE(nn.Module):
        def forward(self, batch):               # batch["video"]: uint8 [B, T, 3, H, W]
            return {"video": self.encode(batch["video"])}   # name -> [B, ...] tensors

    def build(weights: str, channels: int = 8) -> MyVAE:
        return MyVAE.load(weights, channels)    # --args weights=/ckpt/vae.pt channels=8

    build.version = "v3"                        # optional: part of the identity

The factory is imported by name (never pickled) in every process that encodes, and
called once there with `--args` (each value read as YAML: `8` an int, `[1,2]` a
list). What it returns is called on batches: "video" uint8 [B, T, 3, H, W], "audio"
float32 [B, C, N], "text" (a list of B captions), as the decode settings ask, and
"key" (the B sample keys), all B samples of one bucket; it returns a mapping of
names to tensors of B rows, one per sample. An `nn.Module` is moved to the device (a
GPU when there is one) and put in eval mode; it runs under `torch.inference_mode()`.
The latents must not depend on which samples share a batch (eval mode does that): a
re-run may batch differently.

The encoder's identity (`EncoderIdentity`) is its factory path, its arguments, the
SHA-256 of the factory's module source and of every argument that names an existing
file (its weights: pass them as an argument), and the factory's `version` attribute
(bump it when code outside that module changes the latents). It is taken without
calling the factory, so a login node loads no weights: two encodes with equal
identities may share a folder; with another identity they are refused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from stoker.data.format.latent_format import EncoderIdentity
from stoker.errors import StokerError
from stoker.import_path import import_callable

Encoder = Callable[[dict[str, Any]], Mapping[str, Any]]


def parse_encoder_args(pairs: Sequence[str]) -> dict[str, str]:
    """`["channels=8", "name=x"]` -> {"channels": "8", "name": "x"}, in order; a
    StokerError naming a pair that is not KEY=VALUE or a key given twice."""
    args: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise StokerError(
                f"--args {pair!r} is not NAME=VALUE with NAME a Python identifier",
                fix="pass the factory's keyword arguments as --args channels=8 --args size=tiny",
            )
        if key in args:
            raise StokerError(f"--args {key} is given twice", fix="give each argument once")
        args[key] = value
    return args


def _values(args: Mapping[str, str]) -> dict[str, Any]:
    """The arguments as the factory gets them: each value read as YAML."""
    out = {}
    for key, text in args.items():
        try:
            out[key] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            out[key] = text  # not YAML: the plain string
    return out


@dataclass(frozen=True)
class LoadedEncoder:
    encoder: Encoder
    identity: EncoderIdentity
    device: str
    """Where the encoder runs and batches go: "cuda" or "cpu"."""


def identify_encoder(factory_path: str, args: Mapping[str, str]) -> tuple[Any, EncoderIdentity]:
    """Import the factory (without calling it: the login node builds nothing) and take
    the encoder's identity. A StokerError names the --encoder value when it does not
    import or is not callable."""
    factory = import_callable(
        factory_path,
        key="--encoder",
        noun="functions",
        kind="a factory",
        kind_fix="name the function that builds the encoder",
    )
    return factory, encoder_identity(factory_path, args, factory)


def load_encoder(
    factory_path: str, args: Mapping[str, str], *, device: str | None = None
) -> LoadedEncoder:
    """Build the encoder where it runs: the factory called with `args`, an `nn.Module`
    moved to `device` (default: a GPU when there is one) in eval mode."""
    import torch

    factory, identity = identify_encoder(factory_path, args)
    try:
        encoder = factory(**_values(args))
    except Exception as exc:
        raise StokerError(
            f"--encoder {factory_path} with --args {dict(args)} raised {type(exc).__name__}: {exc}",
            fix="fix the factory or its arguments (--args NAME=VALUE, one per keyword)",
        ) from exc
    if not callable(encoder):
        raise StokerError(
            f"--encoder {factory_path} returned a {type(encoder).__name__}, which cannot be "
            "called on a batch",
            fix="return an nn.Module (or a function) that maps a batch to a dict of tensors",
        )
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(encoder, torch.nn.Module):
        encoder = encoder.to(device).eval()
    return LoadedEncoder(encoder, identity, device)


def encoder_identity(factory_path: str, args: Mapping[str, str], factory: Any) -> EncoderIdentity:
    """The identity of the encoder `factory` builds with `args`: the factory's path,
    the arguments, the SHA-256 of the factory's module source, of each argument that
    names an existing file (the weights), and the factory's `version` attribute."""
    code = hashlib.sha256()
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    path = inspect.getsourcefile(module) if module is not None else None
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            code.update(f.read())
    weights = {
        f"args.{key}": _file_sha256(value, f"--args {key}")
        for key, value in args.items()
        if value and os.path.isfile(value)
    }
    fields = {
        "factory": factory_path,
        "args": dict(args),
        "code_sha256": code.hexdigest(),
        "weights_sha256": weights,
        "version": str(getattr(factory, "version", "") or ""),
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return EncoderIdentity(**fields, digest=digest)


def _file_sha256(path: str, what: str) -> str:
    import fsspec

    digest = hashlib.sha256()
    try:
        with fsspec.open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise StokerError(
            f"{what} {path!r} does not read: {exc}",
            fix="point it at the encoder's weights file, readable from here",
        ) from exc
    return digest.hexdigest()
