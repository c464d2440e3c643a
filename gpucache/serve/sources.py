"""Where ``gpucache serve``'s settings come from, each layer over the one before:

    1. the defaults          ``ServeSettings`` and its sections (the server's cache defaults)
    2. a settings file       ``--config gpucache.toml`` (or ``GPUCACHE_CONFIG``): top-level keys,
                             and the tables ``[cache]``, ``[embedder]``, ``[replication]``,
                             ``[guard]`` (``gpucache calibrate`` writes ``[cache]`` and ``[guard]``)
    3. the environment       ``GPUCACHE_<NAME>`` (``GPUCACHE_THRESHOLD=0.9``)
    4. the command line      ``--<name>`` (``--threshold 0.9``)

Every layer is generated from the dataclasses' fields, so a setting has one name everywhere:
the field ``lookup_timeout_seconds`` of ``[cache]`` is the flag ``--lookup-timeout-seconds``
and the variable ``GPUCACHE_LOOKUP_TIMEOUT_SECONDS``. A name a layer does not know (a key in
the file, a ``GPUCACHE_*`` variable) is refused with the known ones listed: a misspelt setting
silently left at its default is the failure this prevents.

``Resolved`` keeps where each value came from, which ``gpucache info --config`` prints.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucache.cache.settings import read_toml
from gpucache.fields import without_password
from gpucache.serve.settings import ConfigError, ServeSettings

ENV_PREFIX = "GPUCACHE_"
CONFIG_ENV = "GPUCACHE_CONFIG"
# GPUCACHE_* variables that are not server settings (they are read elsewhere)
OTHER_ENV = frozenset({CONFIG_ENV, "GPUCACHE_MODEL_DIR"})
SECTIONS = ("cache", "embedder", "replication", "guard")


@dataclass(frozen=True)
class Option:
    """One setting of the tree: ``section`` None for the top level."""

    section: str | None
    name: str
    kind: str  # the field's annotation: "int", "float | None", "tuple[str, ...]"
    doc: str
    default: Any  # dataclasses.MISSING where the setting has none (upstream)
    flag: bool = True
    secret: bool = False

    @property
    def key(self) -> str:
        return self.name if self.section is None else f"{self.section}.{self.name}"

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def dest(self) -> str:
        return "setting__" + self.key.replace(".", "__")


def options() -> list[Option]:
    """Every setting of ``ServeSettings``, sections included, in the dataclasses' order."""
    found: list[Option] = []
    for f in dataclasses.fields(ServeSettings):
        if f.metadata.get("section"):
            defaults = section_defaults()[f.name]
            for g in dataclasses.fields(defaults):
                found.append(
                    Option(f.name, g.name, str(g.type), g.metadata.get("doc", ""), getattr(defaults, g.name))
                )
        else:
            found.append(
                Option(
                    None,
                    f.name,
                    str(f.type),
                    f.metadata["doc"],
                    f.default,
                    f.metadata.get("flag", True),
                    f.metadata.get("secret", False),
                )
            )
    names = [o.name for o in found]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:  # a flag and a variable per name: two settings may not share one
        raise RuntimeError(f"gpucache bug: settings named twice: {duplicated}")
    return found


def section_defaults() -> dict[str, Any]:
    """Each section's settings as ``ServeSettings`` makes them by default (the cache's are the
    server's own cache defaults)."""
    return {
        f.name: f.default_factory()  # type: ignore[misc,operator]
        for f in dataclasses.fields(ServeSettings)
        if f.metadata.get("section")
    }


