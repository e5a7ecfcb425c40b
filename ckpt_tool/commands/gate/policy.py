"""The gate's policy: a TOML file a team commits next to its CI config; options override it.

```toml
[gate]
target = "mypkg.models:Net"            # or "path/to/models.py:Net" (relative to this file)
target_kwargs = { hidden = 16 }
key = "state_dict"
strict = true
nan_check = true
require_target_dtype = false           # true: a dtype that differs from the target's fails (default: a warning)
ignore_target_dtype = false            # true: such dtypes are not judged, even with strict (not with require_...)
skip = ["sha256"]                      # checks not run (not loads-safely); earlier names (no_nan_inf) work too
allowed_float_dtypes = ["float16", "bfloat16", "float32"]
max_file_size = "2 GiB"
required_metadata = ["epoch", "args.lr"]
weights_only_check = true              # fail when the deployment's torch.load would refuse the file
weights_only_allow = ["argparse.Namespace"]  # globals the loading code allowlists (safe_globals)
weights_only_torch = "2.6"             # the deployment's torch (default: the installed one)

[gate.sha256]
"model.safetensors" = "9f86d08..."
```
The keys may also sit at the top level, without ``[gate]``. Unknown keys
are an error, so a typo never silently turns a check off.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ... import dtypes
from ...errors import UsageError
from .names import UNSKIPPABLE, CheckName

DEFAULT_MAX_METADATA_BYTES = 1 << 20

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


@dataclass(frozen=True)
class Policy:
    """What the gate checks. ``None`` means "not configured": the check is skipped."""

    target: str | None = None
    target_kwargs: Mapping[str, Any] | None = None
    key: str | None = None
    strict: bool = False
    nan_check: bool = True
    allowed_float_dtypes: tuple[str, ...] | None = None  # floating tensors only (int buffers are fine)
    allowed_dtypes: tuple[str, ...] | None = None  # every tensor
    # A dtype that differs from the target's: a warning (load_state_dict casts), a failure with
    # require_target_dtype (or --strict, which fails on warnings), not judged at all with ignore_target_dtype.
    ignore_target_dtype: bool = False
    require_target_dtype: bool = False
    max_file_size: int | None = None
    required_metadata: tuple[str, ...] = ()
    sha256: str | None = None  # the pin for a single PATH
    sha256_files: Mapping[str, str] = field(default_factory=dict)  # file name or path -> pin
    max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES
    weights_only_check: bool = True
    weights_only_allow: tuple[str, ...] = ()  # "module.name" globals the deployment's loader allowlists
    weights_only_torch: str | None = None  # the deployment's torch version (None: installed, else newest)
    skip: tuple[CheckName, ...] = ()  # checks not run (--skip, policy skip); never loads-safely or readable
    source: str | None = None  # the policy file, for messages

    def with_overrides(self, **options: Any) -> Policy:
        """Options given on the command line win; ``None`` means "not given"."""
        given = {k: v for k, v in options.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(self)}
        if unknown:
            raise UsageError(f"unknown policy option(s): {', '.join(sorted(unknown))}")
        return _consistent(replace(self, **_normalise(given, "", _OPTION_NAMES)), "options")

    def pin_for(self, path: str) -> str | None:
        """The sha256 pinned for ``path``: by the path as given, its absolute path, or its file name."""
        for candidate in (path, os.path.abspath(path), os.path.basename(path.rstrip("/\\"))):
            if candidate in self.sha256_files:
                return self.sha256_files[candidate]
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "target": self.target, "target_kwargs": dict(self.target_kwargs or {}),
            "key": self.key, "strict": self.strict, "nan_check": self.nan_check,
            "allowed_float_dtypes": list(self.allowed_float_dtypes) if self.allowed_float_dtypes else None,
            "allowed_dtypes": list(self.allowed_dtypes) if self.allowed_dtypes else None,
            "ignore_target_dtype": self.ignore_target_dtype, "require_target_dtype": self.require_target_dtype,
            "skip": [str(c) for c in self.skip], "max_file_size": self.max_file_size,
            "required_metadata": list(self.required_metadata), "sha256": self.sha256,
            "sha256_files": dict(self.sha256_files), "max_metadata_bytes": self.max_metadata_bytes,
            "weights_only_check": self.weights_only_check, "weights_only_allow": list(self.weights_only_allow),
            "weights_only_torch": self.weights_only_torch,
        }


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read a policy TOML file; every mistake is a UsageError naming the file and key."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]

    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError("policy file not found", p) from None
    except OSError as exc:
        raise UsageError(f"cannot read policy file: {exc.strerror}", p) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"policy file is not valid TOML: {exc}", p) from None
    table = raw.get("gate", raw) if isinstance(raw.get("gate"), dict) else raw
    extra = set(raw) - {"gate"} if table is not raw else set()
    if extra:
        raise UsageError(f"policy keys outside [gate]: {', '.join(sorted(extra))}", p)
    values = dict(table)
    pins = values.pop("sha256", None)
    if isinstance(pins, dict):
        values["sha256_files"] = _pins(pins, p)
    elif pins is not None:
        values["sha256"] = pins
    known = {f.name for f in fields(Policy)} - {"source", "sha256_files"}
    unknown = set(values) - known - {"sha256_files"}
    if unknown:
        raise UsageError(f"unknown policy key(s) {', '.join(sorted(repr(k) for k in unknown))}; "
                         f"known: {', '.join(sorted(known))}", p)
    values = _normalise(values, f"policy {p}")
    target = values.get("target")
    if isinstance(target, str):
        values["target"] = _relative_to(target, os.path.dirname(os.path.abspath(p)))
    return _consistent(Policy(source=p, **values), f"policy {p}")


def _consistent(pol: Policy, origin: str) -> Policy:
    """Settings that contradict each other are refused, not resolved by a rule nobody remembers."""
    if pol.require_target_dtype and pol.ignore_target_dtype:
        raise UsageError(f"{origin}: require_target_dtype (--require-dtype) and ignore_target_dtype contradict each "
                         "other: keep one (ignore_target_dtype accepts any dtype, require_target_dtype none but "
                         "the target's)")
    return pol


def _pins(pins: Mapping[str, Any], path: str) -> dict[str, str]:
    base = os.path.dirname(os.path.abspath(path))
    out = {}
    for name, value in pins.items():
        digest = _sha(value, f"policy {path}: sha256 for {name!r}")
        out[name] = digest
        if not os.path.isabs(name):
            out[os.path.join(base, name)] = digest  # a path relative to the policy file
    return out


def _relative_to(spec: str, base: str) -> str:
    """A file spec in a policy is relative to the policy's folder when that file exists."""
    where, sep, name = spec.rpartition(":")
    if sep and where.endswith(".py") and not os.path.isabs(where):
        candidate = os.path.join(base, where)
        if os.path.isfile(candidate) and not os.path.isfile(where):
            return f"{candidate}:{name}"
    return spec


