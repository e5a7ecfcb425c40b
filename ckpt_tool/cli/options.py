"""Options shared by several commands, declared once.

The options that say how a source is read (--key, --unsafe, --tp-rules,
--unstack-layers, --torch-version, --download, --max-*) are each declared
once here; a command puts the ones it offers where its help lists them, and
``source_options`` hands it all of them as ONE frozen ``SourceOptions``
(formats/options.py), --tp-rules parsed once, before anything is read.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from ..formats import SourceOptions
    from ..limits import Limits

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON document on stdout.")
key_option = click.option("--key", default=None, metavar="DOTTED.PATH",
                          help="Where the state_dict is inside the container (e.g. state_dict, model.ema).")
unsafe_option = click.option("--unsafe", is_flag=True,
                             help="Trust the file: unpickle it fully (runs code from the file!).")
quiet_option = click.option("-q", "--quiet", is_flag=True, help="Print less; no progress bars.")
tp_rules_option = click.option(
    "--tp-rules", "tp_rules", default=None, metavar="FILE",
    help="A TOML file naming the split dimension per key pattern, to merge tensor-parallel shards "
         "(a DeepSpeed run without universal_checkpoint_info, Megatron-LM mp_rank_XX); see docs/consolidate.md.")


def _torch_version(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        from ..pickles.torch_rules import rules_for

        try:
            rules_for(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a torch version such as 2.6 or 2.13.0") from None
    return value


unstack_layers_option = click.option(
    "--unstack-layers", is_flag=True,
    help="A Megatron-core torch_dist checkpoint's layers (and MoE experts), saved stacked on a leading axis, "
         "under Megatron's per-layer names (decoder.layers.0.mlp.linear_fc1.weight), as a model's "
         "state_dict holds them. Default: off (the keys and shapes as saved).")

torch_version_option = click.option(
    "--torch-version", default=None, metavar="VERSION", callback=_torch_version,
    help="Predict torch.load(weights_only=True) with this torch's rules (default: the installed torch, "
         "else the newest known), e.g. the version a deployment runs.")


def limit_options(f: F) -> F:
    """--max-* options that raise the reader's safety limits (docs/reliability.md)."""
    from ..limits import DEFAULT_LIMITS

    size = click.IntRange(min=1)
    opts = [
        click.option("--max-header-bytes", type=size, default=DEFAULT_LIMITS.max_header_bytes, show_default=True,
                     help="Largest safetensors header (or shard index) accepted."),
        click.option("--max-pickle-bytes", type=size, default=DEFAULT_LIMITS.max_pickle_bytes, show_default=True,
                     help="Largest pickle accepted."),
        click.option("--max-tensors", type=size, default=DEFAULT_LIMITS.max_tensors, show_default=True,
                     help="Most tensors accepted in one file."),
        click.option("--max-key-length", type=size, default=DEFAULT_LIMITS.max_key_length, show_default=True,
                     help="Longest tensor key accepted (characters)."),
        click.option("--max-member-bytes", type=size, default=DEFAULT_LIMITS.max_member_bytes, show_default=True,
                     help="Largest size a compressed zip member may inflate to."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def limits_from(kwargs: dict[str, Any]) -> Limits:
    """The Limits the --max-* options (limit_options) ask for; they are popped from a command's kwargs."""
    from dataclasses import replace

    from ..limits import DEFAULT_LIMITS

    return replace(
        DEFAULT_LIMITS,
        max_header_bytes=kwargs.pop("max_header_bytes", DEFAULT_LIMITS.max_header_bytes),
        max_pickle_bytes=kwargs.pop("max_pickle_bytes", DEFAULT_LIMITS.max_pickle_bytes),
        max_tensors=kwargs.pop("max_tensors", DEFAULT_LIMITS.max_tensors),
        max_key_length=kwargs.pop("max_key_length", DEFAULT_LIMITS.max_key_length),
        max_member_bytes=kwargs.pop("max_member_bytes", DEFAULT_LIMITS.max_member_bytes),
    )


# the click parameters (of the options above and remote_io.download_option) that SourceOptions holds
_SOURCE_PARAMS = ("key", "unsafe", "tp_rules", "unstack_layers", "torch_version", "download")


def source_options(command: Callable[..., int]) -> Callable[..., int]:
    """Hand a click command function ONE ``source: SourceOptions`` instead of the reading options it declares.

    Put it right above the ``def``; the options themselves stay where the
    command lists them (its --help is unchanged). Only the options the command
    declares are read, the others keep SourceOptions' defaults. A bad
    --tp-rules file is exit 2 here, before any input is opened.
    """

    @functools.wraps(command)
    def with_source(**kwargs: Any) -> int:
        source = source_from(kwargs)
        return command(source=source, **kwargs)

    return with_source


def source_from(kwargs: dict[str, Any]) -> SourceOptions:
    """The SourceOptions of a command's parsed parameters; the ones it holds are popped from ``kwargs``."""
    from ..commands import build_source

    given = {name: kwargs.pop(name) for name in _SOURCE_PARAMS if name in kwargs}
    return build_source({**given, "limits": limits_from(kwargs)})


def target_options(purpose: str) -> Callable[[F], F]:
    """--target SPEC and --target-kwargs JSON, declared once; ``purpose`` opens --target's help
    ("Compare with a module instead of B")."""
    target = click.option(
        "--target", default=None, metavar="SPEC",
        help=f"{purpose}: 'package.module:Name' or 'path/to/file.py:Name' (an nn.Module class, a factory "
             "function such as transformers:AutoModel.from_config, or an instance), built on the meta device "
             "where it can be.")
    kwargs = click.option(
        "--target-kwargs", default=None, metavar="JSON",
        help="Keyword arguments for the target's constructor, as a JSON object (or @file.json); an object with "
             "a \"()\" key is built by the callable it names with its other entries, e.g. "
             "'{\"config\": {\"()\": \"transformers:BertConfig\", \"hidden_size\": 64}}'.")

    def decorate(f: F) -> F:
        return target(kwargs(f))

    return decorate


def target_kwargs_from(text: str | None) -> dict[str, Any] | None:
    """``--target-kwargs`` parsed; None when not given (target.py, a big import, only then)."""
    if text is None:
        return None
    from ..tensors.target import parse_target_kwargs

    return parse_target_kwargs(text)


def target_kwargs_for(target: str | None, text: str | None) -> dict[str, Any] | None:
    """target_kwargs_from, refusing --target-kwargs without --target (diff, migrate: no policy gives one)."""
    kw = target_kwargs_from(text)
    if kw and target is None:
        from ..errors import UsageError

        raise UsageError("--target-kwargs needs --target")
    return kw


sarif_option = click.option(
    "--sarif", "sarif_file", type=click.Path(), default=None, metavar="FILE",
    help="Also write a SARIF 2.1.0 report, the format code-scanning services (e.g. GitHub) read.")


def key_rule_options(f: F) -> F:
    """--strip-prefix, --add-prefix and --rename: migrate's key rules, which diff applies to A before comparing."""
    opts = [
        click.option("--strip-prefix", multiple=True, metavar="P",
                     help="Remove P from keys that start with it (repeatable)."),
        click.option("--add-prefix", default=None, metavar="P", help="Prepend P to every key."),
        click.option("--rename", multiple=True, metavar="'REGEX=REPLACEMENT'",
                     help="Rename keys matching REGEX (whole key, Python re; \\1 for groups). Repeatable, in order."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f