def parse_text(option: Option, text: str) -> Any:
    """A value given as text (a flag, a variable) as the setting's type; "none" is None
    where the setting may be None; a list is comma-separated."""
    options_ = [k.strip() for k in option.kind.split("|")]
    if "None" in options_ and text.strip().lower() == "none":
        return None
    base = options_[0]
    try:
        if base == "bool":
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
        if base == "bytes":
            return text.encode()
        if base.startswith("tuple"):
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return text
    except ValueError:
        raise ConfigError(f"{option.name} must be {option.kind}, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag per setting that has one, its help the field's documentation and the server's
    default. A flag not given leaves the setting to the layers below (``resolve``)."""
    groups: dict[str | None, Any] = {None: parser.add_argument_group("server settings (ServeSettings)")}
    for section in SECTIONS:
        groups[section] = parser.add_argument_group(f"[{section}] settings")
    for option in options():
        if not option.flag:
            continue
        default = "none" if option.default is None else repr(option.default)
        doc = option.doc.replace("`", "").replace("%", "%%")
        shown = f"{doc} (default {default})" if option.default is not dataclasses.MISSING else doc
        group, given = groups[option.section], {"dest": option.dest, "default": argparse.SUPPRESS}
        if option.kind == "bool":
            group.add_argument(option.flag_name, action=argparse.BooleanOptionalAction, help=shown, **given)
        elif option.kind.startswith("tuple"):
            group.add_argument(
                option.flag_name.rstrip("s"),
                action="append",
                metavar="VALUE",
                help=shown + "; repeat for each",
                **given,
            )
        else:
            group.add_argument(option.flag_name, metavar=option.name.upper(), type=str, help=shown, **given)


@dataclass(frozen=True)
class Resolved:
    """The value of every setting given by some layer, and the layer it came from."""

    values: dict[str, Any]  # Option.key -> value
    sources: dict[str, str]  # Option.key -> "default", "file PATH", "env NAME", "flag --name"

    def settings(self) -> ServeSettings:
        """The ``ServeSettings`` of these values; ``ConfigError`` names the bad setting."""
        top: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        for key, value in self.values.items():
            section, _, name = key.rpartition(".")
            (parts[section] if section else top)[name] = value
        if "upstream" not in top:
            raise ConfigError(
                "the upstream is not set: --upstream URL, GPUCACHE_UPSTREAM or "
                "'upstream' in the settings file"
            )
        built: dict[str, Any] = {}
        for section, defaults in section_defaults().items():
            try:
                built[section] = type(defaults)(**parts[section])
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"[{section}]: {exc}") from exc
        return ServeSettings(**top, **built)

    def lines(self) -> list[str]:
        """``name = value  (source)`` per setting, secrets shown only as set or not."""
        out = []
        for option in options():
            if option.key not in self.values:
                out.append(f"{option.key} = (not set)")
                continue
            value = self.values[option.key]
            shown = (
                ("(set)" if value is not None else "none") if option.secret else repr(without_password(value))
            )
            out.append(f"{option.key} = {shown}  ({self.sources[option.key]})")
        return out


def read_file(path: str) -> dict[str, tuple[Any, str]]:
    """The settings in a TOML file, by ``Option.key``; an unknown key or table is refused."""
    try:
        doc = read_toml(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    known = {o.key: o for o in options()}
    found: dict[str, tuple[Any, str]] = {}
    for name, value in doc.items():
        if name in SECTIONS and isinstance(value, dict):
            items = [(f"{name}.{k}", v) for k, v in value.items()]
        else:
            items = [(name, value)]
        for key, v in items:
            option = known.get(key)
            if option is None or option.secret and option.name == "namespace_secret":
                raise ConfigError(
                    f"{path}: unknown setting {key!r}; settings are {', '.join(sorted(known))}"
                    + (
                        " (the tenancy secret goes in secret_file or the environment)"
                        if key == "namespace_secret"
                        else ""
                    )
                )
            found[key] = (tuple(v) if isinstance(v, list) else v, f"file {path}")
    return found


def resolve(
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    config: str | None = None,
) -> Resolved:
    """The settings from every layer: defaults, ``config`` (or the file ``GPUCACHE_CONFIG``
    names), ``environ`` (the process's by default), then ``args`` (parsed flags)."""
    environ = dict(environ) if environ is not None else {}
    every = options()
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    value: Any
    for option in every:
        if option.default is not dataclasses.MISSING:
            values[option.key], sources[option.key] = option.default, "default"
    path = config or environ.get(CONFIG_ENV)
    if path:
        for key, (value, source) in read_file(path).items():
            values[key], sources[key] = value, source
    by_env = {o.env: o for o in every}
    unknown = sorted(
        name
        for name in environ
        if name.startswith(ENV_PREFIX) and name not in by_env and name not in OTHER_ENV
    )
    if unknown:
        raise ConfigError(
            f"unknown setting variable(s) {', '.join(unknown)}; settings are {', '.join(sorted(by_env))}"
        )
    for name, option in by_env.items():
        if name in environ:
            values[option.key], sources[option.key] = parse_text(option, environ[name]), f"env {name}"
    if args is not None:
        for option in every:
            if hasattr(args, option.dest):
                given = getattr(args, option.dest)
                if option.kind.startswith("tuple"):
                    value = tuple(given)
                elif option.kind == "bool":
                    value = bool(given)
                else:
                    value = parse_text(option, given)
                values[option.key], sources[option.key] = value, f"flag {option.flag_name}"
    return Resolved(values, sources)


def _shown(option: Option) -> str:
    if option.default is dataclasses.MISSING:
        return "required"
    if option.secret:
        return "not set" if option.default is None else "(set)"
    value = option.default
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ", ".join(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_reference() -> str:
    """Every setting of ``gpucache serve`` as a Markdown page (docs/settings.md): its flag, its
    variable, its key in a settings file, its default and its doc, from the settings tree
    itself, so the page cannot drift from the code (a test compares them)."""
    lines = [
        "# Settings",
        "",
        "Every setting of `gpucache serve`, generated from the settings tree "
        "(`python3 -m gpucache.serve.sources > docs/settings.md`). Each layer overrides the one "
        "before: the default, a settings file (`--config gpucache.toml`), the environment "
        "(`GPUCACHE_<NAME>`), the command line (`--<name>`). `SemanticCache` takes the `[cache]` "
        "settings as keyword arguments; its own defaults differ where the server's do "
        "(a server batches the lookups that gather behind a running batch and bounds them at 1 s).",
        "",
    ]
    for section in (None, *SECTIONS):
        lines += [
            f"## {'Server' if section is None else f'[{section}]'}",
            "",
            "| setting | flag | variable | default | what it does |",
            "|---|---|---|---|---|",
        ]
        for o in (o for o in options() if o.section == section):
            flag = f"`{o.flag_name}`" if o.flag else "–"
            doc = o.doc.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{o.key}` | {flag} | `{o.env}` | `{_shown(o)}` | {doc} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(settings_reference(), end="")