_OPTION_NAMES = {"allowed_float_dtypes": "--allow-dtype", "max_file_size": "--max-size",
                 "required_metadata": "--require-metadata", "sha256": "--sha256", "target": "--target",
                 "key": "--key", "target_kwargs": "--target-kwargs", "strict": "--strict",
                 "nan_check": "--nan-check", "weights_only_check": "--weights-only-check",
                 "weights_only_allow": "--allow-global", "weights_only_torch": "--torch-version",
                 "require_target_dtype": "--require-dtype", "skip": "--skip"}


def _normalise(values: dict[str, Any], origin: str, names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Validate and canonicalise policy values; messages name the option or the policy key."""

    def label(name: str) -> str:
        return names.get(name, name) if names is not None else f"{origin}: {name}"

    out = dict(values)
    for name, convert in _CONVERTERS:  # in this order: the first bad value is the one reported
        if name in out:
            out[name] = convert(out[name], label(name))
    return out


def _string(value: Any, origin: str) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{origin} must be a string")
    return value


def _flag(value: Any, origin: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{origin} must be true or false")
    return value


def _table(value: Any, origin: str) -> Any:
    if not isinstance(value, Mapping):
        raise UsageError(f"{origin} must be a table of keyword arguments")
    return value


def _key_names(value: Any, origin: str) -> tuple[str, ...]:
    keys = [value] if isinstance(value, str) else value
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) and k for k in keys):
        raise UsageError(f"{origin} must be a list of key names")
    return tuple(keys)


def _pin(value: Any, origin: str) -> str | None:
    return None if value is None else _sha(value, origin)


def _global_names(value: Any, origin: str) -> tuple[str, ...]:
    """"module.name" strings, as torch names the globals it refuses (``argparse.Namespace``)."""
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", v) for v in value):
        raise UsageError(f"{origin} must be a list of globals written module.name (e.g. \"argparse.Namespace\")")
    return tuple(dict.fromkeys(value))


def _check_names(value: Any, origin: str) -> tuple[CheckName, ...]:
    """Gate check names, today's (``no-nan-inf``) or earlier releases' (``no_nan_inf``); never a safety check."""
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{origin} must be a list of gate check names (e.g. [\"sha256\", \"no-nan-inf\"])")
    names = tuple(dict.fromkeys(CheckName.parse(v, origin) for v in value))
    refused = [str(n) for n in names if n in UNSKIPPABLE]
    if refused:
        raise UsageError(f"{origin}: {', '.join(refused)} cannot be skipped: a file nobody has scanned or read is "
                         "never passed")
    return names


def _torch_version(value: Any, origin: str) -> str:
    from ...pickles.torch_rules import rules_for

    try:
        if not isinstance(value, str):
            raise ValueError(value)
        rules_for(value)
    except ValueError:
        raise UsageError(f"{origin}: {value!r} is not a torch version written as a string, such as \"2.6\"") from None
    return value


def _dtype_list(value: Any, origin: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, (list, tuple)) or not value:
        raise UsageError(f"{origin} must be a non-empty list of dtype names")
    out = []
    for v in value:
        if not isinstance(v, str) or not dtypes.is_known(v):
            raise UsageError(f"{origin}: unknown dtype {v!r} (known: {', '.join(dtypes.BY_NAME)})")
        out.append(dtypes.lookup(v).name)
    return tuple(dict.fromkeys(out))


def _sha(value: Any, origin: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"(sha256:)?[0-9a-fA-F]{64}", value.strip()):
        raise UsageError(f"{origin} must be 64 hexadecimal digits")
    return value.strip().lower().removeprefix("sha256:")


def parse_size(value: Any, origin: str = "size") -> int:
    """``2 GiB``, ``500MB``, ``1e9`` or a number of bytes."""
    if isinstance(value, bool):
        raise UsageError(f"{origin} must be a size like '2 GiB' or a number of bytes")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise UsageError(f"{origin}: {value!r} is not a size like '2 GiB', '500MB' or a number of bytes")
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise UsageError(f"{origin} must be a size like '2 GiB' or a number of bytes")
    size = int(number * _UNITS[unit])
    if size < 0:
        raise UsageError(f"{origin} must not be negative")
    return size


# policy key -> its check and canonical form, in the order _normalise applies them
_CONVERTERS: tuple[tuple[str, Callable[[Any, str], Any]], ...] = (
    ("target", _string), ("key", _string),
    ("strict", _flag), ("nan_check", _flag), ("ignore_target_dtype", _flag), ("require_target_dtype", _flag),
    ("weights_only_check", _flag),
    ("target_kwargs", _table),
    ("allowed_float_dtypes", _dtype_list), ("allowed_dtypes", _dtype_list),
    ("required_metadata", _key_names),
    ("max_file_size", parse_size), ("max_metadata_bytes", parse_size),
    ("skip", _check_names),
    ("weights_only_allow", _global_names),
    ("weights_only_torch", _torch_version),
    ("sha256", _pin),
)
